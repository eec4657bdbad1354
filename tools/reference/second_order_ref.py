#!/usr/bin/env python3
"""PyTorch's numbers for the second-order examples (issue 45), from the dumps they write:

    /usr/bin/python3 tools/reference/second_order_ref.py DUMP.safetensors

  gradient_penalty (examples/gradient_penalty.cpp): a WGAN-GP critic loss with the penalty
    (|d critic / d x| - 1)^2 at the interpolates; the loss and every parameter gradient.
  maml_sine (examples/maml_sine.cpp): MAML's first meta-gradient, one inner SGD step with
    create_graph over four sine tasks; the meta-loss and the gradient of every parameter.
  functional (tests/functional_dump.cpp): autograd::functional's vjp, jvp, jacobian, hessian, hvp
    and vhp of two small functions against torch.autograd.functional's.
All run in float64; a relative error above 1e-9 (of each tensor's largest magnitude) fails.
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_file import load_safetensors  # noqa: E402

TOL = 1e-9


def rel_err(a, b):
    return (a.double() - b.double()).abs().max().item() / max(b.abs().max().item(), 1e-300)


def gradient_penalty(t, meta):
    params = {k: t[k].clone().requires_grad_() for k in t if k.startswith("fc")}

    def critic(x):
        h = torch.tanh(F.linear(x, params["fc1.weight"], params["fc1.bias"]))
        h = torch.tanh(F.linear(h, params["fc2.weight"], params["fc2.bias"]))
        return F.linear(h, params["fc3.weight"], params["fc3.bias"])

    real, fake, eps = t["batch.real"], t["batch.fake"], t["batch.eps"]
    between = (eps * real + (1 - eps) * fake).requires_grad_()
    (grad_x,) = torch.autograd.grad(critic(between).sum(), between, create_graph=True)
    norm = grad_x.pow(2).sum(1).sqrt()
    loss = critic(fake).mean() - critic(real).mean() + float(meta["lambda"]) * (norm - 1).pow(2).mean()
    loss.backward()
    return loss, {k: p.grad for k, p in params.items()}


def maml_sine(t, meta):
    names = ["w1", "b1", "w2", "b2", "w3", "b3"]
    w = [t["param." + n].clone().requires_grad_() for n in names]
    inner_lr = float(meta["inner_lr"])

    def net(x, p):
        h = F.relu(F.linear(x, p[0], p[1]))
        h = F.relu(F.linear(h, p[2], p[3]))
        return F.linear(h, p[4], p[5])

    total = 0
    tasks = int(meta["tasks"])
    for i in range(tasks):
        k = f"task{i}."
        inner = F.mse_loss(net(t[k + "xs"], w), t[k + "ys"])
        g = torch.autograd.grad(inner, w, create_graph=True)
        adapted = [p - inner_lr * gi for p, gi in zip(w, g)]
        total = total + F.mse_loss(net(t[k + "xq"], adapted), t[k + "yq"])
    loss = total / tasks
    loss.backward()
    return loss, {n: p.grad for n, p in zip(names, w)}


def functional(t, meta):
    """(loss, tensors): the dump's own names, recomputed with torch.autograd.functional."""
    import torch.autograd.functional as AF

    def scalar(x, y):
        return (torch.tanh(x @ y) * F.softplus(x)[:, 0]).sum() + y.pow(3).sum()

    def vector(x, y):
        return torch.sigmoid(x @ y) * torch.exp(x[:, 1])

    x, y, vx, vy, vout = t["in.x"], t["in.y"], t["in.vx"], t["in.vy"], t["in.vout"]
    ref = {}
    out, (gx, gy) = AF.vjp(vector, (x, y), vout)
    ref.update({"vjp.out": out, "vjp.x": gx, "vjp.y": gy})
    out, jv = AF.jvp(vector, (x, y), (vx, vy))
    ref.update({"jvp.out": out, "jvp.jv": jv})
    jx, jy = AF.jacobian(vector, (x, y))
    ref.update({"jacobian.x": jx, "jacobian.y": jy})
    (hxx, hxy), (hyx, hyy) = AF.hessian(scalar, (x, y))
    ref.update({"hessian.xx": hxx, "hessian.xy": hxy, "hessian.yx": hyx, "hessian.yy": hyy})
    out, (hx, hy) = AF.hvp(scalar, (x, y), (vx, vy))
    ref.update({"hvp.out": out, "hvp.x": hx, "hvp.y": hy})
    out, (hx, hy) = AF.vhp(scalar, (x, y), (vx, vy))
    ref.update({"vhp.out": out, "vhp.x": hx, "vhp.y": hy})
    return ref["hvp.out"], ref


def main(argv):
    if len(argv) != 2:
        print(__doc__)
        return 2
    t, meta = load_safetensors(argv[1])
    example = meta.get("example")
    run = {"gradient_penalty": gradient_penalty, "maml_sine": maml_sine, "functional": functional}.get(example)
    if run is None:
        print(f"second_order_ref: unknown example {example!r}")
        return 2
    torch.set_default_dtype(torch.float64)
    loss, grads = run(t, meta)
    if example == "functional":  # every result under the dump's own name
        rows = [(n, rel_err(t[n], g.detach())) for n, g in grads.items()]
        rows += [(n + " shape", 0.0 if tuple(t[n].shape) == tuple(g.shape) else float("inf")) for n, g in grads.items()]
    else:
        rows = [("loss", rel_err(t["out.loss"], loss.detach()))]
        rows += [("grad." + n, rel_err(t["grad." + n], g)) for n, g in grads.items()]
    worst = max(rows, key=lambda r: r[1])
    print(f"second_order_ref: {example}: loss {loss.item():.6f}, {len(rows)} tensors, worst relative error "
          f"{worst[1]:.2e} ({worst[0]})")
    bad = [f"{n}: relative error {e:.3g} >= {TOL}" for n, e in rows if not e < TOL]
    if bad:
        print("MISMATCH:\n  " + "\n  ".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
