#!/usr/bin/env bash
# The Hugging Face GPT-2 loading test: the reference writes small random GPT-2 checkpoints in
# Hugging Face's safetensors layout (GPT2LMHeadModel keys with "transformer." and lm_head, and
# GPT2Model keys without), each with a test batch and the logits of a plain PyTorch GPT-2
# forward; gpt_hf_check loads each with models::load_gpt2_hf and compares.
#   tests/gpt_hf.sh GPT_HF_CHECK_BINARY
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
dir="$(mktemp -d)"  # gpt_hf_check writes its damaged copies beside the file
trap 'rm -rf "$dir"' EXIT
ref="$here/tools/reference/gpt_ref.py"
OMP_NUM_THREADS=1 /usr/bin/python3 "$ref" write-hf "$dir/gpt2_lm_head.safetensors"
OMP_NUM_THREADS=1 /usr/bin/python3 "$ref" write-hf --no-prefix --seed 1 "$dir/gpt2_model.safetensors"
"$1" "$dir/gpt2_lm_head.safetensors"
"$1" "$dir/gpt2_model.safetensors"
