#!/usr/bin/env bash
# The second-order examples against PyTorch (issue 45): each writes its dump, and
# tools/reference/second_order_ref.py recomputes the loss and every gradient in float64.
# autograd::functional too (tests/functional_dump.cpp).
#   tests/second_order.sh GRADIENT_PENALTY_BINARY MAML_SINE_BINARY FUNCTIONAL_DUMP_BINARY
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$1" "$work/penalty.safetensors"
OMP_NUM_THREADS=1 /usr/bin/python3 "$here/tools/reference/second_order_ref.py" "$work/penalty.safetensors"
"$2" "$work/maml.safetensors"
OMP_NUM_THREADS=1 /usr/bin/python3 "$here/tools/reference/second_order_ref.py" "$work/maml.safetensors"
"$3" "$work/functional.safetensors"
OMP_NUM_THREADS=1 /usr/bin/python3 "$here/tools/reference/second_order_ref.py" "$work/functional.safetensors"
