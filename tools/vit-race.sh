#!/usr/bin/env bash
# The image task against its PyTorch twin for the same wall time: tapestry trains the default
# recipe (`train --task image`: ViT fmnist, EPOCHS epochs) on 2 threads; then the twin
# (tools/reference/vit_ref.py train: the same model, split sizes, batch, AdamW groups, warmup +
# cosine over the same steps) trains on 2 threads for as many seconds as
# tapestry's epochs took (evaluations excluded on both sides), and stops there. Alternated
# tapestry, PyTorch, tapestry, ... for PAIRS pairs; prints each run's test accuracy and speed.
#   tools/vit-race.sh [EPOCHS=14] [PAIRS=1]
set -euo pipefail
cd "$(dirname "$0")/.."
epochs="${1:-14}" pairs="${2:-1}"
bin=build/tapestry
[ -x "$bin" ] || { echo "vit-race: build first (tools/test.sh or cmake --build build)"; exit 1; }
# VIT_RACE_DIR keeps the runs (tapestry's run folders t1, t2, ... and every log); else a temp folder.
if [ -n "${VIT_RACE_DIR:-}" ]; then
  out="$VIT_RACE_DIR"
  mkdir -p "$out"
else
  out="$(mktemp -d)"
  trap 'rm -rf "$out"' EXIT
fi
# No OMP_WAIT_POLICY=PASSIVE: the runs take turns, so spinning threads slow nobody (passive waits cost tapestry 15%).
for i in $(seq 1 "$pairs"); do
  "$bin" train --task image --epochs "$epochs" --threads 2 --out "$out/t$i" --overwrite --no-progress > "$out/t$i.log" 2>&1
  seconds=$(grep -oP '^epoch [0-9]+: .*?, \K[0-9]+(?= s, )' "$out/t$i.log" | paste -sd+ | bc)
  echo "tapestry run $i: $(grep '^final:' "$out/t$i.log" | sed 's/^final: //') ($seconds s of training)"
  /usr/bin/python3 tools/reference/vit_ref.py train --epochs "$epochs" --threads 2 --time-limit "$seconds" \
    > "$out/p$i.log" 2>&1
  echo "pytorch  run $i: $(grep '^twin: final:' "$out/p$i.log" | sed 's/^twin: final: //')"
done
