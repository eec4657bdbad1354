#!/usr/bin/env bash
# The ViT PyTorch parity test: vit_parity_dump writes a small ViT, a batch and tapestry's
# results (logits, loss, gradients, one AdamW step); tools/reference/vit_ref.py recomputes them
# with torch.nn.TransformerEncoderLayer and fails on any mismatch.
#   tests/vit_parity.sh VIT_PARITY_DUMP_BINARY
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
dump="$(mktemp --suffix=.safetensors)"
trap 'rm -f "$dump"' EXIT
"$1" "$dump"
OMP_NUM_THREADS=1 /usr/bin/python3 "$here/tools/reference/vit_ref.py" check "$dump"
