#!/usr/bin/env bash
# The text tasks end to end from the command line (train --task mlm / classify, classify):
#   tests/text_cli.sh TAPESTRY_BINARY
# 1. bad corpora: a record without its group (label) and a file that is not JSON: each gives one
#    line naming the file and the record, exit status 1, and no run folder;
# 2. on the SpamAssassin corpus (tools/get-spam.sh), small runs: masked-LM pre-training of the
#    tiny encoder, fine-tuning it (--init), the bag-of-words baseline, and `tapestry classify`
#    on a spam record and a text.
set -euo pipefail
bin="$1"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
name=text_cli
source "$(dirname "$0")/cli_helpers.sh"

mkdir -p "$tmp/nolabel/spam-1" "$tmp/notjson/spam-1"
echo '{"id": "00001", "group": "spam-1", "text": "Subject: hi\n\nbuy now"}' > "$tmp/nolabel/spam-1/00001.json"
echo '{"id": "00002", "text": "Subject: hello\n\nno group here"}' > "$tmp/nolabel/spam-1/00002.json"
expect_refused nolabel 'nolabel/spam-1/00002.json: record 00002 has no "group" (its label)' --task classify --data "$tmp/nolabel"
echo 'not json' > "$tmp/notjson/spam-1/00003.json"
expect_refused notjson 'notjson/spam-1/00003.json: not a JSON mail record' --task mlm --data "$tmp/notjson"
expect_refused missing 'no such folder' --task classify --data "$tmp/nothing"

data="${TAPESTRY_SPAM_DIR:-$HOME/.cache/tapestry/spam-assassin}"
[ -d "$data/spam-2" ] || fail "no mail corpus in $data (tools/get-spam.sh fetches it)"
small=(--data "$data" --limit 400 --max-len 64 --batch 16 --threads 2 --no-progress)
"$bin" train --task mlm "${small[@]}" --config tiny --vocab-size 800 --epochs 2 --out "$tmp/mlm" > "$tmp/mlm.log" 2>&1 ||
  { cat "$tmp/mlm.log"; fail "the MLM run failed"; }
grep -E '^epoch|^final' "$tmp/mlm.log"
"$bin" train --task classify "${small[@]}" --init "$tmp/mlm" --epochs 2 --out "$tmp/ft" > "$tmp/ft.log" 2>&1 ||
  { cat "$tmp/ft.log"; fail "the fine-tuning run failed"; }
grep -E '^final' "$tmp/ft.log"
"$bin" train --task classify "${small[@]}" --model bow --vocab-size 800 --epochs 6 --lr 1e-2 --out "$tmp/bow" \
  > "$tmp/bow.log" 2>&1 || { cat "$tmp/bow.log"; fail "the bag-of-words run failed"; }
grep -E '^final' "$tmp/bow.log"
acc=$(grep -oP '^final: test accuracy \K[0-9.]+' "$tmp/bow.log") || fail "no final line for the bag of words"
python3 -c "import sys; sys.exit(0 if $acc > 80 else 1)" || fail "bag-of-words test accuracy $acc%"
record=$(find "$data/spam-2" -name "*.json" -print -quit)
"$bin" classify --checkpoint "$tmp/bow" "$record" --text "Dear friend, you have won a free prize, click here now" \
  > "$tmp/classify.log" || fail "classify failed"
cat "$tmp/classify.log"
[ "$(wc -l < "$tmp/classify.log")" -eq 2 ] || fail "classify printed $(wc -l < "$tmp/classify.log") lines, expected 2"
grep -qE '^(spam|ham ) [01]\.[0-9]{3}  ' "$tmp/classify.log" || fail "classify's lines are not 'label probability  name'"
echo "text_cli: ok"
