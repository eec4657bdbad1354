#!/usr/bin/env bash
# Data-parallel throughput on this machine: the Multi30k default recipe trained for the same wall
# time as 1 process x 2 threads and as 2 ranks x 1 thread (mpirun -np 2, each rank half of every
# batch), alternated (one, two, one, two, ...). Prints each run's training tokens/s and the 2-rank
# runs' all-reduce cost per step, then the medians. Needs a TAPESTRY_MPI build (tools/test.sh
# makes one in build/). Evaluation is cut to 50 sentences, greedy, to keep the runs short; it is
# not counted in tokens/s either way.
#   tools/dist-compare.sh [SECONDS=120] [PAIRS=2]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-120}" pairs="${2:-2}"
bin=build/tapestry
[ -x "$bin" ] || { echo "dist-compare: build first (tools/test.sh)"; exit 1; }
command -v mpirun >/dev/null || { echo "dist-compare: no mpirun (tools/setup.sh installs OpenMPI)"; exit 1; }
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMP_WAIT_POLICY=PASSIVE
recipe=(train --task multi30k --epochs 1 --time-limit "$seconds" --eval-limit 50 --beam 1 --no-progress)
mpi=(mpirun -np 2 --host localhost:2 --bind-to none --mca btl self,vader -x OMP_WAIT_POLICY)
echo "dist-compare: Multi30k default recipe, $seconds s of training per run, $pairs pairs"

run() {  # NAME THREADS LAUNCHER...
  local name="$1" threads="$2"; shift 2
  "$@" "${recipe[@]}" --threads "$threads" --out "$out/$name" > "$out/$name.log" 2>&1 || { cat "$out/$name.log"; exit 1; }
  local tps; tps=$(grep -o '[0-9]* tok/s' "$out/$name.log" | head -1 | awk '{print $1}')
  echo "$name: $tps train tokens/s $(grep '^dist:' "$out/$name.log" | sed 's/^dist: //' || true)"
  echo "$tps" >> "$out/$name.tps"
}
for i in $(seq 1 "$pairs"); do
  run "one$i" 2 "$bin"
  run "two$i" 1 "${mpi[@]}" "$bin"
  cat "$out/one$i.tps" >> "$out/one.all"; cat "$out/two$i.tps" >> "$out/two.all"
done
python3 - "$out" <<'PY'
import statistics, sys
one = [float(x) for x in open(f"{sys.argv[1]}/one.all")]
two = [float(x) for x in open(f"{sys.argv[1]}/two.all")]
r = [b / a for a, b in zip(one, two)]
print(f"median tokens/s: 1 process x 2 threads {statistics.median(one):.0f} ({min(one):.0f}-{max(one):.0f}), "
      f"2 ranks x 1 thread {statistics.median(two):.0f} ({min(two):.0f}-{max(two):.0f}); "
      f"ratio 2 ranks / 1 process: {min(r):.2f} / {statistics.median(r):.2f} / {max(r):.2f} (min / median / max)")
PY
