#!/usr/bin/env bash
# The GPU kit: everything a lent GPU machine needs to run tools/gpu-window.sh, built here.
#
# The GPU machine (docs/cuda.md, "On a GPU") has nvcc, CMake, g++, the CUDA libraries and a CUDA
# PyTorch under `python3`, but no Debian development packages and no network. So the CUDA variant
# is built on this (CPU) machine and carried, with the shared libraries it needs that the GPU
# machine lacks, in one git-ignored folder (default .gpu-kit, under 50 MiB):
#   kit.tar.xz  bin/ and lib/, compressed (OpenBLAS alone is 36 MiB unpacked); the window unpacks
#             it into /tmp/tapestry-kit:
#     bin/    tapestry (the command line) and device_check, built with -DTAPESTRY_CUDA=ON,
#             -DTAPESTRY_NATIVE=OFF (portable x86-64), sm_90 only, -lineinfo (compute-sanitizer's
#             file:line), without MPI and oneDNN
#     lib/    every library `ldd` resolves for them, less glibc, libstdc++/libgcc_s and the CUDA
#             libraries (cudart, cuBLAS: the GPU machine's own toolkit provides those, matched to
#             its driver)
#   data/     the Multi30k files the window's short training reads
#   debs/     the Debian packages of the build's dependencies, for the fallback: should a carried
#             binary not start there, gpu-window.sh unpacks them with `dpkg -x` into a prefix under
#             /tmp (never into /) and builds there
#   MANIFEST  the commit, the flags, each file's size
# The Python reference scripts (tools/reference/) travel with the tracked tree.
#
#   tools/gpu-kit.sh pack [BUILD_DIR]   build (default build-cuda) and gather into .gpu-kit
#   tools/gpu-kit.sh check              run tools/gpu-window.sh against the kit in a simulated bare
#                                       machine: a mount namespace where every library the kit
#                                       carries is hidden at its system path, an empty environment;
#                                       it must get as far as a machine without a GPU can (every
#                                       binary starts, device_check says "no GPU" and exits 77, the
#                                       bench and Python stages say why they cannot run)
# TAPESTRY_KIT names another folder for both.
set -euo pipefail
cd "$(dirname "$0")/.."

kit="${TAPESTRY_KIT:-.gpu-kit}"
limit_mib=50

# glibc's and GCC's runtime libraries (the GPU machine has its own, newer: it has g++, and its
# profilers and sanitizers need its libstdc++, not an older one) and the CUDA libraries (its toolkit's).
system_lib() {
  case "$(basename "$1")" in
    ld-linux*|libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libresolv.so*|libutil.so*) return 0 ;;
    libstdc++.so*|libgcc_s.so*) return 0 ;;
    libcudart.so*|libcublas.so*|libcublasLt.so*|libnccl.so*|libcuda.so*|linux-vdso*) return 0 ;;
  esac
  return 1
}

