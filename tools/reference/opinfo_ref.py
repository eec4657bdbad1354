#!/usr/bin/env python3
"""Differential test of tapestry against PyTorch: replays an opinfo_dump file.

    /usr/bin/python3 tools/reference/opinfo_ref.py DUMP.safetensors [-v]

DUMP is written by the opinfo_dump test program (tests/opinfo_dump.cpp): for every sample of the
OpInfo table (tests/opinfo.cpp) and every random op program, the inputs (with their strides and
storage offsets), the PyTorch expression, and what tapestry did: the error it threw, or its
outputs, the random upstream gradients and the input gradients. For each case this script
rebuilds the inputs in the same memory layout (transposed, step-sliced, expanded), evaluates the
expression, and checks
  - error parity: PyTorch raises exactly where tapestry threw (and where the table says it does);
  - the forward values: dtype and shape equal, NaN == NaN, infinities equal, float64 within
    atol 1e-9 + rtol 1e-7, float32 within 1e-5 + 1e-5, integers and bools exactly;
  - the gradients: one backward of sum_j <out_j, gout_j> with tapestry's upstream gradients,
    compared input by input (no gradient = zeros), with the same tolerances;
  - the second-order gradients: d <grads, u> / d inputs for tapestry's random directions u, from
    a backward with create_graph on both sides (torch.autograd.grad), with the same tolerances.
One line per mismatch, then "opinfo: N cases, M mismatches"; exit status 1 on any mismatch.
Deliberate differences are listed in ALLOWLIST (by op name, or "op:sample") with the reason,
and printed as "documented difference: ..." instead of counting as mismatches.
"""
import json
import math
import sys
import warnings

import torch
import torch.nn.functional as F

from safetensors_file import load_safetensors

TOLERANCES = {torch.float64: (1e-9, 1e-7), torch.float32: (1e-5, 1e-5)}  # (atol, rtol)

# Where tapestry differs from PyTorch on purpose. Keys: an op name of the table, or "op:sample".
ALLOWLIST = {
    "add_dtype_mismatch":
        "tapestry has no type promotion: binary ops refuse mixed dtypes, where PyTorch promotes "
        "float32 to float64",
    "clamp_min_gt_max":
        "tapestry refuses clamp with min > max; PyTorch returns max everywhere",
    "masked_fill_broadcast_input":
        "tapestry's masked_fill keeps the input's shape (the mask must broadcast to it); PyTorch's "
        "out-of-place masked_fill also broadcasts the input up to the mask",
    "cross_entropy_smoothing_torch":
        "tapestry's label smoothing is the Transformer paper's (1 - eps on the gold class, eps "
        "spread over the other classes except ignore_index); PyTorch mixes in a uniform "
        "distribution over all classes. The paper's form is checked against paper_ce instead",
    "cross_entropy_all_ignored":
        "a mean over zero counted rows is 0 in tapestry (autograd/functions.h says so), NaN in PyTorch",
    "cross_entropy_empty_batch":
        "a mean over zero rows is 0 in tapestry (autograd/functions.h says so), NaN in PyTorch",
    "cross_entropy_ignore_index:[1, 3]":
        "every row ignored: a mean over zero counted rows is 0 in tapestry, NaN in PyTorch",
}

# PyTorch 1.13 computes scatter's src gradient in the index's shape and then rejects it when src
# is larger than the index; tapestry pads it with zeros to src's shape (gradcheck confirms it).
SCATTER_GRADIENT_REASON = (
    "PyTorch 1.13's scatter backward returns src's gradient in the index's shape and then raises "
    "when src is larger than the index; tapestry's is zero-padded to src's shape (gradchecked)")
for _op in ("scatter_dim0", "scatter_dim-1", "scatter_add_dim0", "scatter_add_dim1"):
    for _sample in ("src larger than index [3, 5]", "index [1, 2]"):
        ALLOWLIST[f"{_op}:{_sample}"] = SCATTER_GRADIENT_REASON

VAR_GRADIENT_REASON = (
    "the gradient of var where it is not finite: with inf/NaN inputs or N <= correction, tapestry's "
    "composite backward gives NaN where PyTorch's var_backward gives +-inf or (for N < correction) a "
    "finite value from the divisor N - correction that its own forward clamps at 0")


INT_PROMOTION_REASON = (
    "tapestry does not promote integers to float (docs/coming-from-pytorch.md, Dtypes): logsumexp of an int64 "
    "tensor is an Error; PyTorch promotes it")
