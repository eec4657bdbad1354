#!/usr/bin/env bash
# The library as its users get it (ctest `install_consumer`, label `install`):
#  1. `cmake --install BUILD --prefix P` into a temporary prefix; the package must not carry
#     -march=native (nor any flag of ours) to consumers;
#  2. the standalone project examples/ configures with find_package(tapestry), builds, and its
#     programs run;
#  3. the same example compiles by hand with pkg-config's flags, as docs/api.md shows;
#  4. as a subproject (add_subdirectory) tapestry configures the library alone: no tests, no tools;
#  5. the README's C++ example compiles against the package and runs;
#  6. only public headers are installed, each compiles on its own, the engine's consumer configures
#     with MPI hidden, and find_package(tapestry COMPONENTS dist) gives tapestry::dist.
# Usage: tools/test-install.sh BUILD_DIR
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "$1" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
for f in include/tapestry/tapestry.h include/tapestry/version.h include/tapestry/nn/layers.h \
         lib/cmake/tapestry/tapestryConfig.cmake lib/cmake/tapestry/tapestryConfigVersion.cmake lib/pkgconfig/tapestry.pc; do
  [[ -f $tmp/prefix/$f ]] || { echo "FAIL: the install has no $f"; exit 1; }
done
for internal in ops/cpu ops/cuda ops/detail; do
  [[ ! -e $tmp/prefix/include/tapestry/$internal ]] || { echo "FAIL: the internal headers of $internal were installed"; exit 1; }
done
# Every installed header compiles on its own: the package is its public API, nothing it includes is missing.
fails=0
while read -r h; do
  echo "#include <tapestry/${h#"$tmp/prefix/include/tapestry/"}>" >"$tmp/one.cpp"
  g++ -std=c++17 -fsyntax-only -I"$tmp/prefix/include" "$tmp/one.cpp" 2>"$tmp/one.err" ||
    { echo "FAIL: the installed ${h#"$tmp/prefix/include/"} does not compile on its own:"; head -5 "$tmp/one.err"; fails=1; }
done < <(find "$tmp/prefix/include/tapestry" -name '*.h' | sort)
[[ $fails == 0 ]] || exit 1
if grep -rn -e '-march' -e '-Wall' -e 'fsanitize' "$tmp/prefix/lib/cmake/tapestry" "$tmp/prefix/lib/pkgconfig"; then
  echo "FAIL: the installed package passes our private compile flags on to consumers"; exit 1
fi

# MPI is hidden from the consumer: the engine alone must not need it (only the dist component does).
cmake -S "$src/examples" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON --no-warn-unused-cli >/dev/null
cmake --build "$tmp/consumer" -j "$(nproc)" >/dev/null
(cd "$tmp/consumer" && ctest --output-on-failure)
"$tmp/consumer/custom_op"

# The dist component, asked for by name: tapestry::dist (with MPI where the build had it).
mkdir -p "$tmp/dist"
cat > "$tmp/dist/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.20)
project(dist_consumer LANGUAGES CXX)
find_package(tapestry REQUIRED COMPONENTS dist)
add_executable(ranks ranks.cpp)
target_link_libraries(ranks PRIVATE tapestry::dist)
CMAKE
cat > "$tmp/dist/ranks.cpp" <<'CPP'
#include <tapestry/dist/dist.h>
#include <cstdio>
int main() { std::printf("rank %d of %d\n", tapestry::dist::rank(), tapestry::dist::world_size()); }
CPP
cmake -S "$tmp/dist" -B "$tmp/dist/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/dist/build" >/dev/null
"$tmp/dist/build/ranks"
# ... and through pkg-config's tapestry-dist.
g++ -std=c++17 -O1 "$tmp/dist/ranks.cpp" -o "$tmp/dist/ranks_pc" \
    $(PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig" pkg-config --cflags --libs tapestry-dist)
"$tmp/dist/ranks_pc" >/dev/null

# By hand, with pkg-config (docs/api.md: "Install and link").
export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig"
g++ -std=c++17 -O2 "$src/examples/mlp.cpp" -o "$tmp/mlp" $(pkg-config --cflags --libs tapestry)
"$tmp/mlp" | tail -1
# The README's model, as a newcomer would paste it.
awk '/^```cpp$/{on=1; next} /^```$/{if (on) exit} on' "$src/README.md" >"$tmp/readme.cpp"
g++ -std=c++17 -O1 "$tmp/readme.cpp" -o "$tmp/readme" $(pkg-config --cflags --libs tapestry)
(cd "$tmp" && ./readme && [[ -s classifier.safetensors ]]) || { echo "FAIL: the README's example does not run"; exit 1; }

# As a subproject: only the library target, unless asked.
mkdir -p "$tmp/sub"
cat > "$tmp/sub/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.20)
project(sub LANGUAGES CXX)
add_subdirectory("$src" tapestry)
foreach(t tapestry_tests tapestry_cli tapestry_apps)
  if(TARGET \${t})
    message(FATAL_ERROR "add_subdirectory(tapestry) made the target \${t}")
  endif()
endforeach()
if(NOT TARGET tapestry::tapestry)
  message(FATAL_ERROR "add_subdirectory(tapestry) gave no tapestry::tapestry")
endif()
CMAKE
cmake -S "$tmp/sub" -B "$tmp/sub/build" >/dev/null
echo "install_consumer: installed, found by find_package and pkg-config, built and ran; subproject builds the library only"
