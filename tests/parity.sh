#!/usr/bin/env bash
# The PyTorch parity test: parity_dump writes the model, a batch and tapestry's results; the
# reference recomputes them in PyTorch and fails on any mismatch.
#   tests/parity.sh PARITY_DUMP_BINARY post|pre separate|shared
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
dump="$(mktemp --suffix=.safetensors)"
trap 'rm -f "$dump"' EXIT
"$1" "$dump" "$2" "$3"
OMP_NUM_THREADS=1 /usr/bin/python3 "$here/tools/reference/transformer_ref.py" "$dump"