for _op in ("logsumexp_dim1", "logsumexp_dim0_keepdim"):
    ALLOWLIST[f"{_op}:int64 [3, 4]"] = INT_PROMOTION_REASON
for _op in ("smooth_l1_loss", "huber_loss"):
    ALLOWLIST[f"{_op}:inf and NaN"] = (
        "the gradient where input - target is NaN (inf - inf, or a NaN operand): PyTorch's fused backward gives NaN, "
        "tapestry's composite gives 0 there (the gradient of abs at NaN, as PyTorch's abs); at an infinite "
        "difference both give the sign")
ALLOWLIST["logsumexp_dim1:float64 rows at 1e300"] = (
    "PyTorch's backward is exp(a - logsumexp(a)); at 1e300 the log 2 of two tied maxima rounds away, so each "
    "gets weight 1 instead of 1/2; tapestry's gradient is the softmax of the shifted row (1/2 each)")
ALLOWLIST["logsumexp_dim1:float32 near 1e4"] = (
    "PyTorch's float32 backward exp(a - logsumexp(a)) subtracts numbers near 1e4 (spacing 1e-3), a relative "
    "error of 1e-3 in the weights; tapestry shifts by the exact max, so its weights keep float32's relative precision")


ALLOWLIST["gelu_backward:float32 [2, 3] and [3]"] = (
    "PyTorch 1.13's CPU gelu_backward sends float32 to oneDNN, which fails on broadcast operands ('could not "
    "create a primitive descriptor for a reorder primitive'); tapestry broadcasts them, as the float64 samples "
    "(which agree with PyTorch) do")
SECOND_ORDER_NONFINITE_REASON = (
    "second derivatives at infinite or NaN inputs: both sides are non-finite there, and which of inf and NaN a "
    "formula reaches depends on how it is written")
SECOND_ORDER_BRANCH_REASON = (
    "softplus at beta x == threshold exactly, its branch point: PyTorch's double backward takes the linear "
    "branch's 0 there, tapestry's the smooth branch's sigmoid derivative (its first derivative agrees)")


def documented_reason(op, sample, problem):
    """The documented reason for a difference, or None."""
    reason = ALLOWLIST.get(f"{op}:{sample}", ALLOWLIST.get(op))
    if reason:
        return reason
    if problem.startswith("second-order") and sample.startswith("inf and NaN"):
        return SECOND_ORDER_NONFINITE_REASON
    if problem.startswith("second-order") and op.startswith("softplus") and sample == "at the kinks":
        return SECOND_ORDER_BRANCH_REASON
    degenerate = sample in ("0-d",) or sample.startswith("inf and NaN") or op == "var_correction_exceeds_count"
    if op.startswith("var") and degenerate and problem.startswith("gradient of"):
        return VAR_GRADIENT_REASON
    return None


def sdpa_ref(q, k, v, mask=None, is_causal=False, scale=None):
    """tapestry's scaled_dot_product_attention (autograd/functions.h) as its composite: masked
    scores (where the bool mask is false, as PyTorch 2's attn_mask means, or by causality, key
    j > query i) become -1e9 rather than -inf, so a fully masked row attends evenly instead of
    giving NaN. PyTorch 1.13 has no F.scaled_dot_product_attention; 2.x's uses -inf."""
    if q.dim() < 2 or k.dim() != q.dim() or v.dim() != q.dim() or k.shape[:-2] != q.shape[:-2] \
            or v.shape[:-2] != q.shape[:-2] or k.size(-2) != v.size(-2):
        raise ValueError(f"sdpa_ref: q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)} do not fit")
    if scale is None:
        scale = 1.0 / math.sqrt(max(q.size(-1), 1))
    scores = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        if mask.dtype != torch.bool:
            raise TypeError(f"sdpa_ref: attn_mask must be bool, got {mask.dtype}")
        scores = scores.masked_fill(~mask, -1e9)
    if is_causal:
        future = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, -1e9)
    return torch.softmax(scores, -1) @ v


