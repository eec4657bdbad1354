#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz/ with clang (ASan + UBSan) in build-fuzz/ and runs
# each for SECONDS seconds, on its seed inputs written out into build-fuzz/corpus/ (the repository is
# never written).
#   tools/fuzz.sh 60            # every target, one minute each
#   FUZZ_TARGETS="fuzz_views" tools/fuzz.sh 300
# Per target it prints the executions libFuzzer made and a summary line
#   fuzz <target>: N execs in S s, OK|CRASH
# and, for a crash, the sanitizer report's tail and the input that triggered it (kept under
# build-fuzz/artifacts/<target>/). Exits non-zero when any target crashed.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -ne 1 ] || ! [[ "$1" =~ ^[0-9]+$ ]] || [ "$1" -eq 0 ]; then
  echo "usage: tools/fuzz.sh SECONDS   (how long to fuzz each target)" >&2
  exit 2
fi
seconds="$1"

tools/setup.sh

# clang with libFuzzer and the sanitizer runtimes (libclang-rt-14-dev on Debian 12). The fuzz build
# runs the kernels on one thread (TAPESTRY_OPENMP=OFF): no OpenMP runtime for clang is needed.
tools/setup.sh --fuzz

build_dir=build-fuzz
CC=clang CXX=clang++ cmake -S . -B "$build_dir" -DTAPESTRY_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DTAPESTRY_NATIVE=OFF -DTAPESTRY_OPENMP=OFF -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" >/dev/null
cmake --build "$build_dir" --target fuzz_all -j "$(nproc)"

read -r -a targets <<<"${FUZZ_TARGETS:-fuzz_safetensors fuzz_text fuzz_config fuzz_bleu fuzz_views}"
# One thread: the inputs are tiny, and a thread pool per process only adds noise to the sanitizers.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

failed=()
summary=()
for target in "${targets[@]}"; do
  binary="$build_dir/tests/fuzz/$target"
  if [ ! -x "$binary" ]; then
    binary="$(find "$build_dir" -type f -name "$target" -perm -u+x | sed -n 1p)"
  fi
  if [ -z "$binary" ] || [ ! -x "$binary" ]; then
    echo "fuzz: $target was not built" >&2
    exit 1
  fi
  corpus="$build_dir/corpus/$target"
  artifacts="$build_dir/artifacts/$target"
  log="$build_dir/logs/$target.log"
  mkdir -p "$corpus" "$artifacts" "$(dirname "$log")"
  # The seeds (tests/fuzz/seeds/<target>.hex) join whatever earlier runs found; libFuzzer adds new
  # inputs here, not in the repository.
  tests/fuzz/seeds.sh "$target" "$corpus"

  echo "fuzz: running $target for ${seconds}s (log: $log)"
  start=$(date +%s)
  status=0
  "$binary" -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$artifacts/" "$corpus" >"$log" 2>&1 || status=$?
  elapsed=$(( $(date +%s) - start ))

  # -print_final_stats=1 ends the log with stat::number_of_executed_units; should a crash cut
  # that short, the last "#N" progress line gives the count so far.
  execs="$( (grep -a '^stat::number_of_executed_units:' "$log" || true) | tail -n 1 | awk '{print $2}')"
  if [ -z "$execs" ]; then
    execs="$( (grep -aoE '^#[0-9]+' "$log" || true) | tail -n 1 | tr -d '#')"
  fi
  execs="${execs:-?}"
  echo "  $target: $execs executions (stat::number_of_executed_units)"

  # Inputs libFuzzer saved: crash-, leak-, timeout-, oom- (a failure) or slow-unit- (a note).
  written="$( (grep -a 'Test unit written to ' "$log" || true) | sed 's/.*Test unit written to //')"
  crash_files="$(printf '%s\n' "$written" | grep -v '/slow-unit-' | sed '/^$/d' || true)"
  slow_files="$(printf '%s\n' "$written" | grep '/slow-unit-' || true)"
  if [ -n "$slow_files" ]; then
    echo "  $target: slow inputs (over 10 s each): $(tr '\n' ' ' <<<"$slow_files")"
  fi
  if [ "$status" -ne 0 ]; then
    echo "  $target: CRASH (libFuzzer exit status $status); the end of its log:"
    tail -n 40 "$log" | sed 's/^/    /'
    if [ -n "$crash_files" ]; then
      while IFS= read -r f; do
        if [ -n "$f" ]; then echo "  crashing input: $f   (reproduce: $binary $f)"; fi
      done <<<"$crash_files"
    else
      echo "  crashing input: none written (see $log)"
    fi
    failed+=("$target")
    summary+=("fuzz $target: $execs execs in $elapsed s, CRASH")
  else
    summary+=("fuzz $target: $execs execs in $elapsed s, OK")
  fi
done

echo
printf '%s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: crashes in ${failed[*]}" >&2
  exit 1
fi
