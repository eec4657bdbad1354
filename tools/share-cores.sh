#!/usr/bin/env bash
# Training speed on a quiet machine and beside other work, for several OpenMP spin limits
# (GOMP_SPINCOUNT; the CLI's own choice is in tools/main.cpp, Note [sharing the cores]). Each
# figure is the target tokens/s of one epoch of the Multi30k recipe on its first 3,000 pairs; the
# load is LOAD busy loops (a stand-in for a compile of LOAD jobs), started before the loaded rounds.
#   tools/share-cores.sh [ROUNDS=1] [LOAD=2] [SPINS="300000 30000 10000 3000 0"]
# 300000 is libgomp's default; 0 is what OMP_WAIT_POLICY=PASSIVE gives.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-1}" load="${2:-2}" spins="${3:-300000 30000 10000 3000 0}"
bin="${TAPESTRY_BIN:-build/tapestry}"
[ -x "$bin" ] || { echo "share-cores: build first (cmake --build build)"; exit 1; }
out="$(mktemp -d)"
loops=()
trap 'kill "${loops[@]}" 2>/dev/null || true; rm -rf "$out"' EXIT

epoch() {  # SPIN -> target tokens/s
  GOMP_SPINCOUNT=$1 "$bin" train --task multi30k --limit 3000 --epochs 1 --eval-limit 20 --beam 1 --average 0 \
    --out "$out/run" --overwrite --no-progress 2>&1 | sed -n 's/.*, \([0-9]*\) tok\/s.*/\1/p'
}
for mode in quiet loaded; do
  if [ "$mode" = loaded ]; then
    for _ in $(seq 1 "$load"); do sh -c 'while :; do :; done' & loops+=($!); done
  fi
  for r in $(seq 1 "$rounds"); do
    for s in $spins; do echo "$mode GOMP_SPINCOUNT=$s $(epoch "$s") tok/s"; done
  done
done