# The libraries `ldd` resolves for the binaries in $1, one path a line, the system's left out.
needed_libs() {
  for b in "$1"/*; do
    # "libfoo.so.1 => /usr/lib/.../libfoo.so.1 (0x...)"; CUDA's may be "not found" here: fine.
    ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $3}'
  done | sort -u | while read -r lib; do system_lib "$lib" || echo "$lib"; done
}

pack() {
  local build="${1:-build-cuda}"
  tools/setup.sh
  local nvcc=/usr/local/cuda/bin/nvcc
  [ -x "$nvcc" ] || nvcc="$(command -v nvcc || true)"
  if [ -z "$nvcc" ]; then
    echo "gpu-kit: no CUDA toolkit (nvcc at /usr/local/cuda/bin): cannot build the kit" >&2
    exit 1
  fi
  local flags=(-DCMAKE_BUILD_TYPE=Release -DTAPESTRY_CUDA=ON -DTAPESTRY_NATIVE=OFF -DCMAKE_CUDA_ARCHITECTURES=90
               -DCMAKE_CUDA_FLAGS=-lineinfo -DTAPESTRY_MPI=OFF -DTAPESTRY_ONEDNN=OFF -DTAPESTRY_INSTALL=OFF)
  cmake -S . -B "$build" "${flags[@]}" >/dev/null
  cmake --build "$build" -j "$(nproc)" --target tapestry_cli device_check

  rm -rf "$kit"
  local stage
  stage="$(mktemp -d)"
  mkdir -p "$stage/bin" "$stage/lib" "$kit/data/multi30k" "$kit/debs"
  cp "$build/tapestry" "$build/device_check" "$stage/bin/"
  strip --strip-unneeded "$stage"/bin/*  # host symbols only; the device code keeps its line tables
  needed_libs "$stage/bin" | while read -r lib; do cp -L "$lib" "$stage/lib/"; done
  tar -C "$stage" -cf - bin lib | xz -6 -T0 >"$kit/kit.tar.xz"
  (cd "$stage" && find bin lib -type f -printf '%s\t%p (in kit.tar.xz)\n' | sort -k2) >"$kit/contents"
  rm -rf "$stage"

  local data="${TAPESTRY_DATA:-../shared/data/multi30k}"
  for split in train val test_2016_flickr; do
    for lang in de en; do cp "$data/$split.$lang.gz" "$kit/data/multi30k/"; done
  done

  # The fallback's packages: the build's dependencies and what they pull in that a bare
  # Ubuntu-like image lacks. Downloaded from Debian's archive (apt's cache), never installed.
  local debs=(libfmt-dev libfmt9 libopenblas-openmp-dev libopenblas0-openmp libopenblas-dev libgfortran5
              nlohmann-json3-dev libcli11-dev doctest-dev zlib1g-dev libsentencepiece-dev libsentencepiece0
              libprotobuf-lite32)
  (cd "$kit/debs" && apt-get download "${debs[@]}" >/dev/null 2>&1) ||
    { apt-get update -qq >/dev/null && (cd "$kit/debs" && apt-get download "${debs[@]}" >/dev/null); }

  {
    echo "tapestry GPU kit, made $(date -u +%Y-%m-%dT%H:%MZ) on $(uname -m) from commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD 2>/dev/null || echo '+uncommitted')"
    echo "cmake ${flags[*]}"
    echo "nvcc: $("$nvcc" --version | tail -1)"
    echo "g++: $(g++ --version | head -1); glibc $(ldd --version | head -1 | awk '{print $NF}')"
    echo "the GPU machine provides: glibc, libstdc++ (GLIBCXX_3.4.30 or later), libcudart.so.13, libcublas.so.13, libcublasLt.so.13"
    cat "$kit/contents"
    (cd "$kit" && find . -type f ! -name MANIFEST ! -name contents -printf '%s\t%p\n' | sort -k2)
  } >"$kit/MANIFEST"
  rm "$kit/contents"
  local mib=$(( $(du -sb "$kit" | cut -f1) / 1048576 ))
  echo "gpu-kit: $kit holds $(find "$kit" -type f | wc -l) files, $mib MiB (limit $limit_mib MiB)"
  if [ "$mib" -ge "$limit_mib" ]; then
    echo "gpu-kit: the kit is over $limit_mib MiB: it would not travel with the tree (64 MiB in all)" >&2
    exit 1
  fi
}

# The window on this machine, as on a bare GPU machine without a GPU: a private mount namespace in
# which every library the kit carries is hidden at its system path (so a library the kit forgot
# fails to load, as it would there), run with an empty environment.
check() {
  [ -f "$kit/kit.tar.xz" ] || { echo "gpu-kit: no kit in $kit: run tools/gpu-kit.sh pack first" >&2; exit 1; }
  local out
  out="$(mktemp -d)"
  local hide=()
  for lib in $(tar -tJf "$kit/kit.tar.xz" | grep '^lib/.'); do
    for sys in /usr/lib/x86_64-linux-gnu/"$(basename "$lib")" /lib/x86_64-linux-gnu/"$(basename "$lib")"; do
      [ -e "$sys" ] && hide+=("$(readlink -f "$sys")")
    done
  done
  # shellcheck disable=SC2016
  unshare -m --propagation private bash -c '
    for f in "${@:2}"; do mount --bind /dev/null "$f"; done
    exec env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/tmp OUT="$1" GPU_WINDOW_SECONDS=120 \
      TAPESTRY_KIT="'"$kit"'" bash tools/gpu-window.sh' _ "$out" "${hide[@]}" || true
  # What a machine without a GPU must show: every binary starts and every library resolves, the
  # suite skips with exit 77 (a failure of the window), and the GPU stages say why they cannot run.
  local summary="$out/summary.txt" ok=1
  expect() {
    if grep -qE "$1" "$summary"; then echo "gpu-kit check: ok: $2"; else echo "gpu-kit check: FAIL: $2 (no /$1/)"; ok=0; fi
  }
  if [ ! -f "$summary" ]; then
    echo "gpu-kit check: FAIL: the window wrote no summary.txt" >&2
    exit 1
  fi
  cat "$summary"
  expect '^probe +ok' "the probe: both binaries start, ldd finds every library"
  expect '^device_check +FAIL .*exit 77' "device_check cuda exits 77 (no GPU), counted as a failure"
  expect '^sanitizers +skipped .*no GPU' "the sanitizers are skipped for want of a GPU"
  expect '^race +skipped .*no GPU' "the race says why it cannot run"
  expect '^attention +skipped .*no GPU' "the attention benchmark says why it cannot run"
  expect '^train +skipped .*no GPU' "the Multi30k training says why it cannot run"
  grep -q "no usable CUDA device\|no CUDA device\|driver" "$out/device_check.txt" ||
    { echo "gpu-kit check: FAIL: device_check.txt does not say why there is no GPU"; ok=0; }
  local files
  files=$(find "$out" -type f | wc -l)
  [ "$files" -le 8 ] || { echo "gpu-kit check: FAIL: the window wrote $files files (at most 8 come back)"; ok=0; }
  rm -rf "$out"
  fallback_check || ok=0
  [ "$ok" = 1 ] || exit 1
  echo "gpu-kit check: passed"
}

# The fallback's build on this machine with Debian's copies of its packages hidden (each file they
# installed covered by /dev/null, so a header or library found there instead of the prefix breaks
# the build): the configure, and one object for each dependency's headers.
fallback_check() {
  local files=() pkg
  for deb in "$kit"/debs/*.deb; do
    pkg="$(dpkg-deb -f "$deb" Package)"
    while read -r f; do [ -f "$f" ] && [ ! -L "$f" ] && files+=("$f"); done < <(dpkg -L "$pkg" 2>/dev/null || true)
  done
  local build
  build="$(mktemp -d)"
  local objects=(CMakeFiles/tapestry.dir/ops/cpu/gemm.cpp.o          # cblas.h, fmt
                 CMakeFiles/tapestry.dir/nn/safetensors.cpp.o        # nlohmann-json, zlib
                 CMakeFiles/tapestry_apps.dir/apps/data/subword.cpp.o  # SentencePiece
                 CMakeFiles/tapestry_cli_objects.dir/tools/main.cpp.o  # CLI11
                 CMakeFiles/tapestry_tests.dir/tests/main.cpp.o)     # doctest
  if unshare -m --propagation private bash -c '
      for f in "${@:4}"; do mount --bind /dev/null "$f"; done
      tools/gpu-fallback.sh "$1" "$2/prefix" "$2/build" $3' _ "$kit" "$build" "${objects[*]}" "${files[@]}"       >"$build/log" 2>&1; then
    echo "gpu-kit check: ok: the fallback configures and compiles against the kit's .deb files alone (${#files[@]} system files hidden)"
    rm -rf "$build"
  else
    tail -20 "$build/log"
    echo "gpu-kit check: FAIL: the fallback build from the kit's .deb files (log: $build/log)"
    return 1
  fi
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  check) check ;;
  *) echo "usage: tools/gpu-kit.sh pack [BUILD_DIR] | check" >&2; exit 2 ;;
esac
