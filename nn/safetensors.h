// The safetensors file format: 8 bytes (little-endian u64) giving the header length, a JSON
// header {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}, then
// the raw little-endian data. The same file loads in PyTorch with safetensors.torch.load_file.
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tapestry/ops/tensor.h"

namespace tapestry::nn {

struct SafetensorsFile {
  std::vector<std::pair<std::string, Tensor>> tensors;  // in file order
  std::map<std::string, std::string> metadata;
  std::map<std::string, Tensor> as_map() const;
};

// The format's name of a dtype: F32, F64, I64 or BOOL.
const char* safetensors_dtype(DType t);

// The metadata key holding the CRC-32 of the data section (8 hex digits). save_safetensors
// always writes it; load_safetensors verifies it when present (files from other tools lack it)
// and does not return it among the metadata.
inline constexpr const char* kChecksumKey = "tapestry.crc32";

// Writes atomically: a temp file beside `path`, flushed and fsync'd, then renamed over it, and
// the directory fsync'd. Any failure (full disk, bad directory) throws and leaves an existing
// file untouched.
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});
// Throws a tapestry::Error naming the file and the fault for anything malformed: not a regular
// file, a bad header, a repeated name, a shape that does not match its bytes, tensors that do
// not tile the data section exactly, or a checksum that does not match. BF16 and F16 tensors
// (as Hugging Face checkpoints store them) are read into float32, exactly.
SafetensorsFile load_safetensors(const std::string& path);

}  // namespace tapestry::nn
