#!/usr/bin/env bash
# The image task end to end from the command line (tapestry train --task image):
#   tests/image_cli.sh TAPESTRY_BINARY
# 1. bad IDX folders: a wrong magic number, a truncated file, images and labels of different
#    counts, labels outside the class count, a missing or mismatched test split, a crop padding
#    as large as the image: each gives one line naming the problem, exit status 1, no run folder;
# 2. a small-data run on Fashion-MNIST (tiny config, 5000 images, 3 epochs): its train loss
#    falls, it reports a test accuracy well above chance and writes the confusion matrix.
set -euo pipefail
bin="$1"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
name=image_cli
source "$(dirname "$0")/cli_helpers.sh"

# An IDX file of unsigned bytes: idx DIMS... > file (values: 0, 1, 2, ... mod 256).
idx() {
  python3 - "$@" <<'PY'
import sys
dims = [int(d) for d in sys.argv[1:]]
n = 1
for d in dims: n *= d
sys.stdout.buffer.write(bytes([0, 0, 8, len(dims)]) + b"".join(d.to_bytes(4, "big") for d in dims)
                        + bytes(i % 256 for i in range(n)))
PY
}
make_dir() {  # make_dir NAME IMAGES LABELS: an MNIST-layout folder with N images of 4x4
  mkdir -p "$tmp/$1"
  idx "$2" 4 4 > "$tmp/$1/train-images-idx3-ubyte"
  idx "$3" > "$tmp/$1/train-labels-idx1-ubyte"
}
make_test() {  # make_test NAME IMAGES SIZE: the test split (t10k files) of SIZE x SIZE images
  idx "$2" "$3" "$3" > "$tmp/$1/t10k-images-idx3-ubyte"
  idx "$2" > "$tmp/$1/t10k-labels-idx1-ubyte"
}
expect_error() {  # expect_error NAME PATTERN [FLAGS...]: --task image on the folder NAME
  expect_refused "$1" "$2" --task image --data "$tmp/$1" "${@:3}"
}

make_dir magic 10 10
printf '\x00\x00\x99' | dd of="$tmp/magic/train-images-idx3-ubyte" bs=1 seek=0 conv=notrunc 2>/dev/null
expect_error magic "magic/train-images-idx3-ubyte: not an IDX file"
make_dir truncated 10 10
head -c 100 "$tmp/truncated/train-images-idx3-ubyte" > "$tmp/t" && mv "$tmp/t" "$tmp/truncated/train-images-idx3-ubyte"
expect_error truncated "truncated/train-images-idx3-ubyte: truncated: shape \[10, 4, 4\]"
make_dir counts 10 9
expect_error counts "holds 10 images but .*counts/train-labels-idx1-ubyte holds 9 labels"
expect_error missing "no train-images-idx3-ubyte.gz or train-images-idx3-ubyte"
# Issue 44: what was found only after the last epoch, or never, is refused before the first step.
make_dir labels 300 300  # labels 0..255 (i mod 256): a 256-class model, silently
make_test labels 10 4
expect_error labels "training labels in .* run from 0 to 255, outside the 10 classes; give --classes" --val-size 2
make_dir no_test 10 10
expect_error no_test "no t10k-images-idx3-ubyte.gz or t10k-images-idx3-ubyte" --val-size 2
make_dir test_size 10 10
make_test test_size 10 5
expect_error test_size "holds 5x5 test images but 4x4 training images" --val-size 2
make_dir crop 10 10
make_test crop 10 4
expect_error crop "crop-padding 1000 is not below the image size 4" --val-size 2 --crop-padding 1000

data="${TAPESTRY_IMAGE_DATA:-/usr/share/datasets/fashion-mnist}"
[ -e "$data/train-images-idx3-ubyte.gz" ] || [ -e "$data/train-images-idx3-ubyte" ] ||
  fail "no Fashion-MNIST in $data (tools/setup.sh installs Debian's dataset-fashion-mnist)"
"$bin" train --task image --data "$data" --config tiny --limit 5000 --val-size 1000 --epochs 3 --batch 64 --warmup 30 \
  --out "$tmp/run" --no-progress --threads 2 > "$tmp/log" 2>&1 || { cat "$tmp/log"; fail "the small run failed"; }
cat "$tmp/log" | grep -E "^epoch|^final"
first=$(grep -oP '^epoch 1: train loss \K[0-9.]+' "$tmp/log") || fail "no epoch 1 line"
second=$(grep -oP '^epoch 3: train loss \K[0-9.]+' "$tmp/log") || fail "no epoch 3 line"
acc=$(grep -oP '^final: test accuracy \K[0-9.]+' "$tmp/log") || fail "no final line"
python3 -c "import sys; sys.exit(0 if $second < $first else 1)" || fail "train loss did not fall: $first -> $second"
python3 -c "import sys; sys.exit(0 if $acc > 40 else 1)" || fail "test accuracy $acc% (chance is 10%)"
for f in confusion.txt confusion.svg curves.svg model.safetensors; do
  [ -s "$tmp/run/$f" ] || fail "the run wrote no $f"
done
echo "image_cli: ok (train loss $first -> $second, test accuracy $acc%)"
