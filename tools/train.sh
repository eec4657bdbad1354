#!/usr/bin/env bash
# Sets everything up, builds Release in build/, trains the Transformer on Multi30k German to
# English with the default recipe (about 45 minutes on two cores, build included), then shows what it learned:
# the test BLEU and samples (printed by train), a few translations of new sentences, and the
# attention heat maps of one of them.
#   tools/train.sh            # the default recipe, into runs/multi30k
#   tools/train.sh --quick    # the quick recipe (under 10 minutes), into runs/multi30k-quick
#   tools/train.sh --epochs 20 --out runs/long    # any `tapestry train` flags
set -euo pipefail
cd "$(dirname "$0")/.."

tools/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target tapestry_cli

for arg in "$@"; do
  if [[ $arg == --print-config || $arg == --help || $arg == -h ]]; then exec build/tapestry train --task multi30k "$@"; fi
done
# Where the run goes, as train resolves it from the flags (and any --config-file).
out=$(build/tapestry train --task multi30k "$@" --print-config | sed -n 's/^out = "\(.*\)"$/\1/p')

# The hour this command is meant to fit in, set-up and build included: on a slow or loaded machine
# training plans to end (Note [Planning to the deadline]) when the hour less 2 minutes is used, then
# averages and tests what it has, and says so. What follows training (averaging, the val and test
# beam searches, the samples, the attention maps) took 25 s on a 2-core Zen 4; the 2 minutes leave
# room for a host 4 times slower. A --time-limit given here overrides it.
budget=$(( 3600 - SECONDS - 120 ))
build/tapestry train --task multi30k --time-limit $(( budget > 600 ? budget : 600 )) "$@"

echo
echo "New sentences, translated by $out (beam 4):"
sentences=("Ein kleines Mädchen spielt mit einem Ball im Garten."
           "Zwei Männer sitzen auf einer Bank und lesen Zeitung."
           "Ein Hund rennt durch den Schnee."
           "Eine Frau mit einem roten Hut verkauft Obst auf dem Markt.")
printf '%s\n' "${sentences[@]}" > "$out/samples.de"
build/tapestry translate --checkpoint "$out" --input "$out/samples.de" > "$out/samples.en"
paste -d '\n' "$out/samples.de" "$out/samples.en" | sed 'N;s/\n/\n  -> /'
echo
build/tapestry attention --checkpoint "$out" --sentence "${sentences[2]}" --out "$out/attention.html"
echo "Open $out/curves.svg (loss and BLEU per epoch) and $out/attention.html (every attention head) in a browser."
