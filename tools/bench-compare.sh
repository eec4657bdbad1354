#!/usr/bin/env bash
# Runs `tapestry bench` and tools/reference/bench_torch.py alternately (A B A B ...) on one
# workload and prints, for each figure, the ratio tapestry / PyTorch per pair with its min,
# median and max. PyTorch runs with its best setting, from a first probe: OMP_WAIT_POLICY PASSIVE
# or ACTIVE, each with OpenBLAS's own choice of kernels and with OPENBLAS_CORETYPE naming the
# CPU's vector ISA (OpenBLAS 0.3.21 runs SSE3 kernels on CPU models newer than it knows, as our
# Xeon model 207; docs/benchmarks.md). The choice is printed.
#   tools/bench-compare.sh [WORKLOAD=small] [THREADS=2] [PAIRS=3] [STEPS=10] [PRECISION=fp32]
#   WORKLOAD: copy, small, base or vit; PRECISION bf16: both in bfloat16 autocast (tapestry
#   --precision bf16, PyTorch torch.autocast("cpu", dtype=torch.bfloat16)).
set -euo pipefail
cd "$(dirname "$0")/.."
workload="${1:-small}" threads="${2:-2}" pairs="${3:-3}" steps="${4:-10}" precision="${5:-fp32}"
bin="${TAPESTRY_BIN:-build/tapestry}"  # TAPESTRY_BIN: another build (a before/after comparison)
[ -x "$bin" ] || { echo "bench-compare: build first (tools/test.sh or cmake --build build)"; exit 1; }
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

# torch_run "VAR=value ..." : PyTorch's run with those environment settings.
torch_run() { env $1 /usr/bin/python3 tools/reference/bench_torch.py --workload "$workload" \
                --threads "$threads" --steps "$steps" --precision "$precision" --json; }
ours_run() { "$bin" bench --workload "$workload" --threads "$threads" --steps "$steps" --precision "$precision" --json; }

mapfile -t settings < <(tools/torch-settings.sh)
best="" best_ms="" probes=""
for s in "${settings[@]}"; do
  ms=$(torch_run "$s" | python3 -c 'import json,sys; print(json.load(sys.stdin)["train_ms_median"])')
  probes+="${probes:+, }$s ${ms%.*} ms"
  if [ -z "$best" ] || python3 -c "import sys; sys.exit(0 if $ms < $best_ms else 1)"; then best="$s" best_ms="$ms"; fi
done
echo "workload $workload, $precision, $threads threads, $pairs pairs of $steps steps"
echo "PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)') with $best (train step probes: $probes)"

for i in $(seq 1 "$pairs"); do
  ours_run >> "$out/ours.jsonl"
  torch_run "$best" >> "$out/torch.jsonl"
done

python3 - "$out/ours.jsonl" "$out/torch.jsonl" <<'PY'
import json, statistics, sys
ours = [json.loads(l) for l in open(sys.argv[1])]
torch = [json.loads(l) for l in open(sys.argv[2])]
print(f"tapestry's float32 gemm: {ours[0].get('gemm', 'openblas')}")
keys = [("images_per_s", "higher"), ("train_ms_median", "lower"), ("peak_rss_mib", "lower")] if ours[0]["workload"] == "vit" else [("tgt_tokens_per_s", "higher"), ("train_ms_median", "lower"), ("train_gflops", "higher"),
        ("forward_ms_median", "lower"), ("decode_tokens_per_s", "higher"), ("sgemm_gflops", "higher"),
        ("peak_rss_mib", "lower")]
print(f"{'figure':22s} {'tapestry (median)':>18s} {'pytorch (median)':>17s}   ratio tapestry/pytorch: min / median / max")
for k, better in keys:
    ratios = [o[k] / t[k] for o, t in zip(ours, torch)]
    print(f"{k:22s} {statistics.median(o[k] for o in ours):18.1f} {statistics.median(t[k] for t in torch):17.1f}   "
          f"{min(ratios):.2f} / {statistics.median(ratios):.2f} / {max(ratios):.2f}   ({better} is better)")
PY
