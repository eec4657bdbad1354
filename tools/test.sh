#!/usr/bin/env bash
# Sets everything up, builds a Release build in build/ and runs the whole test suite.
#   tools/test.sh                       # the default run (CI calls this)
#   TAPESTRY_SANITIZE=ON tools/test.sh  # the same suite under ASan+UBSan, in build-sanitize/
set -euo pipefail
cd "$(dirname "$0")/.."

tools/setup.sh
tools/setup-reference.sh

sanitize="${TAPESTRY_SANITIZE:-OFF}"
build_dir=build
build_type=Release
if [ "$sanitize" = "ON" ]; then
  build_dir=build-sanitize
  build_type=RelWithDebInfo
fi
jobs="$(nproc)"

cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE="$build_type" -DTAPESTRY_SANITIZE="$sanitize" >/dev/null
cmake --build "$build_dir" -j "$jobs"
cd "$build_dir"
# One test at a time: each uses every core through OpenMP and OpenBLAS, and two at once on two
# cores oversubscribe them (spinning OpenMP threads made the copy-task tests 20x slower).
ctest --output-on-failure -j1 ${CTEST_ARGS:-}
