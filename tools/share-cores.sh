#!/usr/bin/env bash
# Training speed on a quiet machine and beside other work, for several OpenMP spin limits
# (GOMP_SPINCOUNT; the CLI's own choice is in tools/main.cpp, Note [sharing the cores]) and thread
# counts. Each figure is the target tokens/s of one epoch of the Multi30k recipe on its first 3,000
# pairs. The load, started before the loaded rounds, is LOAD busy loops (a stand-in for a compile
# of LOAD jobs), or with LOAD=compile a real two-job compile of this tree (the library and the
# tests, cleaned and built again in a loop, in a scratch build folder).
#   tools/share-cores.sh [ROUNDS=1] [LOAD=2] [SETTINGS="300000 30000 10000 3000 0"]
# A setting is SPIN or SPIN:THREADS (threads default 2). 300000 is libgomp's default; 0 is what
# OMP_WAIT_POLICY=PASSIVE gives. The runs of a round alternate the settings.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-1}" load="${2:-2}" settings="${3:-300000 30000 10000 3000 0}"
bin="${TAPESTRY_BIN:-build/tapestry}"
[ -x "$bin" ] || { echo "share-cores: build first (cmake --build build)"; exit 1; }
out="$(mktemp -d)"
loads=()
trap 'for p in "${loads[@]}"; do kill -- -"$p" 2>/dev/null || kill "$p" 2>/dev/null; done; rm -rf "$out"' EXIT

epoch() {  # SPIN THREADS -> target tokens/s
  GOMP_SPINCOUNT=$1 "$bin" train --task multi30k --limit 3000 --epochs 1 --eval-limit 20 --beam 1 --average 0 \
    --threads "$2" --out "$out/run" --overwrite --no-progress 2>&1 | sed -n 's/.*, \([0-9]*\) tok\/s.*/\1/p'
}
for mode in quiet loaded; do
  if [ "$mode" = loaded ]; then
    if [ "$load" = compile ]; then
      cmake -S . -B "$out/load-build" -DCMAKE_BUILD_TYPE=Release >/dev/null
      setsid sh -c "while :; do cmake --build '$out/load-build' -j 2 --target tapestry_tests >/dev/null 2>&1;
                    cmake --build '$out/load-build' --target clean >/dev/null 2>&1; done" &
      loads+=($!)
      sleep 30  # past the configure step, into the compile
    else
      for _ in $(seq 1 "$load"); do sh -c 'while :; do :; done' & loads+=($!); done
    fi
  fi
  for r in $(seq 1 "$rounds"); do
    for s in $settings; do
      spin="${s%%:*}" threads=2
      [[ $s == *:* ]] && threads="${s#*:}"
      echo "$mode GOMP_SPINCOUNT=$spin threads=$threads $(epoch "$spin" "$threads") tok/s"
    done
  done
done
