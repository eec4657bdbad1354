#!/usr/bin/env python3
"""tapestry's GPT (models/gpt.h) written the plain PyTorch way, as the reference for
the GPT parity test, plus a writer of small random GPT-2 checkpoints in Hugging Face's layout.

    /usr/bin/python3 tools/reference/gpt_ref.py check DUMP.safetensors [--verbose]
    /usr/bin/python3 tools/reference/gpt_ref.py write-hf OUT.safetensors [--no-prefix] [--seed N]

check: DUMP is written by the gpt_parity_dump test program: the model's weights, a batch, and
tapestry's logits, loss, parameter gradients and parameters after AdamW steps. This script
builds the same model (same parameter names), loads the weights, recomputes everything in
PyTorch and prints a one-line summary of the largest errors. Exit status 1 on any mismatch,
each one named. Errors are relative to the reference tensor's largest magnitude (tolerance
1e-4); gradients use a floor of 1e-3 of the model's largest gradient (some are zero in exact
arithmetic); the AdamW steps are taken with tapestry's own gradients and compared as moves
(after - before), allowing for the float32 rounding of the weights themselves. The
metadata's decay_params / no_decay_params (tapestry's groups) must be the dim >= 2 / dim < 2
split. A dump with out.loss2 also has a second step (grad2.*, adamw2.*), checked the same way.

write-hf: a small random GPT-2 in the layout of Hugging Face's GPT2LMHeadModel checkpoints
(model.safetensors), written without the transformers package: "transformer.wte.weight",
"transformer.h.0.attn.c_attn.weight" (Conv1D, stored [in, out]), ..., the old causal-mask
buffers "transformer.h.{i}.attn.bias" / ".attn.masked_bias" that older checkpoints carry, and
"lm_head.weight" (a copy of wte: tied). --no-prefix writes GPT2Model's layout instead (no
"transformer." and no lm_head). The same file carries a test case: "test.input_ids" [2, 9]
int64 and "test.logits" [2, 9, V] float32 from a plain GPT-2 forward over the file's own
tensors (gpt2_hf_forward below, independent of the tapestry-style model class), and the
metadata "n_head" (the file's tensors do not determine it). tests/gpt_hf_check.cpp loads the
file with models::load_gpt2_hf and compares logits.
"""
import argparse
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hvp_ref import hvp_rows
from safetensors_file import load_safetensors, save_safetensors  # noqa: E402

TOL = 1e-4  # relative to the reference tensor's largest magnitude, as transformer_ref.py
HVP_TOL = 1e-3  # H v in float32 on both sides, relative to the largest |H v| (two backward passes of rounding)
DUMP_GROUPS = ("batch", "out", "grad", "grad2", "adamw", "adamw2", "hvp", "hvpdir")  # dump prefixes that are not weights


# ---------------------------------------------------------------- the model (tapestry's names)

class CausalSelfAttention(nn.Module):
    """H heads of softmax(Q K^T / sqrt(D/H) + causal mask) V, concatenated, then w_o."""

    def __init__(self, d_model, heads, dropout):
        super().__init__()
        assert d_model % heads == 0, "heads must divide d_model"
        self.heads, self.d_k = heads, d_model // heads
        self.w_q, self.w_k = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.w_v, self.w_o = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)  # on the attention weights, as nn::MultiHeadAttention

    def forward(self, x):
        B, T, _ = x.shape
        split = lambda t: t.view(B, T, self.heads, self.d_k).transpose(1, 2)  # [B, H, T, K]
        q, k, v = split(self.w_q(x)), split(self.w_k(x)), split(self.w_v(x))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        future = torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), diagonal=1)  # key j > query i
        attn = self.dropout(F.softmax(scores.masked_fill(future, float("-inf")), dim=-1))
        return self.w_o((attn @ v).transpose(1, 2).reshape(B, T, self.heads * self.d_k))


