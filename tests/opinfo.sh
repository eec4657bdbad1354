#!/usr/bin/env bash
# Differential test against PyTorch: opinfo_dump runs every sample of the OpInfo table (and
# optionally random op programs) through tapestry; the reference replays each case in PyTorch
# and fails on any mismatch in errors, values or gradients.
#   tests/opinfo.sh OPINFO_DUMP_BINARY [--seed N] [--random-programs N]
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
dump="$(mktemp --suffix=.safetensors)"
trap 'rm -f "$dump"' EXIT
bin="$1"
shift
"$bin" "$dump" "$@"
OMP_NUM_THREADS=1 /usr/bin/python3 "$here/tools/reference/opinfo_ref.py" "$dump"
