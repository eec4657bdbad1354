#!/usr/bin/env bash
# Downloads the Multi30k task-1 files tapestry trains on (train, val, test_2016_flickr; German
# and English, gzip'd, one sentence per line) into DIR, for users without ../shared/data/multi30k.
# Then: build/tapestry train --task multi30k --data DIR   (or TAPESTRY_DATA=DIR).
#   tools/get-multi30k.sh DIR
# MULTI30K_URL overrides the source (any URL curl reads, file:// included).
set -euo pipefail
dir="${1:?usage: tools/get-multi30k.sh DIR}"
base="${MULTI30K_URL:-https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw}"
command -v curl >/dev/null || { echo "get-multi30k: curl is needed (apt-get install curl)"; exit 1; }
mkdir -p "$dir"
declare -A lines=([train]=29000 [val]=1014 [test_2016_flickr]=1000)
for split in train val test_2016_flickr; do
  for lang in de en; do
    f="$split.$lang.gz"
    if [ ! -s "$dir/$f" ]; then
      echo "get-multi30k: $base/$f"
      curl -fsSL --retry 3 -o "$dir/$f.part" "$base/$f" || { rm -f "$dir/$f.part"; echo "get-multi30k: download of $f failed"; exit 1; }
      mv "$dir/$f.part" "$dir/$f"
    fi
    n=$(gzip -dc "$dir/$f" | wc -l)
    [ "$n" -eq "${lines[$split]}" ] || { echo "get-multi30k: $dir/$f has $n lines, expected ${lines[$split]}"; exit 1; }
  done
done
echo "get-multi30k: Multi30k de-en is in $dir"
