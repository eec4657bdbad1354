#!/bin/bash
# Per-step training records (step, epoch, loss, tokens, lr, gradient norm) of four short runs that
# go through every training path: the copy task, the 1,000-pair Multi30k slice (plain, and with
# --accumulate 2 --clip-norm 1) and the LM recipe. A refactor that must not change behaviour
# compares them to the bit with docs/refactor-losses/ (recorded again on 2026-11-27 at the code of
# d65b372, on a Zen 5; the first records, of c452272 before issue 24, no longer held after the
# changes of float32 gemm library and of rounding since, which were not refactors):
#   tools/step-losses.sh build /tmp/after && diff -r docs/refactor-losses /tmp/after
# Usage: tools/step-losses.sh BUILD_DIR OUT_DIR (needs Multi30k: $TAPESTRY_DATA or ../shared/data/multi30k).
set -u
build=$1
out=$2
mkdir -p "$out"
rm -f "$out"/*.tsv
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tp="$build/tapestry"
common=(--threads 2 --no-progress)
m30k=(--task multi30k --limit 1000 --config tiny --max-tokens 512 --vocab-size 1000 --eval-limit 40 --cooldown 0 --average 5)
status=0
run() {  # run NAME ARGS...: the copy task exits 1 when it is not solved in its steps, which is expected here
  local name=$1
  shift
  "$tp" train "$@" "${common[@]}" --step-log "$out/$name.tsv" >"$work/$name.log" 2>&1
  local rc=$?
  if [ ! -s "$out/$name.tsv" ]; then
    echo "step-losses: $name wrote no step log (exit $rc):" >&2
    tail -5 "$work/$name.log" >&2
    status=1
  fi
}
run copy --task copy --steps 300 --d-model 64 --heads 4 --d-ff 128
run m30k "${m30k[@]}" --epochs 3 --beam 2 --seed 1 --out "$work/m30k"
run m30k_acc "${m30k[@]}" --epochs 2 --accumulate 2 --clip-norm 1 --beam 1 --seed 2 --out "$work/m30k_acc"
run lm --task lm --limit 2000 --config tiny --epochs 1 --vocab-size 500 --seed 3 --out "$work/lm"
wc -l "$out"/*.tsv
exit $status