def rms_norm_ref(x, normalized_shape, weight=None, eps=None):
    """torch.nn.functional.rms_norm of PyTorch 2.4 (absent from 1.13), with its shape checks:
    x / sqrt(mean(x^2) over the trailing dims + eps) * weight; eps defaults to the dtype's epsilon."""
    k = len(normalized_shape)
    if k < 1 or k > x.dim() or list(x.shape[x.dim() - k:]) != list(normalized_shape):
        raise RuntimeError(f"rms_norm_ref: normalized_shape {normalized_shape} does not end {list(x.shape)}")
    if weight is not None and list(weight.shape) != list(normalized_shape):
        raise RuntimeError(f"rms_norm_ref: weight {list(weight.shape)} is not {normalized_shape}")
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    dims = list(range(x.dim() - k, x.dim()))
    y = x * torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + eps)
    return y * weight if weight is not None else y


def rope_ref(x, cos, sin):
    """tapestry's rotary_embedding as Hugging Face's Llama writes it: cos and sin hold one angle
    per pair, [..., D/2], repeated for both halves; rotate_half(x) = cat(-x2, x1)."""
    if x.dim() < 1 or x.size(-1) % 2 or cos.shape != sin.shape or cos.dim() < 1 or cos.size(-1) != x.size(-1) // 2:
        raise RuntimeError(f"rope_ref: x {list(x.shape)}, cos {list(cos.shape)}, sin {list(sin.shape)} do not fit")
    if not (x.dtype == cos.dtype == sin.dtype):
        raise TypeError(f"rope_ref: x {x.dtype}, cos {cos.dtype} and sin {sin.dtype} must share one dtype")
    if torch.broadcast_shapes(x.shape[:-1] + (x.size(-1) // 2,), cos.shape) != x.shape[:-1] + (x.size(-1) // 2,):
        raise RuntimeError(f"rope_ref: cos {list(cos.shape)} does not broadcast to x {list(x.shape)}")
    x1, x2 = x.chunk(2, -1) if x.size(-1) else (x, x)
    return x * torch.cat([cos, cos], -1) + torch.cat([-x2, x1], -1) * torch.cat([sin, sin], -1)


def paper_ce(logits, target, eps=0.0, ignore_index=-100, reduction="mean"):
    """tapestry's cross_entropy (ops/cpu/loss.cpp): label smoothing as the Transformer paper uses it.

    The target distribution q puts 1 - eps on the gold class, 0 on ignore_index when it is a
    class, and spreads eps evenly over the remaining classes; rows whose target is ignore_index
    carry no loss. "mean" divides by the number of counted rows (no rows: a loss of 0)."""
    if logits.dim() != 2:
        raise ValueError(f"paper_ce: logits must be [N, C], got {list(logits.shape)}")
    if target.dtype != torch.int64 or target.dim() != 1 or target.size(0) != logits.size(0):
        raise ValueError(f"paper_ce: target {list(target.shape)} does not match logits {list(logits.shape)}")
    n, v = logits.shape
    keep = target != ignore_index
    bad = keep & ((target < 0) | (target >= v))
    if bool(bad.any()):
        raise IndexError(f"Target {int(target[bad][0])} is out of bounds.")
    pad_is_class = 0 <= ignore_index < v
    spread = v - 1 - (1 if pad_is_class else 0)
    other = eps / spread if spread > 0 else 0.0
    lp = F.log_softmax(logits, dim=-1)
    q = torch.full_like(lp, other)
    gold = torch.where(keep, target, torch.zeros_like(target))
    q.scatter_(1, gold.unsqueeze(1), 1.0 - eps)
    if pad_is_class:
        q[:, ignore_index] = 0.0
    terms = torch.where(q > 0, q * lp, torch.zeros_like(lp))  # 0 * -inf counts as 0
    rows = torch.where(keep, -terms.sum(-1), torch.zeros(n, dtype=lp.dtype))
    total = rows.sum()
    if reduction == "sum":
        return total
    count = int(keep.sum())
    return total / count if count > 0 else total * 0.0


def restride(values, strides, offset):
    """The values laid out with tapestry's strides and storage offset (a view of a fresh buffer)."""
    shape = list(values.shape)
    if values.numel() == 0:
        return values.clone()
    span = offset + sum((s - 1) * st for s, st in zip(shape, strides)) + 1
    base = torch.zeros(span, dtype=values.dtype)
    idx = torch.tensor(offset, dtype=torch.int64)
    for s, st in zip(shape, strides):
        idx = idx.unsqueeze(-1) + torch.arange(s, dtype=torch.int64) * st
    base[idx.reshape(-1)] = values.reshape(-1)  # expanded elements: the same value, written again
    return base.as_strided(shape, strides, offset)


def as_list(result):
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (tuple, list)):  # split/chunk, and max/min's (values, indices)
        return list(result)
    raise TypeError(f"the expression gave a {type(result).__name__}, not tensors")


def compare(ours, ref):
    """None when `ours` matches `ref`, else what differs (with the largest difference)."""
    ref = ref.detach()
    if ours.dtype != ref.dtype:
        return f"dtype {ours.dtype} vs PyTorch {ref.dtype}"
    if list(ours.shape) != list(ref.shape):
        return f"shape {list(ours.shape)} vs PyTorch {list(ref.shape)}"
    if ours.numel() == 0:
        return None
    if ours.dtype.is_floating_point:
        atol, rtol = TOLERANCES[ours.dtype]
        a, b = ours.double(), ref.double()
        ok = (a == b) | (a.isnan() & b.isnan()) | ((a - b).abs() <= atol + rtol * b.abs())
        if bool(ok.all()):
            return None
        diff = (a - b).abs()[~ok]
        worst = float(torch.where(diff.isnan(), torch.full_like(diff, math.inf), diff).max())
        first = int((~ok).reshape(-1).nonzero()[0])
        return (f"max difference {worst:.3g} ({int((~ok).sum())} of {ours.numel()} elements; first at flat index "
                f"{first}: {a.reshape(-1)[first].item()!r} vs PyTorch {b.reshape(-1)[first].item()!r})")
    same = ours == ref
    if bool(same.all()):
        return None
    first = int((~same).reshape(-1).nonzero()[0])
    worst = "" if ours.dtype == torch.bool else f"max difference {int((ours - ref).abs().max())}; "
    return (f"{worst}{int((~same).sum())} of {ours.numel()} elements differ; first at flat index {first}: "
            f"{ours.reshape(-1)[first].item()!r} vs PyTorch {ref.reshape(-1)[first].item()!r}")


def leaves_and_env(c, tensors):
    """The case's inputs as fresh tensors in tapestry's layout (leaves that require grad where
    tapestry's did), and the names its expression reads."""
    inputs = []
    for spec in c["inputs"]:
        x = restride(tensors[spec["tensor"]], spec["strides"], spec["offset"]).detach()
        if spec["grad"]:
            x.requires_grad_()
        inputs.append(x)
    env = {"torch": torch, "F": F, "math": math, "inf": math.inf, "nan": math.nan, "paper_ce": paper_ce, "sdpa_ref": sdpa_ref,
           "rms_norm_ref": rms_norm_ref, "rope_ref": rope_ref,
           "L": list(inputs)}
    for spec, x in zip(c["inputs"], inputs):
        env[spec["name"]] = x
    return inputs, env


def second_order_problems(c, tensors):
    """d <J^T gout, u> / d inputs (tapestry's RunResult::grads2) against PyTorch's create_graph."""
    grads2 = c.get("grads2") or []
    if c.get("backward2_error"):
        return [f"tapestry's second-order backward threw: {c['backward2_error']}"]
    if not any(grads2):
        return []
    inputs, env = leaves_and_env(c, tensors)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outs = as_list(eval(c["expr"], env))  # noqa: S307 (our own expressions)
    used = [(outs[j], tensors[g]) for j, g in enumerate(c["gouts"]) if g is not None and outs[j].requires_grad]
    diff = [i for i, spec in enumerate(c["inputs"]) if spec["grad"]]
    xs = [inputs[i] for i in diff]
    first = [None] * len(xs)
    if used:
        first = torch.autograd.grad([o for o, _ in used], xs, [w for _, w in used], create_graph=True,
                                    allow_unused=True)
    s = None
    for k, i in enumerate(diff):
        if first[k] is None or not first[k].requires_grad or c["dirs"][i] is None:
            continue
        term = (first[k] * tensors[c["dirs"][i]]).sum()
        s = term if s is None else s + term
    second = [None] * len(xs)
    if s is not None:
        second = torch.autograd.grad(s, xs, allow_unused=True)
    problems = []
    for k, i in enumerate(diff):
        if grads2[i] is None:
            problems.append(f"tapestry recorded no second-order gradient for input {i}")
            continue
        ref = second[k] if second[k] is not None else torch.zeros_like(xs[k])
        msg = compare(tensors[grads2[i]], ref.detach())
        if msg:
            problems.append(f"second-order gradient of {c['inputs'][i]['name']}: {msg}")
    return problems


def check_case(c, tensors):
    """The list of problems of one case (empty when tapestry and PyTorch agree)."""
    inputs, env = leaves_and_env(c, tensors)

    outs, torch_error = None, None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            outs = as_list(eval(c["expr"], env))  # noqa: S307 (our own expressions)
    except Exception as e:  # pylint: disable=broad-except
        torch_error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"

    problems = []
    ours_error = c["error"]
    if c.get("foreign_error"):
        problems.append(f"tapestry threw something other than a tapestry::Error: {ours_error}")
    if c["kind"] == "table" and bool(c["expect_error"]) != (torch_error is not None):
        problems.append("the table marks this sample as " + ("an error sample" if c["expect_error"] else "valid") +
                        ", but PyTorch " + (f"raises ({torch_error})" if torch_error else "does not raise"))
    if (ours_error is not None) != (torch_error is not None):
        problems.append("error parity: tapestry " + (f"threw ({ours_error})" if ours_error else "did not throw") +
                        ", PyTorch " + (f"raised ({torch_error})" if torch_error else "did not raise"))
        return problems
    if ours_error is not None:
        return problems  # both raised

    # ---- forward
    if len(outs) != len(c["outputs"]):
        problems.append(f"{len(c['outputs'])} outputs vs PyTorch {len(outs)}")
        return problems
    for j, (name, ref) in enumerate(zip(c["outputs"], outs)):
        msg = compare(tensors[name], ref)
        if msg:
            problems.append(f"output {j}: {msg}")

    # ---- backward
    if c["backward_error"]:
        problems.append(f"tapestry's backward threw: {c['backward_error']}")
        return problems
    if not any(spec["grad"] for spec in c["inputs"]):
        return problems
    total = None
    for j, gname in enumerate(c["gouts"]):
        if gname is None or not outs[j].requires_grad:
            continue
        term = (outs[j] * tensors[gname]).sum()
        total = term if total is None else total + term
    if total is not None:
        try:
            total.backward()
        except Exception as e:  # pylint: disable=broad-except
            problems.append(f"PyTorch's backward raised {type(e).__name__}: {e}")
            return problems
    for i, (spec, gname) in enumerate(zip(c["inputs"], c["grads"])):
        if not spec["grad"]:
            continue
        if gname is None:
            problems.append(f"tapestry recorded no gradient for input {i} ({spec['name']})")
            continue
        x = inputs[i]
        ref = x.grad if x.grad is not None else torch.zeros_like(x)
        msg = compare(tensors[gname], ref)
        if msg:
            problems.append(f"gradient of {spec['name']}: {msg}")
    if not problems:
        try:
            problems += second_order_problems(c, tensors)
        except Exception as e:  # pylint: disable=broad-except
            problems.append(f"PyTorch's second-order backward raised {type(e).__name__}: {str(e).splitlines()[0]}")
    return problems


def main(argv):
    args = [a for a in argv[1:] if a != "-v"]
    verbose = "-v" in argv[1:]
    if len(args) != 1:
        print(__doc__)
        return 2
    tensors, meta = load_safetensors(args[0])
    doc = json.loads(meta["opinfo"])
    cases = doc["cases"]
    torch.set_grad_enabled(True)

    mismatches, documented, both_raise = 0, 0, 0
    failing_ops = {}
    for c in cases:
        problems = check_case(c, tensors)
        if c["error"] is not None and not problems:
            both_raise += 1
        if not problems:
            continue
        op, sample = c["op"], c["sample"]
        for p in problems:
            reason = documented_reason(op, sample, p)
            where = f"{c['id']} {op} [{sample}]: {c['expr']}"
            if reason:
                documented += 1
                print(f"documented difference: {where}: {p} -- {reason}")
            else:
                mismatches += 1
                failing_ops[op] = failing_ops.get(op, 0) + 1
                print(f"MISMATCH {where}: {p}")

    n_table = sum(1 for c in cases if c["kind"] == "table")
    n_ops = len({c["op"] for c in cases if c["kind"] == "table"})
    print(f"opinfo: seed {doc.get('seed')}: {n_table} table cases of {n_ops} ops, {len(cases) - n_table} random "
          f"programs; {both_raise} cases raise in both; {documented} documented differences")
    if verbose and failing_ops:
        print("mismatches per op: " + ", ".join(f"{k} {v}" for k, v in sorted(failing_ops.items())))
    print(f"opinfo: {len(cases)} cases, {mismatches} mismatches")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
