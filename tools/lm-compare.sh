#!/usr/bin/env bash
# The same budget on both sides: tapestry's GPT language model (`train --task lm`) and its PyTorch
# twin (tools/reference/lm_torch.py) train the same config on the same token stream (tapestry's
# SentencePiece ids, exported with --export-ids) with the same recipe (AdamW with the same
# parameter groups, warmup + cosine over the same step count, clipping 1.0, dropout) for the same
# wall time, 2 threads each, alternated (tapestry, PyTorch, tapestry, PyTorch, ...). Prints each
# run's val loss, val bits per byte, steps and train tokens/s, then the medians.
# The budget counts training only on both sides; tapestry's also holds its end-of-epoch
# evaluations, PyTorch's does not.
#   tools/lm-compare.sh [SECONDS=120] [PAIRS=2] [EPOCHS=2]   (config mini, block 64, batch 32)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-120}" pairs="${2:-2}" epochs="${3:-2}"
bin=build/tapestry
[ -x "$bin" ] || { echo "lm-compare: build first (tools/test.sh or cmake --build build)"; exit 1; }
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
export OMP_WAIT_POLICY=PASSIVE
recipe=(--config mini --block 64 --batch 32 --lr 2e-3 --min-lr 2e-4 --warmup 200 --weight-decay 0.1 --dropout 0.1
        --clip-norm 1 --epochs "$epochs")
echo "lm-compare: $seconds s each, $pairs pairs, 2 threads; GPT mini (4 layers, 4 heads, d_model 128), block 64, batch 32"

for i in $(seq 1 "$pairs"); do
  "$bin" train --task lm "${recipe[@]}" --threads 2 --time-limit "$seconds" --out "$out/t$i" --export-ids \
    --no-progress > "$out/t$i.log" 2>&1
  grep '^final:' "$out/t$i.log" | sed "s/^/tapestry run $i: /"
  steps_per_epoch=$(grep -o '[0-9]* epochs of [0-9]* steps' "$out/t$i.log" | awk '{print $4}')
  ids="$out/t$i"
  vocab=$(python3 -c "import json; print(json.load(open('$ids/ids.json'))['vocab'])")
  val_bytes=$(python3 -c "import json; print(json.load(open('$ids/ids.json'))['val_bytes'])")
  /usr/bin/python3 tools/reference/lm_torch.py --train-ids "$ids/train.ids" --val-ids "$ids/val.ids" \
    --val-bytes "$val_bytes" --vocab "$vocab" --layers 4 --heads 4 --d-model 128 --block 64 --batch 32 --lr 2e-3 \
    --min-lr 2e-4 --warmup 200 --weight-decay 0.1 --dropout 0.1 --grad-clip 1.0 --seconds "$seconds" --threads 2 \
    --steps-hint $((steps_per_epoch * epochs)) --json "$out/p$i.json" > "$out/p$i.log" 2>&1
  python3 -c "import json; r=json.load(open('$out/p$i.json')); print(f\"pytorch  run $i: val loss {r['val_loss']:.4f}, bits per byte {r['val_bpb']:.4f}; {r['steps']} steps, {r['tokens_per_s']:.0f} train tokens/s\")"
done

python3 - "$out" "$pairs" <<'PY'
import json, re, statistics, sys
out, pairs = sys.argv[1], int(sys.argv[2])
ours, torch = [], []
for i in range(1, pairs + 1):
    line = [l for l in open(f"{out}/t{i}.log") if l.startswith("final:")][0]
    loss = float(re.search(r"val loss ([0-9.]+)", line).group(1))
    bpb = float(re.search(r"bits per byte ([0-9.]+)", line).group(1))
    tps = float(re.search(r"([0-9.]+) train tokens/s", line).group(1))
    ours.append((loss, bpb, tps))
    r = json.load(open(f"{out}/p{i}.json"))
    torch.append((r["val_loss"], r["val_bpb"], r["tokens_per_s"]))
def med(rows, k):
    v = [r[k] for r in rows]
    return f"{statistics.median(v):.4f} ({min(v):.4f}-{max(v):.4f})" if k < 2 else \
           f"{statistics.median(v):.0f} ({min(v):.0f}-{max(v):.0f})"
print(f"{'median (range)':16s} {'tapestry':>24s} {'pytorch':>24s}")
for k, name in [(0, "val loss"), (1, "val bits/byte"), (2, "train tokens/s")]:
    print(f"{name:16s} {med(ours, k):>24s} {med(torch, k):>24s}")
ratio = [o[2] / t[2] for o, t in zip(ours, torch)]
print(f"tokens/s ratio tapestry/pytorch: {min(ratio):.2f} / {statistics.median(ratio):.2f} / {max(ratio):.2f} (min / median / max)")
PY
