#!/usr/bin/env python3
"""tapestry's Vision Transformer (models/vit.h) as its PyTorch twin, built from
torch.nn.TransformerEncoderLayer (norm_first, GELU, batch_first) and F.unfold, for the ViT parity
test and for the race against tapestry on Fashion-MNIST.

    /usr/bin/python3 tools/reference/vit_ref.py check DUMP.safetensors [--verbose]
    /usr/bin/python3 tools/reference/vit_ref.py train [--data DIR] [--epochs N] [--time-limit S] ...

check: DUMP is written by tests/vit_parity_dump.cpp: the weights, a batch, and tapestry's logits,
loss, gradients and parameters after one AdamW step. tapestry's names map onto PyTorch's:
self_attn.w_q/w_k/w_v stack into in_proj_weight/in_proj_bias, w_o is out_proj, ff.w_1/ff.w_2
are linear1/linear2, norm1/norm2 keep their names. Errors are relative to the reference's
largest magnitude (tolerance 1e-4; gradients with a floor of 1e-3 of the largest gradient);
exit status 1 on any mismatch, each named.

train: the image task's recipe (`tapestry train --task image`: the same split sizes, batch,
AdamW with the same decay groups, warmup then cosine, random crop and flip) in PyTorch, stopping
at --time-limit seconds of training; prints the test accuracy as the last line.
"""
import argparse
import gzip
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hvp_ref import hvp_rows  # noqa: E402
from safetensors_file import load_safetensors  # noqa: E402

TOL = 1e-4
HVP_TOL = 1e-3  # H v in float32 on both sides, relative to the largest |H v| (two backward passes of rounding)


