#!/usr/bin/env python3
"""The `tapestry bench` workloads in PyTorch, written the plain way a PyTorch user would.

    /usr/bin/python3 tools/reference/bench_torch.py --workload small --threads 2 [--json] [--device cuda]

--workload vit is the Vision Transformer of tools/reference/vit_ref.py (config fmnist) on random images.

Same model (tools/reference/transformer_ref.py: nn.Linear, nn.LayerNorm, F.softmax), same
sizes, dropout 0.1, F.cross_entropy with label_smoothing=0.1, torch.optim.Adam, synthetic
tokens. Greedy decoding is the Annotated Transformer's loop, which re-decodes the whole prefix
for every new token (PyTorch's nn modules have no KV cache). Run with OMP_WAIT_POLICY=PASSIVE
or ACTIVE set in the environment: tools/bench-compare.sh picks the faster one and says which.
--device cuda runs the same workload on a GPU (PyTorch eager, float32, TF32 off unless --tf32),
waiting for the device at the end of every timed call, as `tapestry bench --device cuda` does, and
counts one more step's kernel launches (torch.profiler) and synchronisations (CUDA sync debug mode).
--precision bf16 runs each train step's forward and loss under torch.autocast(DEVICE,
dtype=torch.bfloat16), PyTorch's own mixed precision, beside `tapestry bench --precision bf16`.
--tf32 sets torch.backends.cuda.matmul.allow_tf32, beside `tapestry bench --tf32`.
"""
import argparse
import json
import os
import resource
import statistics
import sys
import contextlib
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from transformer_ref import Transformer  # noqa: E402
from vit_ref import CONFIGS as VIT_CONFIGS, ViT, decay_split  # noqa: E402

WORKLOADS = {  # d_model, enc, dec, heads, d_ff, vocab, batch, src_len, tgt_len
    "copy": (512, 2, 2, 8, 2048, 11, 80, 10, 10),
    "small": (256, 3, 3, 8, 1024, 8000, 64, 32, 32),
    "base": (512, 6, 6, 8, 2048, 37000, 32, 32, 32),
}


def forward_flops(d, le, ld, f, v, b, s, t):
    enc = 4 * 2 * b * s * d * d + 2 * 2 * b * s * s * d + 2 * 2 * b * s * d * f
    dec = (4 * 2 * b * t * d * d + 2 * 2 * b * t * t * d + 2 * 2 * b * t * d * d + 2 * 2 * b * s * d * d
           + 2 * 2 * b * t * s * d + 2 * 2 * b * t * d * f)
    return le * enc + ld * dec + 2 * b * t * d * v


def vit_bench(a, dev, wait):
    """`tapestry bench --workload vit`: config fmnist, batch 128 of random 28x28 images, AdamW
    (lr 1e-3, weight decay 0.05 on matrices), the loss read every step."""
    p, stride, layers, heads, d, ff = VIT_CONFIGS["fmnist"]
    c = dict(image_size=28, channels=1, patch_size=p, patch_stride=stride, classes=10, d_model=d, layers=layers,
             heads=heads, d_ff=ff, ln_eps=1e-5, activation="gelu")
    model = ViT(c).to(dev)
    model.init_weights()
    decay, no_decay = decay_split(model)
    params = dict(model.named_parameters())
    opt = torch.optim.AdamW([{"params": [params[n] for n in decay], "weight_decay": 0.05},
                             {"params": [params[n] for n in no_decay], "weight_decay": 0.0}], lr=1e-3)
    g = torch.Generator().manual_seed(42)
    b = 128
    x = torch.rand(b, 1, 28, 28, generator=g).to(dev)
    y = torch.randint(0, 10, (b,), generator=g).to(dev)
    train_ms = []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        with autocast(a):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        loss.item()
        wait()
        if i >= a.warmup:
            train_ms.append((time.perf_counter() - t0) * 1000)
    step = statistics.median(train_ms)
    return {
        "impl": "torch", "precision": a.precision, "device": a.device, "workload": "vit", "threads": a.threads,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", "detected"),
        "train_ms_median": step, "train_ms_min": min(train_ms), "train_ms_max": max(train_ms),
        "images_per_s": b / (step / 1000),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "params": sum(p.numel() for p in model.parameters()),
    }


def dev_type(name):
    return torch.device(name).type


