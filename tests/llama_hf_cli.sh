#!/usr/bin/env bash
# `tapestry generate --hf DIR` end to end on a Hugging Face Llama directory: a tiny random Llama
# (tools/reference/llama_ref.py write-hf, 400 tokens, three bfloat16 shards) with the SentencePiece
# fixture tests/data/llama_spm/tokenizer.model (Llama 2's layout: unk 0, bos 1, eos 2):
# 1. greedy generation streams the prompt and a continuation, exit 0, and is the same twice;
# 2. a tokenizer of another size than config.json's vocab_size, a missing shard, no tokenizer:
#    one line naming the file, exit status 1.
#   tests/llama_hf_cli.sh TAPESTRY_BINARY
set -euo pipefail
bin="$1"
here="$(cd "$(dirname "$0")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "llama_hf_cli: FAIL: $*"; exit 1; }
ref="$here/tools/reference/llama_ref.py"
OMP_NUM_THREADS=1 /usr/bin/python3 "$ref" write-hf "$tmp/llama" --vocab 400 --dtype BF16 --shards 3 --seed 4
cp "$here/tests/data/llama_spm/tokenizer.model" "$tmp/llama/"

out="$("$bin" generate --hf "$tmp/llama" --prompt "A man in a" --max-new 12 --greedy --threads 1)"
[ "${out#A man in a}" != "$out" ] || fail "the output does not start with the prompt: $out"
[ "${#out}" -gt 10 ] || fail "nothing was generated: $out"
again="$("$bin" generate --hf "$tmp/llama" --prompt "A man in a" --max-new 12 --greedy --threads 1)"
[ "$out" = "$again" ] || fail "greedy generation differs between runs: '$out' vs '$again'"
echo "llama_hf_cli: generated: $out"

expect_error() {  # NAME PATTERN DIR
  set +e
  "$bin" generate --hf "$3" --prompt "A man" --max-new 3 > "$tmp/out" 2> "$tmp/err"
  local rc=$?
  set -e
  [ "$rc" -eq 1 ] || fail "$1: exit status $rc, expected 1 ($(cat "$tmp/err"))"
  [ "$(wc -l < "$tmp/err")" -eq 1 ] || fail "$1: expected one line on stderr, got: $(cat "$tmp/err")"
  grep -q -- "$2" "$tmp/err" || fail "$1: stderr does not match '$2': $(cat "$tmp/err")"
  echo "llama_hf_cli: $1: $(cat "$tmp/err")"
}
OMP_NUM_THREADS=1 /usr/bin/python3 "$ref" write-hf "$tmp/small" --vocab 300
cp "$here/tests/data/llama_spm/tokenizer.model" "$tmp/small/"
expect_error "vocabulary mismatch" "has 400 tokens but config.json's vocab_size is 300" "$tmp/small"
cp -r "$tmp/llama" "$tmp/noshard" && rm "$tmp/noshard/model-00002-of-00003.safetensors"
expect_error "missing shard" "model-00002-of-00003.safetensors is missing" "$tmp/noshard"
cp -r "$tmp/llama" "$tmp/notok" && rm "$tmp/notok/tokenizer.model"
expect_error "no tokenizer" "no tokenizer.json or tokenizer.model" "$tmp/notok"
