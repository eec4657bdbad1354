#!/usr/bin/env python3
"""A Llama-style decoder written the plain PyTorch way, in Hugging Face's layout and semantics
(LlamaForCausalLM: RMSNorm in float32, rotate_half rotary positions, grouped-query attention by
repeat_kv, SwiGLU, no biases), as the reference for tapestry's models::Llama and load_llama_hf.
It does not need the transformers package.

    /usr/bin/python3 tools/reference/llama_ref.py write-hf DIR [--dtype F32|BF16|F16] [--shards N]
                                                               [--tie] [--seed N] [--vocab N]
                                                               [--hidden N] [--intermediate N] [--layers N]
    /usr/bin/python3 tools/reference/llama_ref.py check DIR DUMP.safetensors

write-hf: a tiny random Llama with grouped-query attention (4 query heads, 2 key/value heads) as a
Hugging Face checkpoint directory: config.json, and model.safetensors or, with --shards N > 1,
model-0000i-of-0000N.safetensors with model.safetensors.index.json, keys "model.embed_tokens.weight",
"model.layers.{i}.self_attn.q_proj.weight", ..., "model.norm.weight" and "lm_head.weight" (not
with --tie), stored in --dtype. The weights are N(0, 0.2) and the norm weights 1 + N(0, 0.1), so
that each one matters.

check: DUMP is written by tests/llama_hf_check.cpp from the same directory: tapestry's logits,
loss and every gradient for a batch, the weights after one AdamW step (decay on matrices only),
and greedy generations of 50 tokens with and without the KV cache. This script loads the
directory's weights (as float32), recomputes the logits, loss and gradients, takes the AdamW step
with torch.optim.AdamW from the same gradients, and checks that each generated token is PyTorch's
argmax given the tokens before it (to the tolerance: a near-tie may go either way). Errors are
relative to the reference tensor's largest magnitude (1e-4; gradients with a floor of 1e-3 of the
largest gradient). Exit status 1 on any mismatch, each one named.
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hvp_ref import hvp_rows  # noqa: E402
from safetensors_file import load_safetensors, save_safetensors  # noqa: E402

TOL = 1e-4
HVP_TOL = 1e-3  # H v in float32 on both sides, relative to the largest |H v| (two backward passes of rounding)
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 67,
    "hidden_size": 32,
    "intermediate_size": 56,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 96,
    "rope_theta": 5000.0,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "rope_scaling": None,
    "attention_bias": False,
}
DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
TORCH_DTYPE_NAMES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


# ---------------------------------------------------------------- the model (Hugging Face's semantics)

class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotary_tables(positions, head_dim, theta):
    """LlamaRotaryEmbedding in float32: cos and sin [T, head_dim] (the half-table repeated)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, self.heads, self.kv_heads = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
        self.head_dim = d // self.heads
        self.q_proj = nn.Linear(d, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        r = self.heads // self.kv_heads  # repeat_kv: kv head j serves query heads j*r .. j*r+r-1
        k, v = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        attn = F.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
        return self.o_proj((attn @ v).transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, d, f):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(d, f, bias=False), nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = MLP(c["hidden_size"], c["intermediate_size"])

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(Layer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class LlamaForCausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = Body(c)
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        if c["tie_word_embeddings"]:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, ids):
        T = ids.shape[1]
        cos, sin = rotary_tables(torch.arange(T), self.c["hidden_size"] // self.c["num_attention_heads"],
                                 self.c["rope_theta"])
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.model.norm(x))


# ---------------------------------------------------------------- write-hf

