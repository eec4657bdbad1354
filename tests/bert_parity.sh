#!/usr/bin/env bash
# The encoder-only text model's PyTorch parity test, pre-norm and post-norm: bert_parity_dump
# writes the model, a masked batch and tapestry's results; tools/reference/bert_ref.py recomputes
# them with torch.nn.TransformerEncoderLayer and fails on any mismatch.
#   tests/bert_parity.sh BERT_PARITY_DUMP_BINARY
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
dump="$(mktemp --suffix=.safetensors)"
trap 'rm -f "$dump"' EXIT
for norm in pre post; do
  "$1" "$dump" "$norm"
  OMP_NUM_THREADS=1 /usr/bin/python3 "$here/tools/reference/bert_ref.py" check "$dump"
done
