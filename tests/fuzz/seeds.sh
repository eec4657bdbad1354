#!/usr/bin/env bash
# Writes the seed inputs of a fuzz target (tests/fuzz/seeds/TARGET.hex: one `NAME HEX` per line)
# as files into DIR, for libFuzzer.   tests/fuzz/seeds.sh TARGET DIR
set -euo pipefail
hex_file="$(dirname "$0")/seeds/$1.hex"
mkdir -p "$2"
while read -r name hex; do
  [[ -z $name || $name == \#* ]] && continue
  printf '%b' "$(sed 's/../\\x&/g' <<<"$hex")" > "$2/$name"
done < "$hex_file"