def autocast(a):
    """The train step's forward context: PyTorch's autocast to bfloat16 on the bench's device, or nothing."""
    if a.precision == "bf16":
        return torch.autocast(dev_type(a.device), dtype=torch.bfloat16)
    return contextlib.nullcontext()


def gemm_name(a):
    """What runs the float32 matmuls, as tapestry bench's "gemm" field names it."""
    if dev_type(a.device) == "cuda":
        return "cublas-bf16" if a.precision == "bf16" else ("cublas-tf32" if a.tf32 else "cublas-fp32")
    return "torch-cpu" + ("+bf16" if a.precision == "bf16" else "")


def count_step(step, dev):
    """One more call of step() on a GPU: its kernel launches (torch.profiler's CUDA kernels, copies
    and fills) and the synchronisations CUDA's sync debug mode reports."""
    import warnings
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize(dev)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize(dev)
    launches = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step()
    torch.cuda.set_sync_debug_mode("default")
    syncs = sum(1 for w in caught if "synchroniz" in str(w.message))
    return syncs, launches


def composite_sdpa(q, k, v, is_causal):
    """softmax(q k^T / sqrt(d), causal) v in plain ops, where torch has no fused attention (1.13)."""
    t = q.shape[-2]
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    s = s.masked_fill(torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return s.softmax(-1) @ v


def attention_bench(a, dev, wait):
    """torch's F.scaled_dot_product_attention as `tapestry bench --workload attention` times it:
    causal, head size 64, 8 heads, lengths 256, 1024, 4096 (batch 8, 4, 1), forward and
    forward + backward; one line per length."""
    for t, b in ((256, 8), (1024, 4), (4096, 1)):
        g = torch.Generator().manual_seed(7)
        q, k, v, dout = (torch.randn(b, 8, t, 64, generator=g).to(dev) for _ in range(4))
        for x in (q, k, v):
            x.requires_grad_()
        runs = max(3, a.steps // 2)
        sdpa = getattr(F, "scaled_dot_product_attention", None) or composite_sdpa  # torch 2 / Debian's 1.13

        def timed(f):
            ms = []
            for i in range(runs + 1):
                t0 = time.perf_counter()
                f()
                wait()
                if i >= 1:
                    ms.append((time.perf_counter() - t0) * 1000)
            return statistics.median(ms)

        def forward():
            with torch.no_grad():
                sdpa(q, k, v, is_causal=True)

        def both():
            (sdpa(q, k, v, is_causal=True) * dout).sum().backward()

        fwd, fb = timed(forward), timed(both)
        r = {"impl": "torch", "workload": "attention", "device": a.device, "attention": "sdpa" if sdpa is not composite_sdpa else "composite", "batch": b,
             "heads": 8, "seq": t, "head_dim": 64, "forward_ms": fwd, "forward_backward_ms": fb,
             "forward_tflops": 4.0 * b * 8 * t * t * 64 / 2 / (fwd * 1e9)}
        print(json.dumps(r) if a.json else f"attention (torch sdpa) batch {b}, 8 heads, {t} x 64, causal: "
              f"forward {fwd:.3f} ms, forward + backward {fb:.3f} ms")


def layouts(a):
    """x @ W.t() with W stored [out, in], as nn.Linear multiplies: median microseconds (GFLOP/s)."""
    shapes = [(256, 8000), (256, 256), (256, 1024), (1024, 256)]
    print(f"x @ W.t(), {a.threads} threads, torch {torch.__version__}: microseconds (GFLOP/s)")
    with torch.no_grad():
        for rows in (8, 32, 64, 256, 2048):
            cells = []
            for i, o in shapes:
                x, w = torch.randn(rows, i), torch.randn(o, i)
                times = []
                reps = 5 if rows >= 2048 else 50
                for r in range(reps + 3):
                    t0 = time.perf_counter()
                    x @ w.t()
                    if r >= 3:
                        times.append(time.perf_counter() - t0)
                us = 1e6 * statistics.median(times)
                cells.append(f"{i:4d}->{o:<4d} {us:7.1f} ({2 * rows * i * o / us / 1e3:3.0f})")
            print(f"rows {rows:5d}  " + "  ".join(cells))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="small", choices=list(WORKLOADS) + ["vit", "attention"])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                    help="bf16: the train step's forward under torch.autocast on the device")
    ap.add_argument("--tf32", action="store_true", help="float32 matmuls on a GPU through TF32 (allow_tf32)")
    ap.add_argument("--layouts", action="store_true",
                    help="time x @ W.t() on the shapes of tapestry bench --layouts instead")
    a = ap.parse_args()
    dev = torch.device(a.device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            sys.exit(f"bench_torch: --device {a.device}: this PyTorch has no usable CUDA device")
        torch.backends.cuda.matmul.allow_tf32 = a.tf32  # off: float32 as tapestry's default
        torch.backends.cudnn.allow_tf32 = a.tf32

    def wait():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    torch.set_num_threads(a.threads)
    torch.manual_seed(1234)
    if a.layouts:
        layouts(a)
        return
    if a.workload == "attention":
        attention_bench(a, dev, wait)
        return
    if a.workload == "vit":
        r = vit_bench(a, dev, wait)
        print(json.dumps(r) if a.json else "\n".join(f"{k:22s} {val}" for k, val in r.items()))
        return
    d, le, ld, h, f, v, b, s, t = WORKLOADS[a.workload]
    c = dict(src_vocab=v, tgt_vocab=v, d_model=d, heads=h, d_ff=f, enc_layers=le, dec_layers=ld, pad_id=0,
             pre_norm=False, share_embeddings=False, dropout=0.1)
    model = Transformer(c).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    g = torch.Generator().manual_seed(42)
    src = torch.randint(3, v, (b, s), generator=g)
    tgt = torch.randint(3, v, (b, t + 1), generator=g)
    src, tgt = src.to(dev), tgt.to(dev)
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]

    model.train()

    def train_step():
        with autocast(a):
            logits = model(src, tgt_in)
            loss = F.cross_entropy(logits.reshape(-1, v), tgt_out.reshape(-1), label_smoothing=0.1, ignore_index=0)
        loss.backward()
        opt.step()
        opt.zero_grad()
        loss.item()  # tapestry's Trainer reads the loss every step

    train_ms = []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        train_step()
        wait()
        if i >= a.warmup:
            train_ms.append((time.perf_counter() - t0) * 1000)
    counts = count_step(train_step, dev) if dev.type == "cuda" else None
    fwd_ms = []
    with torch.no_grad():
        for _ in range(max(3, a.steps // 2)):
            t0 = time.perf_counter()
            model(src, tgt_in)
            wait()
            fwd_ms.append((time.perf_counter() - t0) * 1000)
        model.eval()
        t0 = time.perf_counter()
        memory, src_mask = model.encode(src)
        ys = torch.ones(b, 1, dtype=torch.long, device=dev)
        for _ in range(t):
            out = model.decode(ys, memory, src_mask)
            nxt = model.generator(out[:, -1]).argmax(-1, keepdim=True)
            ys = torch.cat([ys, nxt], dim=1)
        wait()
        decode_ms = (time.perf_counter() - t0) * 1000
    x, w = torch.randn(b * t, d, device=dev), torch.randn(d, f, device=dev)
    torch.matmul(x, w)
    wait()
    gemm = []
    for _ in range(10):
        t0 = time.perf_counter()
        torch.matmul(x, w)
        wait()
        gemm.append((time.perf_counter() - t0) * 1000)

    step = statistics.median(train_ms)
    r = {
        "impl": "torch", "precision": a.precision, "gemm": gemm_name(a), "device": a.device, "workload": a.workload,
        "threads": a.threads,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", "detected"),
        "train_ms_median": step, "train_ms_min": min(train_ms), "train_ms_max": max(train_ms),
        "tgt_tokens_per_s": b * t / (step / 1000),
        "train_gflops": 3 * forward_flops(d, le, ld, f, v, b, s, t) / (step * 1e6),
        "forward_ms_median": statistics.median(fwd_ms),
        "decode_tokens_per_s": b * t / (decode_ms / 1000),
        "sgemm_gflops": 2 * b * t * d * f / (statistics.median(gemm) * 1e6),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "params": sum(p.numel() for p in model.parameters()),
    }
    if dev.type == "cuda":
        r["peak_gpu_mib"] = torch.cuda.max_memory_allocated(dev) / 2**20
        r["syncs_per_step"], r["launches_per_step"] = counts
    if a.json:
        print(json.dumps(r))
    else:
        for k, val in r.items():
            print(f"{k:22s} {val}")


if __name__ == "__main__":
    main()
