#!/usr/bin/env bash
# The Llama PyTorch parity test: the reference writes tiny random Llamas with grouped-query
# attention as Hugging Face checkpoint directories (float32 in one file with an untied head;
# bfloat16 in three shards with an index and a tied head); llama_hf_check loads each with
# models::load_llama_hf, checks its damaged copies are refused, and dumps logits, loss, gradients,
# an AdamW step and greedy generations; the reference recomputes them in PyTorch.
#   tests/llama_parity.sh LLAMA_HF_CHECK_BINARY
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
ref="$here/tools/reference/llama_ref.py"
run() {  # NAME WRITE-HF-FLAGS...
  local name="$1"; shift
  OMP_NUM_THREADS=1 /usr/bin/python3 "$ref" write-hf "$work/$name" "$@"
  "$check" "$work/$name" "$work/$name.dump.safetensors"
  OMP_NUM_THREADS=1 /usr/bin/python3 "$ref" check "$work/$name" "$work/$name.dump.safetensors"
}
check="$1"
run f32 --dtype F32 --seed 1
run bf16-sharded --dtype BF16 --shards 3 --tie --seed 2
run f16 --dtype F16 --seed 3
