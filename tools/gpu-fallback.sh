#!/usr/bin/env bash
# The GPU kit's fallback (tools/gpu-kit.sh): build tapestry on a machine without Debian's development
# packages, from the .deb files in KIT/debs, unpacked with `dpkg -x` into PREFIX (never into /).
#   tools/gpu-fallback.sh KIT PREFIX BUILD [TARGET...]   (default targets: tapestry_cli device_check)
# tools/gpu-window.sh runs it when a carried binary does not start; tools/gpu-kit.sh check runs its
# configure and one object per dependency with the system's copies of those packages hidden.
# Run the programs it builds with PREFIX/usr/lib/x86_64-linux-gnu{,/openblas-openmp} on
# LD_LIBRARY_PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
kit="$1" prefix="$2" build="$3"
shift 3
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(tapestry_cli device_check)

rm -rf "$prefix" && mkdir -p "$prefix"
for d in "$kit"/debs/*.deb; do dpkg -x "$d" "$prefix"; done
lib="$prefix/usr/lib/x86_64-linux-gnu"
# pkg-config files say prefix=/usr: the sysroot puts the unpacked tree in front of their paths.
export PKG_CONFIG_PATH="$lib/pkgconfig:$prefix/usr/share/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$prefix"
export LD_LIBRARY_PATH="$lib:$lib/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DTAPESTRY_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_CUDA_FLAGS=-lineinfo -DTAPESTRY_MPI=OFF -DTAPESTRY_ONEDNN=OFF -DTAPESTRY_INSTALL=OFF \
  -DCMAKE_PREFIX_PATH="$prefix/usr" -DCMAKE_INCLUDE_PATH="$prefix/usr/include/x86_64-linux-gnu" \
  -DCMAKE_LIBRARY_PATH="$lib/openblas-openmp;$lib" -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$lib"
cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"
