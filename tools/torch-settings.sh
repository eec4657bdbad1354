#!/usr/bin/env bash
# Prints the environment settings the PyTorch races probe (tools/bench-compare.sh,
# tools/decode-race.sh), one per line: OMP_WAIT_POLICY PASSIVE or ACTIVE, each with OpenBLAS's own
# kernels and with OPENBLAS_CORETYPE naming the CPU's vector ISA (tools/openblas-coretype.sh), and
# each of those with glibc's heap on transparent huge pages, which tapestry's command line asks
# for (tools/main.cpp, Note [huge pages]). The races give PyTorch the fastest.
set -euo pipefail
cd "$(dirname "$0")/.."
isa="$(tools/openblas-coretype.sh)"
settings=("OMP_WAIT_POLICY=PASSIVE" "OMP_WAIT_POLICY=ACTIVE")
[ -n "$isa" ] && settings+=("OMP_WAIT_POLICY=PASSIVE OPENBLAS_CORETYPE=$isa" "OMP_WAIT_POLICY=ACTIVE OPENBLAS_CORETYPE=$isa")
for s in "${settings[@]}"; do settings+=("$s GLIBC_TUNABLES=glibc.malloc.hugetlb=1"); done
printf '%s\n' "${settings[@]}"
