#!/usr/bin/env bash
# Installs what the PyTorch reference scripts need (Debian's python3-torch, run with
# /usr/bin/python3): the parity test and the benchmarks compare against it. Idempotent.
exec "$(dirname "$0")/setup.sh" --reference