class ViT(nn.Module):
    def __init__(self, c, dropout=0.0):
        super().__init__()
        self.c = c
        d, p = c["d_model"], c["patch_size"]
        n = ((c["image_size"] - p) // c.get("patch_stride", p) + 1) ** 2
        self.patch_embed = nn.Linear(c["channels"] * p * p, d)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        self.pos_embed = nn.Parameter(torch.zeros(1, n + 1, d))
        self.dropout = nn.Dropout(dropout)
        layer = nn.TransformerEncoderLayer(d, c["heads"], c["d_ff"], dropout, activation=c.get("activation", "gelu"),
                                           layer_norm_eps=c["ln_eps"], batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, c["layers"], norm=nn.LayerNorm(d, eps=c["ln_eps"]),
                                             enable_nested_tensor=False)
        self.head = nn.Linear(d, c["classes"])

    def init_weights(self):
        """timm's init, as models/vit.cpp: truncated normal 0.02 for Linear weights and the
        positions, zero biases, LayerNorm (1, 0), [CLS] N(0, 1e-6)."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.MultiheadAttention):
                nn.init.trunc_normal_(m.in_proj_weight, std=0.02)
                nn.init.zeros_(m.in_proj_bias)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.normal_(self.cls_token, std=1e-6)

    def forward(self, images):
        p = self.c["patch_size"]
        x = self.patch_embed(F.unfold(images, p, stride=self.c.get("patch_stride", p)).transpose(1, 2))
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1) + self.pos_embed
        return self.head(self.encoder(self.dropout(x))[:, 0])


def torch_name(name):
    """tapestry's parameter name -> (PyTorch's name, slot): slot 0/1/2 is the q/k/v third of in_proj."""
    parts = name.split(".")
    if len(parts) > 4 and parts[3] == "self_attn":
        head, kind = ".".join(parts[:4]), parts[5]
        proj = parts[4]
        if proj in ("w_q", "w_k", "w_v"):
            return f"{head}.in_proj_{kind}", ("w_q", "w_k", "w_v").index(proj)
        return f"{head}.out_proj.{kind}", None
    if len(parts) > 4 and parts[3] == "ff":
        return ".".join(parts[:3] + [{"w_1": "linear1", "w_2": "linear2"}[parts[4]], parts[5]]), None
    return name, None


def gather(tensors, prefix, names, model):
    """tapestry's tensors (prefix + name) laid out as PyTorch's parameters."""
    out = {n: torch.empty_like(p) for n, p in model.named_parameters()}
    for name in names:
        tname, slot = torch_name(name)
        t = tensors[prefix + name]
        if slot is None:
            out[tname] = t.clone()
        else:
            d = t.shape[0]
            out[tname][slot * d:(slot + 1) * d] = t
    return out


def load_dump(model, tensors):
    """Loads the dump's weights (tapestry's names) into the twin; returns (tapestry's parameter
    names, the starting values in PyTorch's layout), or None after printing how the names differ."""
    names = sorted(k[len("grad."):] for k in tensors if k.startswith("grad."))
    mapped, ours = {torch_name(n)[0] for n in names}, {n for n, _ in model.named_parameters()}
    if mapped != ours:
        print(f"MISMATCH: parameter names differ:\n  reference only: {sorted(ours - mapped)}\n"
              f"  tapestry only: {sorted(mapped - ours)}")
        return None
    start = gather(tensors, "", names, model)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(start[n])
    return names, start


def decay_split(model):
    decay = [n for n, p in model.named_parameters() if p.dim() >= 2 and n not in ("cls_token", "pos_embed")]
    return decay, [n for n, _ in model.named_parameters() if n not in decay]


def rel_err(a, b, floor=1e-12):
    scale = b.abs().max().item() if b.numel() else 0.0
    return (a - b).abs().max().item() / max(scale, floor) if b.numel() else 0.0


class Comparer:
    """Records each tensor's error (max |tapestry - reference| over the reference's largest
    magnitude, at least `floor`; `allow`, elementwise and absolute, is taken off each difference
    first: rounding no implementation avoids; `valid` picks the elements that mean something)
    and the failures above TOL. The parity checks of vit_ref.py and bert_ref.py share it."""

    def __init__(self):
        self.rows, self.failures = [], []

    def __call__(self, name, a, b, floor=1e-12, allow=None, valid=None):
        if tuple(a.shape) != tuple(b.shape):
            self.failures.append(f"{name}: tapestry shape {list(a.shape)}, reference {list(b.shape)}")
            return
        a, b = a.double(), b.double()
        if valid is not None:
            a, b = a[valid], b[valid]
        if allow is None:
            e = rel_err(a, b, floor)
        else:
            excess = ((a - b).abs() - allow).clamp(min=0)
            e = excess.max().item() / max(b.abs().max().item(), floor) if b.numel() else 0.0
        self.rows.append((name, e))
        if not e < TOL:  # also catches NaN
            self.failures.append(f"{name}: relative error {e:.3g} >= {TOL}")

    def adamw_moves(self, model, opt, tensors, names, start, grads):
        """One step of `opt` with tapestry's gradients (already compared), then each parameter's
        move against tapestry's, allowing 4 float32 epsilons of the weights' own rounding."""
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.grad = grads[n].clone()
        opt.step()
        after = gather(tensors, "adamw.", names, model)
        eps32 = torch.finfo(torch.float32).eps
        for n, p in model.named_parameters():
            allow = 4 * eps32 * torch.stack([start[n].abs().double(), p.detach().abs().double()]).amax(0)
            self(f"adamw.{n}", after[n] - start[n], p.detach() - start[n], allow=allow)

    def report(self, summary, verbose):
        worst = max(self.rows, key=lambda r: r[1])
        print(f"{summary}, {len(self.rows)} tensors compared, worst relative error {worst[1]:.2e} ({worst[0]})")
        if verbose:
            for name, e in self.rows:
                print(f"  {name:50s} {e:.2e}")
        if self.failures:
            print("MISMATCH:\n  " + "\n  ".join(self.failures))
            return 1
        return 0


def check(path, verbose):
    tensors, meta = load_safetensors(path)
    c = {k: int(meta[k]) for k in ("image_size", "channels", "patch_size", "patch_stride", "classes", "d_model",
                                   "layers", "heads", "d_ff")}
    c["ln_eps"], c["activation"] = float(meta["ln_eps"]), meta["activation"]
    model = ViT(c)
    loaded = load_dump(model, tensors)
    if loaded is None:
        return 1
    names, start = loaded
    compare = Comparer()

    images, labels = tensors["batch.images"], tensors["batch.labels"]
    logits = model(images)
    compare("logits", tensors["out.logits"], logits.detach())
    loss = F.cross_entropy(logits, labels)
    loss.backward()
    compare("loss", tensors["out.loss"], loss.detach())
    ref_grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    our_grads = gather(tensors, "grad.", names, model)
    gmax = max(g.abs().max().item() for g in ref_grads.values())
    for n in ref_grads:
        compare("grad." + n, our_grads[n], ref_grads[n], floor=1e-3 * gmax)
    # Second order: H v at these weights (tests/hvp_dump.h), in the twin's layout.
    hv_rows, hv_failures = hvp_rows(model, tensors, lambda: F.cross_entropy(model(images), labels), HVP_TOL,
                                    ours=gather(tensors, "hvp.", names, model),
                                    dirs=gather(tensors, "hvpdir.", names, model))
    compare.rows += hv_rows
    compare.failures += hv_failures

    decay, no_decay = decay_split(model)
    got = sorted(torch_name(n)[0] for n in meta["decay_params"].split(",") if n)
    if sorted(set(got)) != sorted(decay):
        compare.failures.append(f"decay_params: tapestry decays {sorted(set(got))}, expected {sorted(decay)}")
    params = dict(model.named_parameters())
    wd, lr = float(meta["weight_decay"]), float(meta["adamw_lr"])
    opt = torch.optim.AdamW([{"params": [params[n] for n in decay], "weight_decay": wd},
                             {"params": [params[n] for n in no_decay], "weight_decay": 0.0}], lr=lr)
    compare.adamw_moves(model, opt, tensors, names, start, our_grads)
    return compare.report(f"vit parity: loss {loss.item():.6f}", verbose)


# ---------------------------------------------------------------- the twin's training run

def read_idx(path):
    raw = (gzip.open if path.endswith(".gz") else open)(path, "rb").read()
    rank = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(rank)]
    return torch.frombuffer(bytearray(raw[4 + 4 * rank:]), dtype=torch.uint8).reshape(dims)