def write_hf(args):
    torch.manual_seed(args.seed)
    c = dict(CONFIG, tie_word_embeddings=args.tie, torch_dtype=TORCH_DTYPE_NAMES[args.dtype], vocab_size=args.vocab,
             hidden_size=args.hidden, intermediate_size=args.intermediate, num_hidden_layers=args.layers)
    model = LlamaForCausalLM(c)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))
    tensors = [(n, p.detach().to(DTYPES[args.dtype]).contiguous()) for n, p in model.named_parameters()]
    os.makedirs(args.dir, exist_ok=True)
    with open(os.path.join(args.dir, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    meta = {"format": "pt"}
    if args.shards <= 1:
        save_safetensors(os.path.join(args.dir, "model.safetensors"), dict(tensors), meta)
        return
    per = math.ceil(len(tensors) / args.shards)
    weight_map, total = {}, 0
    for i in range(args.shards):
        name = f"model-{i + 1:05d}-of-{args.shards:05d}.safetensors"
        part = tensors[i * per:(i + 1) * per]
        save_safetensors(os.path.join(args.dir, name), dict(part), meta)
        for key, t in part:
            weight_map[key] = name
            total += t.numel() * t.element_size()
    with open(os.path.join(args.dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


# ---------------------------------------------------------------- check

def load_hf(directory):
    with open(os.path.join(directory, "config.json")) as f:
        c = json.load(f)
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    state = {}
    for name in files:
        state.update(load_safetensors(os.path.join(directory, name))[0])
    model = LlamaForCausalLM(c)
    own = dict(model.named_parameters())
    with torch.no_grad():
        for name, p in own.items():
            p.copy_(state[name].float())
    return model


class Report:
    def __init__(self):
        self.failures, self.worst = [], {}

    def compare(self, what, group, got, want, floor=0.0):
        got, want = got.double(), want.double()
        if got.shape != want.shape:
            self.failures.append(f"{what}: shape {list(got.shape)}, PyTorch {list(want.shape)}")
            return
        scale = max(want.abs().max().item() if want.numel() else 0.0, floor, 1e-30)
        err = (got - want).abs().max().item() / scale if want.numel() else 0.0
        self.worst[group] = max(self.worst.get(group, 0.0), err)
        if not err <= TOL:
            self.failures.append(f"{what}: relative error {err:.3g} > {TOL}")


def check(args):
    dump, meta = load_safetensors(args.dump)
    model = load_hf(args.dir)
    rep = Report()
    ids, targets = dump["batch.ids"], dump["batch.targets"]
    logits = model(ids)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)
    loss.backward()
    rep.compare("logits", "logits", dump["out.logits"], logits.detach())
    rep.compare("loss", "loss", dump["out.loss"], loss.detach())
    named = dict(model.named_parameters())
    largest = max(p.grad.abs().max().item() for p in named.values())
    for name, p in named.items():
        if "grad." + name not in dump:
            rep.failures.append(f"grad.{name}: missing from the dump")
            continue
        rep.compare("grad." + name, "gradients", dump["grad." + name], p.grad, floor=1e-3 * largest)
    # Second order: H v at these weights (tests/hvp_dump.h), float32 on both sides.
    hv_rows, hv_failures = hvp_rows(model, dump, lambda: F.cross_entropy(
        model(ids).reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100), HVP_TOL)
    rep.failures += hv_failures
    if hv_rows:
        rep.worst["hvp"] = max(e for _, e in hv_rows)

    # One AdamW step from tapestry's own gradients (so that the step alone is compared), matrices
    # with weight decay and vectors without, as models::CausalLM::decay_parameters splits them.
    lr, wd = float(meta["adamw_lr"]), float(meta["weight_decay"])
    betas, eps = (float(meta["adamw_beta1"]), float(meta["adamw_beta2"])), float(meta["adamw_eps"])
    before = {n: p.detach().clone() for n, p in named.items()}
    for n, p in named.items():
        p.grad = dump["grad." + n].clone()
    decay = [p for p in named.values() if p.dim() >= 2]
    no_decay = [p for p in named.values() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=betas, eps=eps)
    opt.step()
    for n, p in named.items():
        rep.compare("adamw." + n, "AdamW moves", dump["adamw." + n] - before[n], p.detach() - before[n])
        # The move is lr-sized: the weights' own float32 rounding is below the tolerance of the move.

    # Greedy generation: each token tapestry chose (with the cache, and without it) must be the
    # argmax of PyTorch's logits given the tokens before it, to the tolerance.
    with torch.no_grad():
        for name, p in named.items():
            p.copy_(before[name])
        prompt = dump["gen.prompt"].reshape(1, -1)
        for kind in ("gen.cached", "gen.uncached"):
            chosen = dump[kind].reshape(1, -1)
            seq = torch.cat([prompt, chosen], dim=1)
            step_logits = model(seq[:, :-1])[0, prompt.shape[1] - 1:]  # the logits each choice was made from
            exact = 0
            for t in range(chosen.shape[1]):
                row, pick = step_logits[t], chosen[0, t].item()
                gap = (row.max() - row[pick]).item() / max(row.abs().max().item(), 1e-30)
                exact += int(row.argmax().item() == pick)
                if gap > TOL:
                    rep.failures.append(f"{kind}: token {t} is {pick}, PyTorch's argmax {row.argmax().item()} "
                                        f"(relative logit gap {gap:.3g})")
                    break
            rep.worst[kind + " exact"] = exact
        if not torch.equal(dump["gen.cached"], dump["gen.uncached"]):
            rep.failures.append("gen.cached differs from gen.uncached")

    print("llama_ref: " + ", ".join(f"{k} {v:.2e}" if isinstance(v, float) else f"{k} {v}/{dump['gen.cached'].numel()}"
                                    for k, v in rep.worst.items()))
    for f in rep.failures:
        print("llama_ref: FAIL: " + f, file=sys.stderr)
    return 1 if rep.failures else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write-hf")
    w.add_argument("dir")
    w.add_argument("--dtype", choices=sorted(DTYPES), default="F32")
    w.add_argument("--shards", type=int, default=1)
    w.add_argument("--tie", action="store_true")
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--vocab", type=int, default=CONFIG["vocab_size"])
    w.add_argument("--hidden", type=int, default=CONFIG["hidden_size"])  # a multiple of 4 heads' even head dim
    w.add_argument("--intermediate", type=int, default=CONFIG["intermediate_size"])
    w.add_argument("--layers", type=int, default=CONFIG["num_hidden_layers"])
    c = sub.add_parser("check")
    c.add_argument("dir")
    c.add_argument("dump")
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.cmd == "write-hf":
        write_hf(args)
        return 0
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
