#!/usr/bin/env bash
# A PyTorch parity test: BINARY writes a small model, a batch and tapestry's results (logits,
# loss, gradients, optimizer steps) to a dump file; the reference script recomputes them in
# PyTorch and fails on any mismatch.
#   tests/parity.sh BINARY REFERENCE [ARG...]
# `BINARY DUMP ARG...` writes the dump; REFERENCE is a script of tools/reference/ with the words
# it takes before the dump ("gpt_ref.py check").
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
dump="$(mktemp --suffix=.safetensors)"
trap 'rm -f "$dump"' EXIT
binary="$1"
read -ra reference <<<"$2"
shift 2
"$binary" "$dump" "$@"
OMP_NUM_THREADS=1 /usr/bin/python3 "$here/tools/reference/${reference[0]}" "${reference[@]:1}" "$dump"
