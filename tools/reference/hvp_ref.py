"""The zoo's second-order parity (issue 45): recomputes the Hessian-vector products a parity dump
holds (tests/hvp_dump.h: "hvpdir.<name>", "hvp.<name>") with torch.autograd.grad(create_graph=True)
on the PyTorch twin at the same weights, and compares them parameter by parameter, relative to the
largest |H v| anywhere in the model (as the gradients are compared, against a floor)."""
import torch


def dump_dicts(model, tensors):
    """The dump's H v and directions by the model's own parameter names (when they are tapestry's)."""
    names = [n for n, _ in model.named_parameters()]
    missing = [n for n in names if "hvp." + n not in tensors or "hvpdir." + n not in tensors]
    if missing:
        return None, None, [f"hvp: the dump lacks hvp./hvpdir. for {missing[:5]}"]
    return {n: tensors["hvp." + n] for n in names}, {n: tensors["hvpdir." + n] for n in names}, []


def hvp_rows(model, tensors, loss_fn, tol, ours=None, dirs=None):
    """(rows, failures): one (name, relative error) row per parameter, and a line per failure.
    ours / dirs: tapestry's H v and directions by the model's parameter names (gathered into the
    twin's layout where its names differ); by default read from the dump under the same names."""
    if ours is None or dirs is None:
        ours, dirs, failures = dump_dicts(model, tensors)
        if failures:
            return [], failures
    named = list(model.named_parameters())
    params = [p for _, p in named]
    directions = [dirs[n].to(p.dtype) for n, p in named]
    loss = loss_fn()
    grads = torch.autograd.grad(loss, params, create_graph=True, allow_unused=True)
    s = None
    for g, d in zip(grads, directions):
        if g is None or not g.requires_grad:
            continue
        term = (g * d).sum()
        s = term if s is None else s + term
    hv = torch.autograd.grad(s, params, allow_unused=True) if s is not None else [None] * len(params)
    refs = [h.detach() if h is not None else torch.zeros_like(p) for h, p in zip(hv, params)]
    hmax = max((r.abs().max().item() for r in refs if r.numel()), default=0.0)
    rows, failures = [], []
    for (n, _), ref in zip(named, refs):
        got = ours[n].to(torch.float64)
        if tuple(got.shape) != tuple(ref.shape):
            failures.append(f"hvp.{n}: tapestry shape {list(got.shape)}, reference {list(ref.shape)}")
            continue
        e = (got - ref.double()).abs().max().item() / max(hmax, 1e-12) if ref.numel() else 0.0
        rows.append(("hvp." + n, e))
        if not e < tol:  # also catches NaN
            failures.append(f"hvp.{n}: error {e:.3g} relative to the largest |H v| >= {tol}")
    return rows, failures
