#!/usr/bin/env bash
# The GPT PyTorch parity test: gpt_parity_dump writes a small GPT, a batch and tapestry's
# results (logits, loss, gradients, two AdamW steps); the reference recomputes them in PyTorch
# and fails on any mismatch.
#   tests/gpt_parity.sh GPT_PARITY_DUMP_BINARY
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
dump="$(mktemp --suffix=.safetensors)"
trap 'rm -f "$dump"' EXIT
"$1" "$dump"
OMP_NUM_THREADS=1 /usr/bin/python3 "$here/tools/reference/gpt_ref.py" check "$dump"
