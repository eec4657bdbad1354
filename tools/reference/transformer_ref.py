#!/usr/bin/env python3
"""The tapestry Transformer written the plain PyTorch way, as the reference for the parity test.

    /usr/bin/python3 tools/reference/transformer_ref.py DUMP.safetensors

DUMP is written by the parity_dump test program: the model's weights, one padded batch, and
tapestry's logits, loss, parameter gradients and parameters after one Adam step. This script
builds the same model (same parameter names), loads the weights, recomputes everything in
PyTorch and prints the largest relative error per tensor. Exit status 1 on any mismatch.
"""
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from hvp_ref import hvp_rows
from safetensors_file import load_safetensors

TOL = 1e-4
HVP_TOL = 1e-3  # H v in float32 on both sides, relative to the largest |H v| (two backward passes of rounding)


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, heads, dropout):
        super().__init__()
        self.heads, self.d_k = heads, d_model // heads
        self.w_q, self.w_k = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.w_v, self.w_o = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, q, k, v, mask):
        B = q.size(0)
        split = lambda x: x.view(B, -1, self.heads, self.d_k).transpose(1, 2)
        q, k, v = split(self.w_q(q)), split(self.w_k(k)), split(self.w_v(v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        scores = scores.masked_fill(mask, -1e9)
        attn = self.dropout(F.softmax(scores, dim=-1))
        return self.w_o((attn @ v).transpose(1, 2).reshape(B, -1, self.heads * self.d_k))


class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout):
        super().__init__()
        self.w_1, self.w_2, self.dropout = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model), nn.Dropout(dropout)

    def forward(self, x):
        return self.w_2(self.dropout(F.relu(self.w_1(x))))


class EncoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.pre_norm = c["pre_norm"]
        self.self_attn = MultiHeadAttention(c["d_model"], c["heads"], c["dropout"])
        self.ff = FeedForward(c["d_model"], c["d_ff"], c["dropout"])
        self.norm1, self.norm2 = nn.LayerNorm(c["d_model"]), nn.LayerNorm(c["d_model"])
        self.dropout = nn.Dropout(c["dropout"])

    def forward(self, x, mask):
        if self.pre_norm:
            h = self.norm1(x)
            x = x + self.dropout(self.self_attn(h, h, h, mask))
            return x + self.dropout(self.ff(self.norm2(x)))
        x = self.norm1(x + self.dropout(self.self_attn(x, x, x, mask)))
        return self.norm2(x + self.dropout(self.ff(x)))


class DecoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.pre_norm = c["pre_norm"]
        self.self_attn = MultiHeadAttention(c["d_model"], c["heads"], c["dropout"])
        self.src_attn = MultiHeadAttention(c["d_model"], c["heads"], c["dropout"])
        self.ff = FeedForward(c["d_model"], c["d_ff"], c["dropout"])
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(c["d_model"]) for _ in range(3))
        self.dropout = nn.Dropout(c["dropout"])

    def forward(self, x, memory, src_mask, tgt_mask):
        if self.pre_norm:
            h = self.norm1(x)
            x = x + self.dropout(self.self_attn(h, h, h, tgt_mask))
            h = self.norm2(x)
            x = x + self.dropout(self.src_attn(h, memory, memory, src_mask))
            return x + self.dropout(self.ff(self.norm3(x)))
        x = self.norm1(x + self.dropout(self.self_attn(x, x, x, tgt_mask)))
        x = self.norm2(x + self.dropout(self.src_attn(x, memory, memory, src_mask)))
        return self.norm3(x + self.dropout(self.ff(x)))


_PE_CACHE = {}


def positional_encoding(length, d_model):
    """The sinusoid table [length, d_model] in float32 (computed in float64, cached)."""
    key = (length, d_model)
    if key not in _PE_CACHE:
        _PE_CACHE[key] = _positional_encoding(length, d_model)
    return _PE_CACHE[key]


def _positional_encoding(length, d_model):
    pos = torch.arange(length, dtype=torch.float64).unsqueeze(1)
    i = torch.arange(0, d_model, 2, dtype=torch.float64)
    angle = pos / torch.pow(10000.0, i / d_model)
    pe = torch.zeros(length, d_model, dtype=torch.float64)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(angle), torch.cos(angle)
    return pe.float()


class Transformer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        d = c["d_model"]
        self.src_embed = nn.Embedding(c["src_vocab"], d, padding_idx=c["pad_id"])
        self.tgt_embed = self.src_embed if c["share_embeddings"] else nn.Embedding(c["tgt_vocab"], d, padding_idx=c["pad_id"])
        self.encoder = nn.ModuleList([EncoderLayer(c) for _ in range(c["enc_layers"])])
        self.decoder = nn.ModuleList([DecoderLayer(c) for _ in range(c["dec_layers"])])
        if c["pre_norm"]:
            self.encoder_norm, self.decoder_norm = nn.LayerNorm(d), nn.LayerNorm(d)
        self.generator = nn.Linear(d, c["tgt_vocab"], bias=False)
        if c["share_embeddings"]:
            self.generator.weight = self.src_embed.weight
        self.drop = nn.Dropout(c["dropout"])

    def embed(self, table, ids):
        x = table(ids) * math.sqrt(self.c["d_model"])
        return self.drop(x + positional_encoding(ids.size(1), self.c["d_model"]))

    def encode(self, src):
        src_mask = (src == self.c["pad_id"])[:, None, None, :]
        x = self.embed(self.src_embed, src)
        for layer in self.encoder:
            x = layer(x, src_mask)
        return (self.encoder_norm(x) if self.c["pre_norm"] else x), src_mask

    def decode(self, tgt, memory, src_mask):
        T = tgt.size(1)
        future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        tgt_mask = (tgt == self.c["pad_id"])[:, None, None, :] | future
        y = self.embed(self.tgt_embed, tgt)
        for layer in self.decoder:
            y = layer(y, memory, src_mask, tgt_mask)
        return self.decoder_norm(y) if self.c["pre_norm"] else y

    def forward(self, src, tgt):
        memory, src_mask = self.encode(src)
        return self.generator(self.decode(tgt, memory, src_mask))


