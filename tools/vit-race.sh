#!/usr/bin/env bash
# The image task against its PyTorch twin for the same wall time: tapestry trains the default
# recipe (`train --task image`: ViT fmnist, EPOCHS epochs, plus any FLAGS) on 2 threads; then the
# twin (tools/reference/vit_ref.py train: the same model, split sizes, batch, AdamW groups, warmup +
# cosine over the same steps, and the augmentation, dropout and label smoothing read back from
# tapestry's run) trains on 2 threads for as many seconds as tapestry's epochs took (evaluations
# excluded on both sides), and stops there. Alternated tapestry, PyTorch, tapestry, ... for PAIRS
# pairs; prints each run's test accuracy and speed.
#   tools/vit-race.sh [EPOCHS=30] [PAIRS=1] [FLAGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
epochs="${1:-30}" pairs="${2:-1}"
shift $(( $# < 2 ? $# : 2 ))
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
# PyTorch gets its best setting on this machine (bench-compare.sh's probe on the vit step, 2026-11-25:
# ACTIVE with OpenBLAS's AVX-512 kernels 89 ms, ACTIVE as installed 115 ms, PASSIVE + AVX-512 106 ms):
# OpenBLAS 0.3.21 runs SSE3 kernels on CPU models newer than it knows (docs/benchmarks.md).
torch_env=(OMP_WAIT_POLICY=ACTIVE)
isa="$(tools/openblas-coretype.sh)"
[ -n "$isa" ] && torch_env+=(OPENBLAS_CORETYPE="$isa")
# get RUN KEY: a value of the run's recorded recipe (its config.toml), for the twin.
get() { sed -n "s/^$2 = //p" "$1/config.toml"; }
echo "vit-race: PyTorch runs with ${torch_env[*]}"
for i in $(seq 1 "$pairs"); do
  "$bin" train --task image --epochs "$epochs" --threads 2 --out "$out/t$i" --overwrite --no-progress "$@" > "$out/t$i.log" 2>&1
  run="$out/t$i" flip=0
  [ "$(get "$run" flip)" = '"on"' ] && flip=1
  recipe=(--crop-padding "$(get "$run" crop-padding)" --flip "$flip" --dropout "$(get "$run" dropout)"
          --label-smoothing "$(get "$run" label-smoothing)" --lr "$(get "$run" lr)" --min-lr "$(get "$run" min-lr)"
          --weight-decay "$(get "$run" weight-decay)" --warmup "$(get "$run" warmup)" --batch "$(get "$run" batch)")
  seconds=$(grep -oP '^epoch [0-9]+: .*?, \K[0-9]+(?= s, )' "$out/t$i.log" | paste -sd+ | bc)
  echo "tapestry run $i: $(grep '^final:' "$out/t$i.log" | sed 's/^final: //') ($seconds s of training)"
  env "${torch_env[@]}" /usr/bin/python3 tools/reference/vit_ref.py train --epochs "$epochs" --threads 2 --time-limit "$seconds" "${recipe[@]}" \
    > "$out/p$i.log" 2>&1
  echo "pytorch  run $i: $(grep '^twin: final:' "$out/p$i.log" | sed 's/^twin: final: //')"
done
