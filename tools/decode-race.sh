#!/usr/bin/env bash
# The decoding race: `tapestry translate` against tools/reference/decode_torch.py (PyTorch with its
# own key/value cache, the same search step for step) on one trained run, over a whole test set.
# For greedy and beam 4, at batch 1 and 64, the two run alternately (A B A B ...); it prints
# sentences/s (median and range), the ratio per pair, the BLEU of each side and how many lines
# the two translated alike. PyTorch runs with its best setting from a first probe, as in
# tools/bench-compare.sh (OMP_WAIT_POLICY, OPENBLAS_CORETYPE naming the CPU's vector ISA, each
# of those with glibc's heap on huge pages, and each with PyTorch's own encoder fast path).
#   tools/decode-race.sh RUN_DIR [THREADS=2] [ROUNDS=3] [SOURCE=DATA/test_2016_flickr.de.gz] [CASES="greedy:1 greedy:64 beam:1 beam:64"]
set -euo pipefail
cd "$(dirname "$0")/.."
run="${1:?usage: tools/decode-race.sh RUN_DIR [THREADS] [ROUNDS] [SOURCE] [CASES]}"
threads="${2:-2}" rounds="${3:-3}"
data="${TAPESTRY_DATA:-../shared/data/multi30k}"
src="${4:-$(ls "$data"/test_2016_flickr.de* | sed -n 1p)}"
cases="${5:-greedy:1 greedy:64 beam:1 beam:64}"
ref="$(ls "${src%.de*}".en* | sed -n 1p)"
bin="${TAPESTRY_BIN:-build/tapestry}"
[ -x "$bin" ] || { echo "decode-race: build first (cmake --build build)"; exit 1; }
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

# search_flags SEARCH: the flags both sides take for it.
search_flags() { if [ "$1" = greedy ]; then echo --greedy; else echo --beam 4 --alpha 0.6; fi; }
ours() {  # SEARCH BATCH HYPS -> sentences/s
  "$bin" translate --checkpoint "$run" --input "$src" $(search_flags "$1") --batch "$2" --threads "$threads" \
    > "$3" 2> "$out/err" || { cat "$out/err"; exit 1; }
  sed -n 's/.*(\([0-9.]*\) sentences\/s).*/\1/p' "$out/err"
}
theirs() {  # ENV SEARCH BATCH HYPS -> sentences/s
  env $1 /usr/bin/python3 tools/reference/decode_torch.py --checkpoint "$run" --input "$src" $(search_flags "$2") \
    --batch "$3" --threads "$threads" --out "$4" --json 2> "$out/err" || { cat "$out/err"; exit 1; }
  python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])["sentences_per_s"])' "$out/err"
}

mapfile -t settings < <(tools/torch-settings.sh)
# Each also with the encoder as torch.nn.TransformerEncoder, whose inference fast path skips the
# padding as tapestry's encoder does (decode_torch.py --encoder torch).
for s in "${settings[@]}"; do settings+=("$s DECODE_TORCH_ENCODER=torch"); done
head -200 <(zcat -f "$src") > "$out/probe.de"
best="" best_rate="" probes=""
for s in "${settings[@]}"; do  # probed on greedy, batch 64, the first 200 sentences
  rate=$(env $s /usr/bin/python3 tools/reference/decode_torch.py --checkpoint "$run" --input "$out/probe.de" --greedy \
           --batch 64 --threads "$threads" --out /dev/null --json 2>&1 >/dev/null | tail -1 |
         python3 -c 'import json,sys; print(json.load(sys.stdin)["sentences_per_s"])')
  probes+="${probes:+, }$s ${rate%.*}/s"
  if [ -z "$best" ] || python3 -c "import sys; sys.exit(0 if $rate > $best_rate else 1)"; then best="$s" best_rate="$rate"; fi
done
echo "decoding race: $run, $(zcat -f "$src" | wc -l) sentences of $src, $threads threads, $rounds rounds"
echo "PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)') with $best (probes, greedy batch 64: $probes)"

for r in $(seq 1 "$rounds"); do
  for c in $cases; do
    search="${c%:*}" batch="${c#*:}"
    echo "$c $(ours "$search" "$batch" "$out/ours.$search.$batch")" >> "$out/ours.txt"
    echo "$c $(theirs "$best" "$search" "$batch" "$out/torch.$search.$batch")" >> "$out/torch.txt"
  done
done

bleu() { "$bin" bleu --ref "$ref" --hyp "$1" | sed -n 's/^BLEU = \([0-9.]*\).*/\1/p'; }
printf '%-12s %22s %22s %24s %12s %8s\n' case "tapestry sent/s" "pytorch sent/s" "ratio min/median/max" "BLEU t / p" "alike"
for c in $cases; do
  search="${c%:*}" batch="${c#*:}"
  alike=$(paste -d '\t' "$out/ours.$search.$batch" "$out/torch.$search.$batch" | awk -F'\t' '$1 == $2' | wc -l)
  total=$(wc -l < "$out/ours.$search.$batch")
  python3 - "$c" "$out/ours.txt" "$out/torch.txt" "$(bleu "$out/ours.$search.$batch") / $(bleu "$out/torch.$search.$batch")" \
    "$alike/$total" <<'PY'
import statistics, sys
case, ours_f, torch_f, bleu, alike = sys.argv[1:]
o = [float(l.split()[1]) for l in open(ours_f) if l.split()[0] == case]
t = [float(l.split()[1]) for l in open(torch_f) if l.split()[0] == case]
r = [a / b for a, b in zip(o, t)]
span = lambda v: f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})"
print(f"{case:12s} {span(o):>22s} {span(t):>22s} {min(r):7.2f} / {statistics.median(r):.2f} / {max(r):.2f} {bleu:>14s} {alike:>9s}")
PY
done