def smoothed_cross_entropy(logits, target, eps, pad):
    """The paper's label smoothing: 1-eps on the gold token, eps spread over all but gold and pad."""
    V = logits.size(-1)
    lp = F.log_softmax(logits, dim=-1)
    q = torch.full_like(lp, eps / (V - 2))
    q.scatter_(1, target.unsqueeze(1), 1.0 - eps)
    q[:, pad] = 0.0
    keep = target != pad
    return -(q * lp).sum(-1)[keep].mean()


def rel_err(a, b, floor=1e-12):
    """Largest difference relative to the reference's largest magnitude (at least `floor`)."""
    scale = b.abs().max().item() if b.numel() else 0.0
    return (a - b).abs().max().item() / max(scale, floor)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    tensors, meta = load_safetensors(sys.argv[1])
    c = {k: int(meta[k]) for k in ("src_vocab", "tgt_vocab", "d_model", "heads", "d_ff", "enc_layers", "dec_layers", "pad_id")}
    c.update(pre_norm=meta["pre_norm"] == "1", share_embeddings=meta["share_embeddings"] == "1", dropout=0.0)
    smoothing, lr = float(meta["label_smoothing"]), float(meta["adam_lr"])
    torch.set_default_dtype(torch.float32)
    model = Transformer(c)
    names = [n for n, _ in model.named_parameters()]
    expected = sorted(k for k in tensors
                      if "." in k and k.split(".")[0] not in ("batch", "out", "grad", "adam", "hvp", "hvpdir"))
    if sorted(names) != expected:
        print(f"parameter names differ:\n  reference only: {sorted(set(names) - set(expected))}\n"
              f"  tapestry only: {sorted(set(expected) - set(names))}")
        return 1
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(tensors[n])
    before = {n: p.detach().clone() for n, p in model.named_parameters()}

    src, tgt_in, tgt_out = tensors["batch.src"], tensors["batch.tgt_in"], tensors["batch.tgt_out"]
    logits = model(src, tgt_in)
    loss = smoothed_cross_entropy(logits.reshape(-1, c["tgt_vocab"]), tgt_out.reshape(-1), smoothing, c["pad_id"])
    loss.backward()

    # Some gradients are zero in exact arithmetic: the key bias of every attention layer (adding
    # a constant to all keys shifts each query's scores by a constant, which softmax ignores).
    # Both sides then hold rounding noise, so gradients are measured against a floor of 1e-3 of
    # the largest gradient anywhere in the model rather than against their own (noise) size.
    grad_max = max(p.grad.abs().max().item() for p in model.parameters())
    failures, rows = [], []
    def check(name, ours, ref, tol=TOL, floor=1e-12):
        e = rel_err(ours.double(), ref.double(), floor)
        rows.append((name, e))
        if not e < tol:
            failures.append(f"{name}: relative error {e:.3g} >= {tol}")

    check("logits", tensors["out.logits"], logits.detach())
    check("loss", tensors["out.loss"], loss.detach())
    for n, p in model.named_parameters():
        check("grad." + n, tensors["grad." + n], p.grad, floor=1e-3 * grad_max)
    # Second order: H v at these weights (tests/hvp_dump.h), float32 on both sides.
    hv_rows, hv_failures = hvp_rows(model, tensors, lambda: smoothed_cross_entropy(
        model(src, tgt_in).reshape(-1, c["tgt_vocab"]), tgt_out.reshape(-1), smoothing, c["pad_id"]), HVP_TOL)
    rows += hv_rows
    failures += hv_failures

    # One Adam step: compare each parameter's update. Elements whose gradient is rounding noise
    # (below 1e-6 of the largest gradient in the model) are left out: Adam's first step is
    # lr * sign(g), and the sign of noise is arbitrary.
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.98), eps=1e-9)
    opt.step()
    skipped = 0
    for n, p in model.named_parameters():
        g = p.grad.abs()
        keep = g > 1e-6 * grad_max
        skipped += int((~keep).sum())
        ours = (tensors["adam." + n] - before[n])[keep]
        ref = (p.detach() - before[n])[keep]
        if ref.numel():
            check("adam." + n, ours, ref)

    worst = max(rows, key=lambda r: r[1])
    print(f"parity ({'pre' if c['pre_norm'] else 'post'}-norm, {'shared' if c['share_embeddings'] else 'separate'} "
          f"embeddings): {len(rows)} tensors compared, loss {loss.item():.6f}, worst {worst[0]} {worst[1]:.2e}, "
          f"{skipped} noise-level gradient elements left out of the Adam check")
    for name, e in rows:
        print(f"  {name:60s} {e:.2e}")
    if failures:
        print("MISMATCH:\n  " + "\n  ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
