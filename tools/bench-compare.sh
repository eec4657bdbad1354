#!/usr/bin/env bash
# Runs `tapestry bench` and tools/reference/bench_torch.py alternately (A B A B ...) on one
# workload and prints, for each figure, the ratio tapestry / PyTorch per pair with its min,
# median and max. PyTorch runs with whichever OMP_WAIT_POLICY (PASSIVE or ACTIVE) gave it the
# faster train step in a first probe; the choice is printed.
#   tools/bench-compare.sh [WORKLOAD=small] [THREADS=2] [PAIRS=3] [STEPS=10]     (WORKLOAD: copy, small, base or vit)
set -euo pipefail
cd "$(dirname "$0")/.."
workload="${1:-small}" threads="${2:-2}" pairs="${3:-3}" steps="${4:-10}"
bin="${TAPESTRY_BIN:-build/tapestry}"  # TAPESTRY_BIN: another build (a before/after comparison)
[ -x "$bin" ] || { echo "bench-compare: build first (tools/test.sh or cmake --build build)"; exit 1; }
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

torch_run() { OMP_WAIT_POLICY="$1" /usr/bin/python3 tools/reference/bench_torch.py --workload "$workload" \
                --threads "$threads" --steps "$steps" --json; }
ours_run() { "$bin" bench --workload "$workload" --threads "$threads" --steps "$steps" --json; }

passive=$(torch_run PASSIVE | python3 -c 'import json,sys; print(json.load(sys.stdin)["train_ms_median"])')
active=$(torch_run ACTIVE | python3 -c 'import json,sys; print(json.load(sys.stdin)["train_ms_median"])')
policy=$(python3 -c "print('PASSIVE' if $passive <= $active else 'ACTIVE')")
echo "workload $workload, $threads threads, $pairs pairs of $steps steps; PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)') with OMP_WAIT_POLICY=$policy (train step: PASSIVE ${passive} ms, ACTIVE ${active} ms)"

for i in $(seq 1 "$pairs"); do
  ours_run >> "$out/ours.jsonl"
  torch_run "$policy" >> "$out/torch.jsonl"
done

python3 - "$out/ours.jsonl" "$out/torch.jsonl" <<'PY'
import json, statistics, sys
ours = [json.loads(l) for l in open(sys.argv[1])]
torch = [json.loads(l) for l in open(sys.argv[2])]
keys = [("images_per_s", "higher"), ("train_ms_median", "lower"), ("peak_rss_mib", "lower")] if ours[0]["workload"] == "vit" else [("tgt_tokens_per_s", "higher"), ("train_ms_median", "lower"), ("train_gflops", "higher"),
        ("forward_ms_median", "lower"), ("decode_tokens_per_s", "higher"), ("sgemm_gflops", "higher"),
        ("peak_rss_mib", "lower")]
print(f"{'figure':22s} {'tapestry (median)':>18s} {'pytorch (median)':>17s}   ratio tapestry/pytorch: min / median / max")
for k, better in keys:
    ratios = [o[k] / t[k] for o, t in zip(ours, torch)]
    print(f"{k:22s} {statistics.median(o[k] for o in ours):18.1f} {statistics.median(t[k] for t in torch):17.1f}   "
          f"{min(ratios):.2f} / {statistics.median(ratios):.2f} / {max(ratios):.2f}   ({better} is better)")
PY
