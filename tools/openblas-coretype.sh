#!/usr/bin/env bash
# Prints the OPENBLAS_CORETYPE that names this CPU's vector ISA (SkylakeX for AVX-512, Haswell for
# AVX2, nothing otherwise), for the scripts that race PyTorch: Debian's OpenBLAS 0.3.21 runs its
# SSE3 kernels on CPU models newer than it knows (docs/benchmarks.md), so they probe with and
# without this setting and give PyTorch the faster.
if grep -qw avx512f /proc/cpuinfo; then echo SkylakeX
elif grep -qw avx2 /proc/cpuinfo; then echo Haswell; fi
