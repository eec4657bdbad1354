#!/usr/bin/env bash
# Sets everything up, builds Release in build/, trains the GPT language model with the default
# recipe (the English side of Multi30k, SentencePiece, config mini; about 10 minutes on two
# cores), which prints val perplexity and bits per byte, then generates from a few prompts: one
# streamed with sampling, then a batch, greedy.
#   tools/lm.sh                                  # the default recipe, into runs/lm
#   tools/lm.sh --data my.txt --out runs/mine    # any `tapestry train --task lm` flags
set -euo pipefail
cd "$(dirname "$0")/.."

tools/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target tapestry_cli

out=runs/lm
args=("$@")
for ((i = 0; i < ${#args[@]}; ++i)); do
  case ${args[i]} in
    --out) out=${args[i + 1]} ;;
    --out=*) out=${args[i]#--out=} ;;
    --help|-h) exec build/tapestry train --task lm --help ;;
  esac
done

build/tapestry train --task lm "$@"

echo
echo "Sampled (temperature 0.8, top-k 40, seed 1), streamed:"
build/tapestry generate --checkpoint "$out" --prompt "A young girl" --temperature 0.8 --top-k 40 --max-new 40
echo
echo "Greedy, one batch:"
printf '%s\n' "Two men are" "A dog runs" "A woman in a red" "People are sitting" > "$out/prompts.txt"
build/tapestry generate --checkpoint "$out" --input "$out/prompts.txt" --greedy --max-new 30
echo
echo "Open $out/curves.svg (loss, bits per byte and perplexity per epoch) in a browser."