def read_split(folder, prefix):
    def find(name):
        return next(p for p in (f"{folder}/{name}.gz", f"{folder}/{name}") if os.path.exists(p))
    images = read_idx(find(f"{prefix}-images-idx3-ubyte")).float().div(255).unsqueeze(1)
    return images, read_idx(find(f"{prefix}-labels-idx1-ubyte")).long()


# name: (patch, stride, layers, heads, d_model, d_ff), as models::ViTConfig::named
CONFIGS = {"tiny": (7, 7, 2, 2, 32, 64), "fmnist": (8, 4, 4, 4, 64, 128), "small": (4, 4, 6, 4, 96, 192)}


def augment(x, pad, flip, gen):
    b, _, h, w = x.shape
    if pad > 0:
        padded = F.pad(x, (pad, pad, pad, pad))
        dy = torch.randint(0, 2 * pad + 1, (b,), generator=gen)
        dx = torch.randint(0, 2 * pad + 1, (b,), generator=gen)
        rows = (dy[:, None] + torch.arange(h)[None, :])  # [b, h]
        cols = (dx[:, None] + torch.arange(w)[None, :])  # [b, w]
        x = padded[torch.arange(b)[:, None, None, None], torch.arange(x.shape[1])[None, :, None, None],
                   rows[:, None, :, None], cols[:, None, None, :]]
    if flip:
        mask = torch.rand(b, generator=gen) < 0.5
        x = torch.where(mask[:, None, None, None], x.flip(3), x)
    return x


def accuracy(model, x, y, batch=500):
    model.eval()
    correct = 0
    with torch.no_grad():
        for s in range(0, len(x), batch):
            correct += (model(x[s:s + batch]).argmax(1) == y[s:s + batch]).sum().item()
    model.train()
    return correct / len(x)


