#!/usr/bin/env python3
"""The PyTorch twin of tapestry's GPT language-model training, for same-budget comparisons:
the same model (gpt_ref.GPT: tapestry's architecture and parameter names), GPT-2's init,
AdamW with decay / no-decay groups, warmup + cosine learning rate, random training windows,
a fixed wall-clock budget, then the validation loss on non-overlapping windows.

    /usr/bin/python3 tools/reference/lm_torch.py --train-ids train.bin --val-ids val.bin \\
        --val-bytes 1115394 --vocab 50257 --layers 4 --heads 4 --d-model 128 --block 128 \\
        --batch 16 --lr 1e-3 --min-lr 1e-4 --warmup 100 --weight-decay 0.1 --dropout 0.0 \\
        --seconds 600 --threads 2 --seed 1 --eval-tokens 0 --json out.json

Token files are raw little-endian int32 arrays (all ids in [0, vocab)). --val-bytes is the size
in bytes of the text the whole val file encodes (for bits per byte).

Training. Each step draws --batch windows of block+1 consecutive training tokens at uniformly
random starts (a torch.Generator seeded with --seed; the model's init and dropout use
torch.manual_seed(--seed)); inputs are the first block tokens, targets the last block. The loss
is the mean cross-entropy, then gradient clipping (--grad-clip, global L2 norm, 0: off) and one
AdamW step (betas 0.9, 0.95, eps 1e-8; weight decay on every parameter with dim >= 2, none on
biases and LayerNorm). The clock is read before each step; training stops at the first step that
would start after --seconds of training time (model building, data loading and the evaluation are
not counted).

Learning rate, for step s = 1, 2, ...: linear warmup lr * s / warmup for s <= warmup, then a
cosine from lr down to min-lr, lr(t) = min_lr + (lr - min_lr) (1 + cos(pi t)) / 2, where the
progress t in [0, 1] is
  --steps-hint N > 0: (s - warmup) / (N - warmup), clamped to 1 (min-lr after step N);
  --steps-hint 0 (the default): the fraction of the time budget spent since the warmup ended,
    so the cosine reaches min-lr just as the budget runs out whatever the speed.

Evaluation (eval mode, no dropout). The val ids (the first --eval-tokens of them; 0: all) are
cut into non-overlapping windows of block+1 tokens (the last one shorter, if it holds at least 2
tokens); in each window every token but the first is predicted from the ones before it. So
  val_loss = total nats / predicted tokens,  val_ppl = exp(val_loss),
  val_bpb  = total nats / ln 2 / bytes covered,
  bytes covered = val_bytes * predicted / (tokens in the whole val file),
i.e. each predicted token is charged the val text's average bytes per token (an approximation:
the exact byte count of those tokens would need the tokenizer).

The JSON (--json OUT, also printed) holds: steps, tokens (steps * batch * block: the predicted
training tokens), seconds (training wall time), tokens_per_s, val_loss, val_ppl, val_bpb, and
for the record val_tokens_predicted, val_bytes_covered, eval_seconds, train_loss (mean of the
last 10 steps), final_lr, params (the tied weight once), threads, torch, and the settings.
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_ref import GPT, adamw_groups  # noqa: E402


def read_ids(path, vocab, what):
    """A raw little-endian int32 token file as an int32 tensor, every id checked."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    if len(data) % 4:
        raise SystemExit(f"lm_torch: {what} file {path} has {len(data)} bytes, not a whole number of int32 ids")
    ids = torch.frombuffer(data, dtype=torch.int32) if data else torch.empty(0, dtype=torch.int32)
    if sys.byteorder != "little":
        raise SystemExit("lm_torch: big-endian hosts are not supported")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise SystemExit(f"lm_torch: {what} file {path} holds ids outside [0, {vocab}): "
                         f"min {int(ids.min())}, max {int(ids.max())}")
    return ids


def lr_at(step, a, cosine_progress):
    """The learning rate of step `step` (from 1); cosine_progress() gives t for the cosine."""
    if a.warmup > 0 and step <= a.warmup:
        return a.lr * step / a.warmup
    t = min(max(cosine_progress(), 0.0), 1.0)
    return a.min_lr + (a.lr - a.min_lr) * 0.5 * (1.0 + math.cos(math.pi * t))


