#!/usr/bin/env bash
# Data-parallel throughput on this machine: the Multi30k default recipe trained for the same wall
# time as 1 process x 2 threads and as 2 ranks x 1 thread (mpirun -np 2, each rank half of every
# batch), alternated (one, two, one, two, ...). Prints each run's training tokens/s and the 2-rank
# runs' all-reduce cost per step, then the medians. Needs a TAPESTRY_MPI build (tools/test.sh
# makes one in build/). Evaluation is cut to 50 sentences, greedy, to keep the runs short; it is
# not counted in tokens/s either way.
#   tools/dist-compare.sh [SECONDS=120] [PAIRS=2]
# With a third argument `overlap`, both runs are 2 ranks x 1 thread: the all-reduce after the
# backward (TAPESTRY_ALLREDUCE_OVERLAP=0) against overlapped with it (the default), alternated;
# it also prints the medians of the all-reduce's cost per step.
#   tools/dist-compare.sh 60 4 overlap
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-120}" pairs="${2:-2}" mode="${3:-processes}"
[ "$mode" = processes ] || [ "$mode" = overlap ] || { echo "dist-compare: the third argument is 'overlap' or nothing"; exit 2; }
bin=build/tapestry
[ -x "$bin" ] || { echo "dist-compare: build first (tools/test.sh)"; exit 1; }
command -v mpirun >/dev/null || { echo "dist-compare: no mpirun (tools/setup.sh installs OpenMPI)"; exit 1; }
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMP_WAIT_POLICY=PASSIVE
recipe=(train --task multi30k --epochs 1 --time-limit "$seconds" --eval-limit 50 --beam 1 --no-progress)
mpi=(mpirun -np 2 --host localhost:2 --bind-to none --mca btl self,vader -x OMP_WAIT_POLICY)
echo "dist-compare: Multi30k default recipe, $seconds s of training per run, $pairs pairs ($mode)"

run() {  # NAME THREADS LAUNCHER...
  local name="$1" threads="$2"; shift 2
  "$@" "${recipe[@]}" --threads "$threads" --out "$out/$name" > "$out/$name.log" 2>&1 || { cat "$out/$name.log"; exit 1; }
  local tps; tps=$(grep -o '[0-9]* tok/s' "$out/$name.log" | awk 'NR == 1 {print $1}')
  echo "$name: $tps train tokens/s $(grep '^dist:' "$out/$name.log" | sed 's/^dist: //' || true)"
  echo "$tps" >> "$out/${name%%[0-9]*}.tps"
  grep -o '[0-9.]* ms per step' "$out/$name.log" | awk '{print $1}' >> "$out/${name%%[0-9]*}.ms" || true
}
if [ "$mode" = processes ]; then a=one b=two; else a=after b=overlapped; fi
for i in $(seq 1 "$pairs"); do
  if [ "$mode" = processes ]; then
    run "one$i" 2 "$bin"
    run "two$i" 1 "${mpi[@]}" "$bin"
  else
    run "after$i" 1 "${mpi[@]}" -x TAPESTRY_ALLREDUCE_OVERLAP=0 "$bin"
    run "overlapped$i" 1 "${mpi[@]}" "$bin"
  fi
done
python3 - "$out" "$a" "$b" <<'PY'
import os, statistics, sys
d, a, b = sys.argv[1:4]
def values(name, ext):
    path = f"{d}/{name}.{ext}"
    return [float(x) for x in open(path)] if os.path.exists(path) else []
def med(v): return f"{statistics.median(v):.0f} ({min(v):.0f}-{max(v):.0f})"
ta, tb = values(a, "tps"), values(b, "tps")
r = [y / x for x, y in zip(ta, tb)]
print(f"median tokens/s: {a} {med(ta)}, {b} {med(tb)}; ratio {b} / {a}: "
      f"{min(r):.2f} / {statistics.median(r):.2f} / {max(r):.2f} (min / median / max)")
for name in (a, b):
    ms = values(name, "ms")
    if ms:
        print(f"all-reduce per step, {name}: median {statistics.median(ms):.2f} ms ({min(ms):.2f}-{max(ms):.2f})")
PY
