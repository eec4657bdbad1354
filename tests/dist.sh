#!/usr/bin/env bash
# Data-parallel training on 2 ranks of this machine (ctest `dist`, TAPESTRY_MPI builds):
#   1. 2 ranks with half of each batch end with the same weights as 1 process with all of it
#      (dist_check: a tiny GPT, 6 AdamW steps with clipping): float64 to 1e-9 (only the order of
#      the gradient sums differs, ~1e-16 relative per step), float32 to 2e-4 (float rounding of
#      the same sums, ~1e-7 relative, which Adam's g / sqrt(v) can magnify for gradients near
#      zero, up to about lr = 3e-3 per step in the worst case);
#      the same with gradient accumulation (2 batches a step) and with overlap off
#      (TAPESTRY_ALLREDUCE_OVERLAP=0); with it on, some buckets start during the backward;
#   2. the shards are disjoint and cover the epoch (dist_check counts every window's ranks);
#   3. `mpirun -np 2 tapestry train --task lm` matches the 1-process run, and prints once;
#   4. a rank killed mid-run ends the job within 60 s with a message, and the checkpoints
#      written before the kill still load;
#   5. resuming with another process count is refused with a clear message, unless --reshard
#      (which goes on from the checkpoint written before the kill);
#   6. the copy task trains on 2 ranks too.
#   1c (run after 1b): on the emulated device (ops/dtype.h), the Trainer with clipping and
#      accumulation on 1 process, and 2 ranks, end with the CPU's weights to the bit.
#   tests/dist.sh DIST_CHECK TAPESTRY MPIRUN SOURCE_DIR
set -euo pipefail
check="$1" cli="$2" mpirun="$3" src="$4"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# mpirun refuses to start as root unless told; only then, and only here.
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
# This machine only (no hostfile, shared-memory transport), one thread per rank.
mpi=("$mpirun" -np 2 --host localhost:2 --bind-to none --mca btl self,vader -x OMP_NUM_THREADS=1)
export OMP_NUM_THREADS=1
fail() { echo "dist.sh: FAILED: $*"; exit 1; }

echo "== 1-2. dist_check: 2 ranks x half batch vs 1 process x whole batch; shards disjoint and complete"
for dtype in float64 float32; do
  "$check" train "$work/one_$dtype.safetensors" "$dtype"
  "${mpi[@]}" "$check" train "$work/two_$dtype.safetensors" "$dtype"
done
"$check" compare "$work/one_float64.safetensors" "$work/two_float64.safetensors" 1e-9 || fail "float64 weights differ"
"$check" compare "$work/one_float32.safetensors" "$work/two_float32.safetensors" 2e-4 || fail "float32 weights differ"
echo "== 1a. GradReducer: buckets start in one order on ranks whose gradients finish in different orders"
"${mpi[@]}" "$check" reducer || fail "GradReducer's overlapped buckets"
echo "== 1b. the same with 2 batches per optimizer step, and with the all-reduce after the backward (no overlap)"
"$check" train "$work/one_acc.safetensors" float64 2
"${mpi[@]}" "$check" train "$work/two_acc.safetensors" float64 2
"$check" compare "$work/one_acc.safetensors" "$work/two_acc.safetensors" 1e-9 || fail "float64 weights differ (accumulate 2)"
"${mpi[@]}" -x TAPESTRY_ALLREDUCE_OVERLAP=0 "$check" train "$work/two_no_overlap.safetensors" float64
"$check" compare "$work/one_float64.safetensors" "$work/two_no_overlap.safetensors" 1e-9 || fail "float64 weights differ (no overlap)"

echo "== 1c. the emulated device: 1 process (accumulate 2, clipping) and 2 ranks against the CPU's runs, to the bit"
DIST_CHECK_DEVICE=emulated "$check" train "$work/one_acc_emulated.safetensors" float64 2
"$check" compare "$work/one_acc.safetensors" "$work/one_acc_emulated.safetensors" 0 || fail "emulated weights differ (1 process)"
"${mpi[@]}" -x DIST_CHECK_DEVICE=emulated "$check" train "$work/two_emulated.safetensors" float32
"$check" compare "$work/two_float32.safetensors" "$work/two_emulated.safetensors" 0 || fail "emulated weights differ (2 ranks)"