def evaluate(model, val, block, batch):
    """(total nats, predicted tokens) over non-overlapping windows of block+1 tokens of val."""
    W = block + 1
    n_full = val.numel() // W
    rest = val.numel() - n_full * W
    nats, predicted = 0.0, 0
    model.eval()
    with torch.no_grad():
        windows = val[:n_full * W].view(n_full, W).long()
        for i in range(0, n_full, batch):
            w = windows[i:i + batch]
            logits = model(w[:, :-1])
            nats += F.cross_entropy(logits.reshape(-1, logits.size(-1)), w[:, 1:].reshape(-1),
                                    reduction="sum").item()
            predicted += w[:, 1:].numel()
        if rest >= 2:  # the shorter last window
            w = val[n_full * W:].long().view(1, rest)
            logits = model(w[:, :-1])
            nats += F.cross_entropy(logits.reshape(-1, logits.size(-1)), w[:, 1:].reshape(-1), reduction="sum").item()
            predicted += rest - 1
    model.train()
    return nats, predicted


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train-ids", required=True)
    ap.add_argument("--val-ids", required=True)
    ap.add_argument("--val-bytes", type=int, required=True, help="bytes of the text the whole val file encodes")
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--d-model", type=int, required=True)
    ap.add_argument("--d-ff", type=int, default=0, help="0: 4 * d_model")
    ap.add_argument("--block", type=int, required=True, help="context length (block_size)")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--min-lr", type=float, required=True)
    ap.add_argument("--warmup", type=int, required=True, help="warmup steps")
    ap.add_argument("--weight-decay", type=float, required=True)
    ap.add_argument("--dropout", type=float, required=True)
    ap.add_argument("--seconds", type=float, required=True, help="training wall-time budget")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--eval-tokens", type=int, default=0, help="evaluate on the first N val ids (0: all)")
    ap.add_argument("--eval-batch", type=int, default=0, help="windows per evaluation batch (0: --batch)")
    ap.add_argument("--steps-hint", type=int, default=0,
                    help="the cosine's length in steps (0: follow the time budget instead)")
    ap.add_argument("--grad-clip", type=float, default=1.0, help="global gradient-norm clip (0: off)")
    ap.add_argument("--gelu", choices=("tanh", "erf"), default="tanh")
    ap.add_argument("--log-every", type=int, default=0, help="print the loss every N steps to stderr (0: never)")
    ap.add_argument("--json", help="write the results here as JSON")
    a = ap.parse_args()
    if a.d_model % a.heads:
        raise SystemExit(f"lm_torch: --heads {a.heads} does not divide --d-model {a.d_model}")
    if a.lr < a.min_lr or a.min_lr < 0:
        raise SystemExit("lm_torch: need 0 <= --min-lr <= --lr")
    if a.steps_hint and a.steps_hint <= a.warmup:
        raise SystemExit("lm_torch: --steps-hint must exceed --warmup")

    torch.set_num_threads(a.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # only allowed before any parallel work; harmless if refused
        pass
    torch.manual_seed(a.seed)
    train = read_ids(a.train_ids, a.vocab, "train")
    val_all = read_ids(a.val_ids, a.vocab, "val")
    if train.numel() < a.block + 1:
        raise SystemExit(f"lm_torch: {train.numel()} training ids, fewer than block + 1 = {a.block + 1}")
    val = val_all[:a.eval_tokens] if a.eval_tokens > 0 else val_all
    if val.numel() < 2:
        raise SystemExit("lm_torch: fewer than 2 val ids to evaluate")

    c = dict(vocab=a.vocab, block_size=a.block, layers=a.layers, heads=a.heads, d_model=a.d_model, d_ff=a.d_ff,
             dropout=a.dropout, ln_eps=1e-5, gelu_tanh=a.gelu == "tanh")
    model = GPT(c).gpt2_init()
    model.train()
    opt = torch.optim.AdamW(adamw_groups(model, a.weight_decay), lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(a.seed)
    offsets = torch.arange(a.block + 1)
    n_starts = train.numel() - a.block  # windows of block+1 tokens start at 0 .. n-block-1

    steps, lr, recent = 0, 0.0, []
    t0 = time.perf_counter()
    warmup_end = None  # training time at which the warmup finished

    def progress():
        if a.steps_hint:
            return (steps - a.warmup) / (a.steps_hint - a.warmup)
        elapsed = time.perf_counter() - t0
        start = warmup_end if warmup_end is not None else elapsed
        return (elapsed - start) / max(a.seconds - start, 1e-9)

    while time.perf_counter() - t0 < a.seconds:
        steps += 1
        if steps == a.warmup + 1:
            warmup_end = time.perf_counter() - t0
        lr = lr_at(steps, a, progress)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, n_starts, (a.batch,), generator=gen)
        w = train[starts.unsqueeze(1) + offsets].long()  # [batch, block+1]
        loss = model.loss(w[:, :-1], w[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if a.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
        opt.step()
        recent = (recent + [loss.item()])[-10:]
        if a.log_every and steps % a.log_every == 0:
            print(f"lm_torch: step {steps} loss {recent[-1]:.4f} lr {lr:.3g} "
                  f"{time.perf_counter() - t0:.1f}s", file=sys.stderr)
    seconds = time.perf_counter() - t0

    t1 = time.perf_counter()
    nats, predicted = evaluate(model, val, a.block, a.eval_batch or a.batch)
    eval_seconds = time.perf_counter() - t1
    bytes_covered = a.val_bytes * predicted / val_all.numel()
    val_loss = nats / predicted
    tokens = steps * a.batch * a.block
    r = {
        "impl": "torch", "steps": steps, "tokens": tokens, "seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
        "val_loss": val_loss, "val_ppl": math.exp(min(val_loss, 700.0)),
        "val_bpb": nats / math.log(2) / bytes_covered,
        "val_tokens_predicted": predicted, "val_bytes_covered": bytes_covered, "eval_seconds": eval_seconds,
        "train_loss": sum(recent) / len(recent) if recent else None, "final_lr": lr,
        "params": sum(p.numel() for p in model.parameters()), "threads": a.threads, "torch": torch.__version__,
        "config": {k: v for k, v in vars(a).items() if k not in ("train_ids", "val_ids", "json")},
    }
    text = json.dumps(r)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
