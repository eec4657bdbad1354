// Reading IDX files, the format of MNIST and Fashion-MNIST: two zero bytes, a type byte, the
// rank, the sizes as big-endian 32-bit integers, then the values (big-endian), row-major. Plain
// or gzip-compressed files read alike (zlib).
#pragma once
#include <string>

#include "tapestry/ops/tensor.h"

namespace tapestry::data {

// The file's values as `dtype` (unsigned bytes, MNIST's images and labels, become 0..255). Types
// read: ubyte (0x08), byte (0x09), short (0x0B), int (0x0C), float (0x0D), double (0x0E). Throws a
// tapestry::Error naming the file for a wrong magic number, a type it does not know, a truncated
// file or bytes past the declared values.
Tensor read_idx(const std::string& path, DType dtype = DType::Float32);

// One split of an MNIST-layout folder: DIR/{train,t10k}-images-idx3-ubyte[.gz] and the
// matching -labels-idx1-ubyte[.gz]. Images [N, 1, H, W] float32 scaled to [0, 1], labels [N]
// int64. Throws naming both files when their counts differ, and a file of the wrong rank.
struct ImageSet {
  Tensor images, labels;
};
ImageSet read_mnist(const std::string& dir, bool train);

}  // namespace tapestry::data