class MLP(nn.Module):
    """proj(GELU(fc(x))), then dropout. GELU: GPT-2's tanh approximation ("gelu_new") or exact erf."""

    def __init__(self, d_model, d_ff, dropout, gelu_tanh):
        super().__init__()
        self.fc, self.proj = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)
        self.approximate = "tanh" if gelu_tanh else "none"

    def forward(self, x):
        return self.dropout(self.proj(F.gelu(self.fc(x), approximate=self.approximate)))


class Block(nn.Module):
    """Pre-norm: x + dropout(attn(ln_1(x))), then x + mlp(ln_2(x))."""

    def __init__(self, c):
        super().__init__()
        d = c["d_model"]
        self.ln_1 = nn.LayerNorm(d, eps=c["ln_eps"])
        self.attn = CausalSelfAttention(d, c["heads"], c["dropout"])
        self.ln_2 = nn.LayerNorm(d, eps=c["ln_eps"])
        self.mlp = MLP(d, c["d_ff"], c["dropout"], c["gelu_tanh"])
        self.dropout = nn.Dropout(c["dropout"])

    def forward(self, x):
        x = x + self.dropout(self.attn(self.ln_1(x)))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Token embedding + learned positions, pre-norm blocks, ln_f, head tied to wte.

    c: vocab, block_size, layers, heads, d_model, d_ff (0: 4 d_model), dropout, ln_eps,
    gelu_tanh. named_parameters() lists the tied weight once, as "wte.weight" (registered
    before head), like tapestry's Module."""

    def __init__(self, c):
        super().__init__()
        c = dict(c)
        c.setdefault("d_ff", 0)
        c.setdefault("ln_eps", 1e-5)
        c.setdefault("gelu_tanh", True)
        if not c["d_ff"]:
            c["d_ff"] = 4 * c["d_model"]
        self.c = c
        d = c["d_model"]
        self.wte = nn.Embedding(c["vocab"], d)
        self.wpe = nn.Embedding(c["block_size"], d)
        self.drop = nn.Dropout(c["dropout"])
        self.blocks = nn.ModuleList([Block(c) for _ in range(c["layers"])])
        self.ln_f = nn.LayerNorm(d, eps=c["ln_eps"])
        self.head = nn.Linear(d, c["vocab"], bias=False)
        self.head.weight = self.wte.weight  # tied

    def gpt2_init(self):
        """GPT-2's initialization: N(0, 0.02) for every matrix and both embeddings, zero biases,
        LayerNorm (1, 0), and N(0, 0.02 / sqrt(2 layers)) for the two projections that write
        into the residual stream (attn.w_o, mlp.proj)."""
        std_out = 0.02 / math.sqrt(2 * self.c["layers"])
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    p.zero_()
                elif ".ln_" in name or name.startswith("ln_f"):
                    p.fill_(1.0)
                elif name.endswith("attn.w_o.weight") or name.endswith("mlp.proj.weight"):
                    p.normal_(0.0, std_out)
                else:
                    p.normal_(0.0, 0.02)
        return self

    def forward(self, ids):
        T = ids.size(1)
        if T > self.c["block_size"]:
            raise ValueError(f"sequence of {T} tokens exceeds block_size {self.c['block_size']}")
        pos = torch.arange(T, device=ids.device)
        x = self.drop(self.wte(ids) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def loss(self, ids, targets):
        """Mean cross-entropy over the positions whose target is not -100."""
        logits = self(ids)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-100)