def train(a):
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    x, y = read_split(a.data, "train")
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(20251124))
    val_idx, train_idx = order[:a.val_size], order[a.val_size:]
    xv, yv, xt, yt = x[val_idx], y[val_idx], x[train_idx], y[train_idx]
    mean, std = xt.mean().item(), xt.var().sqrt().item()  # as the task: the training split's figures
    xv = (xv - mean) / std  # training batches: after their augmentation
    p, stride, layers, heads, d, ff = CONFIGS[a.config]
    c = dict(image_size=x.shape[2], channels=1, patch_size=p, patch_stride=stride, classes=10, d_model=d, layers=layers, heads=heads,
             d_ff=ff, ln_eps=1e-5, activation="gelu")
    model = ViT(c, a.dropout)
    model.init_weights()
    decay, no_decay = decay_split(model)
    params = dict(model.named_parameters())
    opt = torch.optim.AdamW([{"params": [params[n] for n in decay], "weight_decay": a.weight_decay},
                             {"params": [params[n] for n in no_decay], "weight_decay": 0.0}], lr=a.lr)
    steps_per_epoch = math.ceil(len(xt) / a.batch)
    total = steps_per_epoch * a.epochs
    warmup = min(a.warmup, total)

    def lr_at(step):  # optim::CosineSchedule at 1-based step s: linear warmup, then cosine to min_lr
        s = step + 1
        if s <= warmup:
            return a.lr * s / warmup
        frac = (s - warmup) / max(1, total - warmup)
        return a.min_lr + (a.lr - a.min_lr) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))

    gen = torch.Generator().manual_seed(a.seed)
    step, trained, start, out_of_time = 0, 0.0, time.time(), False
    print(f"twin: ViT {a.config} ({sum(p.numel() for p in model.parameters())} parameters), {len(xt)} train, "
          f"{len(xv)} val images, {a.epochs} epochs of {steps_per_epoch} steps, {a.threads} threads", flush=True)
    for epoch in range(1, a.epochs + 1):
        perm = torch.randperm(len(xt), generator=gen)
        t0 = time.time()
        for s in range(0, len(xt), a.batch):
            idx = perm[s:s + a.batch]
            xb = (augment(xt[idx], a.crop_padding, a.flip, gen) - mean) / std
            for g in opt.param_groups:
                g["lr"] = lr_at(step)
            # tapestry's smoothing is the paper's: 1 - eps on the gold class, eps / (K - 1) on each other.
            # PyTorch's s gives 1 - s + s / K and s / K: the same targets for s = eps * K / (K - 1).
            eps = a.label_smoothing * 10 / 9
            loss = F.cross_entropy(model(xb), yt[idx], label_smoothing=eps)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            if a.time_limit and trained + time.time() - t0 >= a.time_limit:
                out_of_time = True
                break
        trained += time.time() - t0
        print(f"twin: epoch {epoch}: {step} steps, loss {loss.item():.4f}, val accuracy "
              f"{100 * accuracy(model, xv, yv):.2f}%, {trained:.0f} s of training", flush=True)
        if out_of_time:
            break
    xs, ys = read_split(a.data, "t10k")
    xs = (xs - mean) / std
    acc = accuracy(model, xs, ys)
    print(f"twin: final: test accuracy {100 * acc:.2f}% after {step} of {total} steps, {trained:.0f} s of training, "
          f"{step * a.batch / trained:.0f} train images/s")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("dump")
    c.add_argument("--verbose", action="store_true")
    t = sub.add_parser("train")
    t.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    t.add_argument("--config", default="fmnist", choices=sorted(CONFIGS))
    t.add_argument("--epochs", type=int, default=14)
    t.add_argument("--batch", type=int, default=128)
    t.add_argument("--lr", type=float, default=2e-3)
    t.add_argument("--min-lr", type=float, default=1e-5)
    t.add_argument("--warmup", type=int, default=300)
    t.add_argument("--weight-decay", type=float, default=0.05)
    t.add_argument("--dropout", type=float, default=0.0)
    t.add_argument("--label-smoothing", type=float, default=0.0)
    t.add_argument("--val-size", type=int, default=5000)
    t.add_argument("--crop-padding", type=int, default=0)
    t.add_argument("--flip", type=int, default=0)
    t.add_argument("--seed", type=int, default=1)
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--time-limit", type=float, default=0, help="seconds of training (0: none)")
    a = ap.parse_args()
    return check(a.dump, a.verbose) if a.cmd == "check" else train(a)


if __name__ == "__main__":
    sys.exit(main())
