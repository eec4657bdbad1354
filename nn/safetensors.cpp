// Safetensors reading and writing (format in safetensors.h), and atomic file writes.
#include "nn/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ops/factory.h"
#include "ops/kernels.h"

namespace tapestry::nn {

namespace {

const char* st_dtype(DType t) {
  switch (t) {
    case DType::Float32: return "F32";
    case DType::Float64: return "F64";
    case DType::Int64: return "I64";
    case DType::Bool: return "BOOL";
  }
  return "?";
}

bool parse_dtype(const std::string& s, DType& out) {
  if (s == "F32") out = DType::Float32;
  else if (s == "F64") out = DType::Float64;
  else if (s == "I64") out = DType::Int64;
  else if (s == "BOOL") out = DType::Bool;
  else return false;
  return true;
}

}  // namespace

std::map<std::string, Tensor> SafetensorsFile::as_map() const {
  return std::map<std::string, Tensor>(tensors.begin(), tensors.end());
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  TP_CHECK(fd >= 0, "save: cannot create {}: {}", tmp, std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw Error(fmt::format("save: writing {} failed after {} of {} bytes: {}", path, done, bytes.size(),
                              std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw Error(fmt::format("save: flushing {} failed: {}", path, std::strerror(err)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw Error(fmt::format("save: cannot rename {} to {}: {}", tmp, path, std::strerror(err)));
  }
}

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<Tensor> contiguous;
  size_t offset = 0;
  for (auto& [name, t] : tensors) {
    TP_CHECK(!header.contains(name), "save_safetensors: tensor name '{}' appears twice", name);
    Tensor c = kernels::contiguous(t);
    size_t nbytes = static_cast<size_t>(c.numel()) * dtype_size(c.dtype());
    header[name] = {{"dtype", st_dtype(c.dtype())}, {"shape", c.sizes()}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    contiguous.push_back(c);
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // the format pads the header to 8 bytes
  std::string bytes;
  bytes.reserve(8 + json.size() + offset);
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  bytes += json;
  for (const Tensor& c : contiguous)
    bytes.append(static_cast<const char*>(c.raw_data()), static_cast<size_t>(c.numel()) * dtype_size(c.dtype()));
  write_file_atomic(path, bytes);
}

SafetensorsFile load_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TP_CHECK(in.good(), "load_safetensors: cannot open {}: {}", path, std::strerror(errno));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  TP_CHECK(bytes.size() >= 8, "load_safetensors: {} is not a safetensors file ({} bytes, too short)", path,
           bytes.size());
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  TP_CHECK(n <= bytes.size() - 8, "load_safetensors: {} is not a safetensors file (header length {} exceeds the file)",
           path, n);
  nlohmann::ordered_json header;
  try {
    header = nlohmann::ordered_json::parse(bytes.substr(8, n));
  } catch (const std::exception& e) {
    throw Error(fmt::format("load_safetensors: {} has a malformed header: {}", path, e.what()));
  }
  TP_CHECK(header.is_object(), "load_safetensors: {} has a malformed header (not a JSON object)", path);
  const size_t data_start = 8 + n, data_size = bytes.size() - data_start;
  SafetensorsFile file;
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      for (auto& [k, v] : entry.items())
        if (v.is_string()) file.metadata[k] = v.get<std::string>();
      continue;
    }
    try {
      DType dtype;
      TP_CHECK(parse_dtype(entry.at("dtype").get<std::string>(), dtype),
               "load_safetensors: {}: tensor '{}' has unsupported dtype {}", path, name,
               entry.at("dtype").get<std::string>());
      Shape shape = entry.at("shape").get<Shape>();
      auto offs = entry.at("data_offsets").get<std::vector<uint64_t>>();
      TP_CHECK(offs.size() == 2 && offs[0] <= offs[1] && offs[1] <= data_size,
               "load_safetensors: {}: tensor '{}' has data offsets outside the file", path, name);
      TP_CHECK(static_cast<uint64_t>(shape_numel(shape)) * dtype_size(dtype) == offs[1] - offs[0],
               "load_safetensors: {}: tensor '{}' of shape {} does not match its {} data bytes", path, name, shape,
               offs[1] - offs[0]);
      Tensor t = empty(shape, dtype);
      std::memcpy(t.raw_data(), bytes.data() + data_start + offs[0], offs[1] - offs[0]);
      file.tensors.emplace_back(name, t);
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("load_safetensors: {}: tensor '{}' has a malformed entry: {}", path, name, e.what()));
    }
  }
  return file;
}

}  // namespace tapestry::nn