def decay_split(model):
    """(decay names, no-decay names): weight decay on every parameter with dim >= 2 (the
    embeddings and Linear weights), none on biases and LayerNorm (dim < 2), as GPT-2 / nanoGPT."""
    decay = [n for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [n for n, p in model.named_parameters() if p.dim() < 2]
    return decay, no_decay


def adamw_groups(model, weight_decay):
    decay, no_decay = decay_split(model)
    params = dict(model.named_parameters())
    return [{"params": [params[n] for n in decay], "weight_decay": weight_decay},
            {"params": [params[n] for n in no_decay], "weight_decay": 0.0}]


# ---------------------------------------------------------------- check

def rel_err(a, b, floor=1e-12):
    """Largest difference relative to the reference's largest magnitude (at least `floor`)."""
    scale = b.abs().max().item() if b.numel() else 0.0
    return (a - b).abs().max().item() / max(scale, floor) if b.numel() else 0.0


def config_from_meta(meta):
    ints = ("vocab", "block_size", "layers", "heads", "d_model", "d_ff")
    missing = [k for k in ints if k not in meta]
    if missing:
        raise SystemExit(f"gpt_ref: the dump's metadata lacks {missing}")
    c = {k: int(meta[k]) for k in ints}
    c["ln_eps"] = float(meta.get("ln_eps", "1e-5"))
    c["gelu_tanh"] = meta.get("gelu_tanh", "1") == "1"
    c["dropout"] = float(meta.get("dropout", "0"))
    return c


def check(path, verbose):
    tensors, meta = load_safetensors(path)
    c = config_from_meta(meta)
    if c["dropout"] != 0.0:
        print(f"gpt_ref: the dump was made with dropout {c['dropout']}; parity needs 0")
        return 1
    lr = float(meta.get("adamw_lr", "1e-3"))
    betas = (float(meta.get("adamw_beta1", "0.9")), float(meta.get("adamw_beta2", "0.95")))
    eps = float(meta.get("adamw_eps", "1e-8"))
    wd = float(meta.get("weight_decay", "0.1"))
    torch.set_default_dtype(torch.float32)
    model = GPT(c)
    failures, rows = [], []

    # Names: the parameters tapestry has a gradient for must be exactly ours; its state_dict
    # holds each of them. "head.weight", if listed at all, must be wte's values (tied).
    names = [n for n, _ in model.named_parameters()]
    theirs = sorted(k[len("grad."):] for k in tensors if k.startswith("grad."))
    if sorted(names) != theirs:
        print(f"MISMATCH: parameter names differ:\n  reference only: {sorted(set(names) - set(theirs))}\n"
              f"  tapestry only: {sorted(set(theirs) - set(names))}")
        return 1
    state = {k: v for k, v in tensors.items() if k.split(".")[0] not in DUMP_GROUPS}
    for n in names:
        if n not in state:
            failures.append(f"state_dict: {n} missing from the dump")
    if "head.weight" in state and not torch.equal(state["head.weight"], state["wte.weight"]):
        failures.append("state_dict: head.weight differs from wte.weight (the head must be tied)")
    extra = sorted(set(state) - set(names) - {"head.weight"})
    if extra:
        print(f"gpt_ref: note: state_dict entries that are not parameters (ignored): {extra}")
    if failures:
        print("MISMATCH:\n  " + "\n  ".join(failures))
        return 1
    for n, p in model.named_parameters():
        if tuple(state[n].shape) != tuple(p.shape):
            failures.append(f"{n}: tapestry shape {list(state[n].shape)}, reference {list(p.shape)}")
    if failures:
        print("MISMATCH:\n  " + "\n  ".join(failures))
        return 1
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(state[n])
    before = {n: p.detach().clone() for n, p in model.named_parameters()}

    def compare(name, ours, ref, floor=1e-12, allow=None):
        """Records max |ours - ref| / max(max |ref|, floor); `allow` (elementwise, absolute) is
        subtracted from each difference first: rounding that no implementation can avoid."""
        if tuple(ours.shape) != tuple(ref.shape):
            failures.append(f"{name}: tapestry shape {list(ours.shape)}, reference {list(ref.shape)}")
            rows.append((name, float("inf")))
            return
        if allow is None:
            e = rel_err(ours.double(), ref.double(), floor)
        else:
            excess = ((ours.double() - ref.double()).abs() - allow).clamp(min=0)
            e = excess.max().item() / max(ref.abs().max().item(), floor) if ref.numel() else 0.0
        rows.append((name, e))
        if not e < TOL:  # also catches NaN
            failures.append(f"{name}: relative error {e:.3g} >= {TOL}")

    # The parameter groups tapestry's decay_parameters() / no_decay_parameters() gave, by name.
    decay, no_decay = decay_split(model)
    for key, ours_expected in (("decay_params", decay), ("no_decay_params", no_decay)):
        if key in meta:
            got = [s for s in meta[key].split(",") if s]
            if sorted(got) != sorted(ours_expected):
                failures.append(f"{key}: tapestry's group has extra {sorted(set(got) - set(ours_expected))} "
                                f"and lacks {sorted(set(ours_expected) - set(got))}")
        count_key = key.replace("_params", "_count")
        if count_key in meta and int(meta[count_key]) != len(ours_expected):
            failures.append(f"{count_key}: tapestry's group holds {meta[count_key]} tensors, expected "
                            f"{len(ours_expected)} (a tensor listed twice is stepped twice)")

    ids, targets = tensors["batch.ids"], tensors["batch.targets"]
    with torch.no_grad():
        logits = model(ids)
    compare("logits", tensors["out.logits"], logits)
    loss = model.loss(ids, targets)
    loss.backward()
    compare("loss", tensors["out.loss"], loss.detach())

    # Some gradients are zero in exact arithmetic: the key bias of every attention layer (adding
    # a constant to all keys shifts each query's scores by a constant, which softmax ignores),
    # and the position rows past the batch's length. Both sides then hold rounding noise (or
    # exact zeros), so gradients are measured against a floor of 1e-3 of the largest gradient
    # anywhere in the model rather than against their own size.
    grads1 = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    gmax1 = max(g.abs().max().item() for g in grads1.values())
    for n in names:
        compare("grad." + n, tensors["grad." + n], grads1[n], floor=1e-3 * gmax1)
    # Second order: H v at these weights (tests/hvp_dump.h), float32 on both sides.
    hv_rows, hv_failures = hvp_rows(model, tensors, lambda: model.loss(ids, targets), HVP_TOL)
    rows += hv_rows
    failures += hv_failures

    # AdamW with tapestry's two groups, stepped with tapestry's own gradients (checked above):
    # with the same gradients the two updates differ by float32 rounding only, even where a
    # gradient is rounding noise (Adam's first step moves every element by about lr * sign(g),
    # so noise would otherwise move by an arbitrary +-lr on either side). Exact zeros (the
    # unused position rows) move by the weight decay alone, which checks each group's decay.
    opt = torch.optim.AdamW(adamw_groups(model, wd), lr=lr, betas=betas, eps=eps)

    def step_with(prefix):
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.grad = tensors[prefix + n].clone()
        opt.step()

    # A step is compared as a move (after - before), relative to the largest move, about lr.
    # The weights are float32 on both sides, so each move carries the rounding of the weight
    # itself (an ulp of |p|, 1.2e-7 for LayerNorm weights near 1, already 1.2e-4 of lr = 1e-3):
    # 4 float32 epsilons of |p| per element are allowed on top of the relative tolerance.
    def allowance(*values):
        return 4 * torch.finfo(torch.float32).eps * torch.stack([v.abs().double() for v in values]).amax(0)

    def compare_moves(prefix, ours_start, ref_start):
        for n, p in model.named_parameters():
            compare(prefix + n, tensors[prefix + n] - ours_start[n], p.detach() - ref_start[n],
                    allow=allowance(ref_start[n], p.detach()))

    step_with("grad.")
    compare_moves("adamw.", before, before)

    # A second step, on the same batch with the moved weights, when the dump has one: it checks
    # the moment buffers and the bias corrections, which the first step barely touches.
    steps = 1
    if "out.loss2" in tensors:
        steps = 2
        after1 = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt.zero_grad()
        loss2 = model.loss(ids, targets)
        loss2.backward()
        compare("loss2", tensors["out.loss2"], loss2.detach())
        gmax2 = max(p.grad.abs().max().item() for p in model.parameters())
        for n, p in model.named_parameters():
            compare("grad2." + n, tensors["grad2." + n], p.grad, floor=1e-3 * gmax2)
        step_with("grad2.")
        compare_moves("adamw2.", {n: tensors["adamw." + n] for n in names}, after1)

    def worst(prefix):
        sel = [r for r in rows if r[0].startswith(prefix)]
        return max(sel, key=lambda r: r[1]) if sel else ("-", 0.0)

    parts = []
    for label, prefix in (("logits", "logits"), ("loss", "loss"), ("grad", "grad"), ("adamw", "adamw"),
                          ("hvp", "hvp")):
        name, e = worst(prefix)
        parts.append(f"{label} {e:.2e}" + (f" ({name})" if label in ("grad", "adamw", "hvp") else ""))
    print(f"gpt parity: {len(rows)} tensors compared, loss {loss.item():.6f}, {steps} AdamW step(s), "
          f"max rel err: " + ", ".join(parts))
    if verbose:
        for name, e in rows:
            print(f"  {name:50s} {e:.2e}")
    if failures:
        print("MISMATCH:\n  " + "\n  ".join(failures))
        return 1
    return 0


# ---------------------------------------------------------------- Hugging Face GPT-2 layout

def hf_random_gpt2(vocab, block, layers, heads, d, gen):
    """A random GPT-2 state in GPT2Model's names (no prefix), Conv1D weights [in, out].

    The scales are larger than GPT-2's 0.02 init on purpose: with 0.02 everywhere the attention
    is almost uniform and the MLP almost linear, so a loader that swapped q and k, forgot a
    transpose of a square weight, or used exact GELU would still match to 1e-4. These make
    each of those mistakes move the logits by far more (see mutation_check)."""
    def normal(*shape, std):
        return torch.randn(*shape, generator=gen) * std

    s = {"wte.weight": normal(vocab, d, std=0.5), "wpe.weight": normal(block, d, std=0.3)}
    for i in range(layers):
        p = f"h.{i}."
        s[p + "ln_1.weight"] = 1.0 + normal(d, std=0.2)
        s[p + "ln_1.bias"] = normal(d, std=0.1)
        s[p + "attn.c_attn.weight"] = normal(d, 3 * d, std=0.35)
        s[p + "attn.c_attn.bias"] = normal(3 * d, std=0.1)
        s[p + "attn.c_proj.weight"] = normal(d, d, std=0.2)
        s[p + "attn.c_proj.bias"] = normal(d, std=0.05)
        s[p + "ln_2.weight"] = 1.0 + normal(d, std=0.2)
        s[p + "ln_2.bias"] = normal(d, std=0.1)
        s[p + "mlp.c_fc.weight"] = normal(d, 4 * d, std=0.3)
        s[p + "mlp.c_fc.bias"] = normal(4 * d, std=0.1)
        s[p + "mlp.c_proj.weight"] = normal(4 * d, d, std=0.2)
        s[p + "mlp.c_proj.bias"] = normal(d, std=0.05)
        # The buffers older transformers versions saved: the causal mask and the fill value.
        s[p + "attn.bias"] = torch.tril(torch.ones(block, block)).view(1, 1, block, block)
        s[p + "attn.masked_bias"] = torch.tensor(-1e4)
    s["ln_f.weight"] = 1.0 + normal(d, std=0.2)
    s["ln_f.bias"] = normal(d, std=0.1)
    return s


def gelu_new(x):
    """GPT-2's GELU: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def gpt2_hf_forward(s, n_head, ids, eps=1e-5, mutation=None):
    """GPT-2's forward over the checkpoint tensors s (GPT2Model names), Conv1D math
    (y = x W + b, W [in, out]) and the fused c_attn split into q, k, v column thirds.
    Returns logits [B, T, V] = ln_f(x) wte^T. `mutation` names a deliberate loader mistake,
    for mutation_check."""
    m = mutation
    B, T = ids.shape
    V, D = s["wte.weight"].shape
    K = D // n_head
    layers = len([k for k in s if k.startswith("h.") and k.endswith(".ln_1.weight")])
    conv1d = lambda x, w, b: x @ w + b
    x = s["wte.weight"][ids] + s["wpe.weight"][torch.arange(T)]
    for i in range(layers):
        p = f"h.{i}."
        ln1, ln2 = ("ln_2", "ln_1") if m == "swap_ln" else ("ln_1", "ln_2")
        h = F.layer_norm(x, (D,), s[p + ln1 + ".weight"], s[p + ln1 + ".bias"], eps)
        qkv = conv1d(h, s[p + "attn.c_attn.weight"], s[p + "attn.c_attn.bias"])
        q, k, v = qkv.split(D, dim=-1)
        if m == "swap_qk":
            q, k = k, q
        if m == "swap_kv":
            k, v = v, k
        if m == "heads_interleaved":  # split the features as [K, H] instead of [H, K]
            split = lambda t: t.view(B, T, K, n_head).permute(0, 3, 1, 2)
        else:
            split = lambda t: t.view(B, T, n_head, K).transpose(1, 2)
        q, k, v = split(q), split(k), split(v)
        scores = q @ k.transpose(-2, -1) / math.sqrt(K)
        if m != "no_causal":
            scores = scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        a = (F.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, D)
        w_proj = s[p + "attn.c_proj.weight"]
        x = x + conv1d(a, w_proj.t() if m == "transpose_attn_proj" else w_proj, s[p + "attn.c_proj.bias"])
        h = F.layer_norm(x, (D,), s[p + ln2 + ".weight"], s[p + ln2 + ".bias"], eps)
        f = conv1d(h, s[p + "mlp.c_fc.weight"], s[p + "mlp.c_fc.bias"])
        f = F.gelu(f) if m == "gelu_erf" else gelu_new(f)
        x = x + conv1d(f, s[p + "mlp.c_proj.weight"], s[p + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (D,), s["ln_f.weight"], s["ln_f.bias"], eps)
    return x @ s["wte.weight"].t()


MUTATION_MARGIN = 1e-3
MUTATIONS = ("swap_qk", "swap_kv", "heads_interleaved", "no_causal", "transpose_attn_proj", "gelu_erf", "swap_ln")


def mutation_check(s, n_head, ids, logits):
    """The largest logit change each plausible loader mistake causes: {mutation: max diff}.
    write_hf requires every one to exceed MUTATION_MARGIN, 10x the C++ check's 1e-4, so
    that the test file tells each mistake apart from rounding."""
    return {m: (gpt2_hf_forward(s, n_head, ids, mutation=m) - logits).abs().max().item() for m in MUTATIONS}


def hf_to_tapestry(s, n_head, eps=1e-5):
    """The same weights in the tapestry model's names (q, k, v from the column thirds, Conv1D
    transposed to Linear's [out, in]); used to cross-check the two forwards."""
    V, D = s["wte.weight"].shape
    layers = len([k for k in s if k.startswith("h.") and k.endswith(".ln_1.weight")])
    c = dict(vocab=V, block_size=s["wpe.weight"].shape[0], layers=layers, heads=n_head, d_model=D, d_ff=0,
             dropout=0.0, ln_eps=eps, gelu_tanh=True)
    t = {"wte.weight": s["wte.weight"], "wpe.weight": s["wpe.weight"],
         "ln_f.weight": s["ln_f.weight"], "ln_f.bias": s["ln_f.bias"]}
    for i in range(layers):
        p, q = f"h.{i}.", f"blocks.{i}."
        for ln in ("ln_1", "ln_2"):
            t[q + ln + ".weight"], t[q + ln + ".bias"] = s[p + ln + ".weight"], s[p + ln + ".bias"]
        w, b = s[p + "attn.c_attn.weight"], s[p + "attn.c_attn.bias"]
        for j, name in enumerate(("w_q", "w_k", "w_v")):
            t[q + f"attn.{name}.weight"] = w[:, j * D:(j + 1) * D].t()
            t[q + f"attn.{name}.bias"] = b[j * D:(j + 1) * D]
        t[q + "attn.w_o.weight"], t[q + "attn.w_o.bias"] = s[p + "attn.c_proj.weight"].t(), s[p + "attn.c_proj.bias"]
        t[q + "mlp.fc.weight"], t[q + "mlp.fc.bias"] = s[p + "mlp.c_fc.weight"].t(), s[p + "mlp.c_fc.bias"]
        t[q + "mlp.proj.weight"], t[q + "mlp.proj.bias"] = s[p + "mlp.c_proj.weight"].t(), s[p + "mlp.c_proj.bias"]
    model = GPT(c)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(t[n])
    return model.eval()


def write_hf(out, no_prefix, seed, vocab=50, block=32, layers=2, heads=4, d=32):
    gen = torch.Generator().manual_seed(seed)
    s = hf_random_gpt2(vocab, block, layers, heads, d, gen)
    ids = torch.randint(0, vocab, (2, 9), generator=gen)
    with torch.no_grad():
        # The expected logits in float64 from the float32 weights (exact there), rounded once to
        # float32: a float32 implementation then differs from them by its own rounding only.
        s64 = {k: v.double() for k, v in s.items()}
        logits = gpt2_hf_forward(s64, heads, ids)
        # Two independent forwards must agree: the Conv1D one above and the tapestry-named
        # model (float32) with the weights converted, which is what load_gpt2_hf has to do.
        other = hf_to_tapestry(s, heads)(ids)
        agree = (other.double() - logits).abs().max().item()
        if agree > 1e-5 * max(1.0, logits.abs().max().item()):  # float32 rounding only
            raise SystemExit(f"gpt_ref write-hf: the two forwards differ by {agree:.3g}")
        effects = mutation_check(s64, heads, ids, logits)
        weak = {m: e for m, e in effects.items() if not e > MUTATION_MARGIN}
        if weak:
            raise SystemExit(f"gpt_ref write-hf: the random weights cannot detect these loader mistakes: {weak}")
    prefix = "" if no_prefix else "transformer."
    tensors = {prefix + k: v for k, v in s.items()}
    if not no_prefix:
        tensors["lm_head.weight"] = s["wte.weight"].clone()  # tied: the same values
    tensors["test.input_ids"] = ids
    tensors["test.logits"] = logits.float().contiguous()
    meta = {"n_head": str(heads), "n_layer": str(layers), "n_embd": str(d), "n_positions": str(block),
            "vocab_size": str(vocab), "activation_function": "gelu_new",
            "layout": "GPT2Model" if no_prefix else "GPT2LMHeadModel", "format": "pt"}
    save_safetensors(out, tensors, meta)
    print(f"gpt_ref write-hf: wrote {out} ({meta['layout']}: V {vocab}, block {block}, {layers} layers, "
          f"{heads} heads, D {d}; logits |max| {logits.abs().max().item():.3f}; forwards agree to {agree:.1e}; "
          f"the subtlest loader mistake, {min(effects, key=effects.get)}, moves them by {min(effects.values()):.1e})")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="check a gpt_parity_dump file against PyTorch")
    c.add_argument("dump")
    c.add_argument("--verbose", action="store_true", help="print every tensor's error")
    w = sub.add_parser("write-hf", help="write a small random GPT-2 in Hugging Face's layout")
    w.add_argument("out")
    w.add_argument("--no-prefix", action="store_true", help="GPT2Model keys: no 'transformer.', no lm_head")
    w.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.cmd == "check":
        return check(a.dump, a.verbose)
    return write_hf(a.out, a.no_prefix, a.seed)


if __name__ == "__main__":
    sys.exit(main())