echo "== 3. tapestry train --task lm on 2 ranks vs 1 process"
lm=(train --task lm --tokenizer byte --config tiny --data "$src/README.md" --val "$src/docs/benchmarks.md" --block 32
    --batch 8 --epochs 1 --limit 120 --dropout 0 --no-progress --threads 1)
"$cli" "${lm[@]}" --out "$work/lm1" > "$work/lm1.log"
"${mpi[@]}" "$cli" "${lm[@]}" --out "$work/lm2" > "$work/lm2.log"
[ "$(grep -c '^final:' "$work/lm2.log")" = 1 ] || { cat "$work/lm2.log"; fail "the 2-rank run did not print its result once"; }
grep '^final:' "$work/lm1.log" "$work/lm2.log"
"$check" compare "$work/lm1/model.safetensors" "$work/lm2/model.safetensors" 2e-4 || fail "tapestry train weights differ"
for f in checkpoint.safetensors curves.svg; do [ -f "$work/lm2/$f" ] || fail "the 2-rank run wrote no $f"; done

echo "== 4. a rank killed mid-run"
"${mpi[@]}" "$cli" "${lm[@]}" --epochs 1000 --save-every 2 --out "$work/kill" > "$work/kill.log" 2>&1 &
job=$!
for _ in $(seq 1 600); do [ -f "$work/kill/checkpoint.safetensors" ] && break; sleep 0.1; done
[ -f "$work/kill/checkpoint.safetensors" ] || { kill -9 $job; cat "$work/kill.log"; fail "no checkpoint within 60 s"; }
victim=""
for pid in $(pgrep -f "$work/kill" || true); do
  if grep -qx "OMPI_COMM_WORLD_RANK=1" < <(tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null); then victim=$pid; fi
done
[ -n "$victim" ] || { kill -9 $job; fail "rank 1 not found"; }
kill -9 "$victim"
start=$SECONDS
for _ in $(seq 1 600); do kill -0 $job 2>/dev/null || break; sleep 0.1; done
if kill -0 $job 2>/dev/null; then kill -9 $job; cat "$work/kill.log"; fail "the job still runs 60 s after a rank was killed"; fi
rc=0; wait $job || rc=$?
[ $rc -ne 0 ] || fail "the job exited 0 after a rank was killed"
echo "the job ended $((SECONDS - start)) s after rank 1 was killed, exit $rc; mpirun said:"
grep -m3 -aiE "killed|signal|exited|abort" "$work/kill.log" || true
"$cli" generate --checkpoint "$work/kill" --prompt "The" --max-new 8 --seed 1 > "$work/gen.log" 2>&1 ||
  { cat "$work/gen.log"; fail "the model written before the kill does not load"; }
echo "the model written before the kill loads: $(head -c 80 "$work/gen.log" | tr '\n' ' ')"

echo "== 5. resume with another process count: refused, unless --reshard"
killed=("${lm[@]}" --epochs 1000 --out "$work/kill" --resume)
if "$cli" "${killed[@]}" > "$work/resume.log" 2>&1; then
  cat "$work/resume.log"; fail "a 2-rank checkpoint resumed on 1 process without --reshard"
fi
grep -q "written by a run on 2 processes, and this one has 1" "$work/resume.log" ||
  { cat "$work/resume.log"; fail "no clear message"; }
grep "written by a run" "$work/resume.log"
"$cli" "${killed[@]}" --reshard --time-limit 1 > "$work/reshard.log" 2>&1 ||
  { cat "$work/reshard.log"; fail "--reshard did not resume the checkpoint written before the kill"; }
grep "^resume: from" "$work/reshard.log"
grep -q "time limit" "$work/reshard.log" || { cat "$work/reshard.log"; fail "--reshard did not go on training"; }
echo "== 6. the copy task on 2 ranks (random batches, rank 0's evaluation decides for both)"
"${mpi[@]}" "$cli" train --task copy --d-model 64 --heads 4 --d-ff 128 --batch 32 --warmup 200 --lr-factor 1 \
  --steps 2000 --threads 1 --no-progress > "$work/copy.log" 2>&1 || { cat "$work/copy.log"; fail "copy task on 2 ranks"; }
grep -a "^solved\|^dist:" "$work/copy.log"
echo "dist.sh: all data-parallel checks passed"
