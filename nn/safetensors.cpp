// Safetensors reading and writing (format in safetensors.h).
#include "tapestry/nn/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tapestry/ops/autocast.h"
#include "tapestry/ops/factory.h"
#include "tapestry/ops/file.h"
#include "tapestry/ops/detail/kernels.h"

namespace tapestry::nn {

namespace {


// A dtype as the file stores it: one of tapestry's, or a 16-bit float (Hugging Face checkpoints
// are often bfloat16 or float16) that is read into float32.
struct Stored {
  DType dtype = DType::Float32;  // the tensor's dtype once loaded
  size_t bytes = 4;              // per element in the file
  enum class Half { None, BF16, F16 } half = Half::None;
};

bool parse_dtype(const std::string& s, Stored& out) {
  if (s == "F32") out = {DType::Float32, 4};
  else if (s == "F64") out = {DType::Float64, 8};
  else if (s == "I64") out = {DType::Int64, 8};
  else if (s == "BOOL") out = {DType::Bool, 1};
  else if (s == "BF16") out = {DType::Float32, 2, Stored::Half::BF16};
  else if (s == "F16") out = {DType::Float32, 2, Stored::Half::F16};
  else return false;
  return true;
}

// IEEE binary16 to float32, exact: subnormals, infinities and NaN (payload kept) included.
float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu, bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: shift the mantissa up until its leading 1 is the implicit bit
    exponent = 113;
    while (!(mantissa & 0x400u)) mantissa <<= 1, --exponent;
    bits = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// CRC-32 (zlib's) of the data section, fed in 1 GiB pieces because crc32's length is 32-bit.
std::string data_crc32(const char* data, size_t size) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (size_t done = 0; done < size;) {
    uInt piece = static_cast<uInt>(std::min<size_t>(size - done, size_t(1) << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data + done), piece);
    done += piece;
  }
  return fmt::format("{:08x}", static_cast<uint32_t>(crc));
}

}  // namespace

const char* safetensors_dtype(DType t) {
  switch (t) {
    case DType::Float32: return "F32";
    case DType::Float64: return "F64";
    case DType::Int64: return "I64";
    case DType::Bool: return "BOOL";
  }
  return "?";
}

std::map<std::string, Tensor> SafetensorsFile::as_map() const {
  return std::map<std::string, Tensor>(tensors.begin(), tensors.end());
}

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json entries = nlohmann::ordered_json::object();
  std::string data;
  for (auto& [name, t] : tensors) {
    TP_CHECK(name != "__metadata__" && !entries.contains(name), "save_safetensors: tensor name '{}' appears twice or is reserved", name);
    Tensor c = kernels::contiguous(t.detach().to(Device::CPU));  // GPU tensors are written from a host copy
    size_t nbytes = static_cast<size_t>(c.numel()) * dtype_size(c.dtype());
    entries[name] = {{"dtype", safetensors_dtype(c.dtype())}, {"shape", c.sizes()}, {"data_offsets", {data.size(), data.size() + nbytes}}};
    data.append(static_cast<const char*>(c.raw_data()), nbytes);
  }
  // The metadata carries a checksum of the data, which load_safetensors verifies.
  std::map<std::string, std::string> meta = metadata;
  meta[kChecksumKey] = data_crc32(data.data(), data.size());
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  header["__metadata__"] = meta;
  for (auto& [name, entry] : entries.items()) header[name] = entry;
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // the format pads the header to 8 bytes
  std::string bytes;
  bytes.reserve(8 + json.size() + data.size());
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  bytes += json;
  bytes += data;
  write_file_atomic(path, bytes);
}

SafetensorsFile load_safetensors(const std::string& path) {
  struct stat st {};
  TP_CHECK(::stat(path.c_str(), &st) == 0, "load_safetensors: cannot open {}: {}", path, std::strerror(errno));
  TP_CHECK(S_ISREG(st.st_mode), "load_safetensors: {} is not a regular file", path);
  std::string bytes;
  {
    int fd = ::open(path.c_str(), O_RDONLY);
    TP_CHECK(fd >= 0, "load_safetensors: cannot open {}: {}", path, std::strerror(errno));
    bytes.resize(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (done < bytes.size()) {
      ssize_t r = ::read(fd, bytes.data() + done, bytes.size() - done);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        int err = errno;
        ::close(fd);
        throw Error(fmt::format("load_safetensors: reading {} failed after {} of {} bytes: {}", path, done,
                                bytes.size(), r == 0 ? "the file shrank" : std::strerror(err)));
      }
      done += static_cast<size_t>(r);
    }
    ::close(fd);
  }
  TP_CHECK(bytes.size() >= 8, "load_safetensors: {} is not a safetensors file ({} bytes, too short)", path,
           bytes.size());
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  TP_CHECK(n <= bytes.size() - 8, "load_safetensors: {} is not a safetensors file (header length {} exceeds the file)",
           path, n);
  // A repeated tensor name would silently replace the first; the parser callback sees every key.
  std::set<std::string> keys;
  std::string duplicate;
  auto on_key = [&](int depth, nlohmann::ordered_json::parse_event_t event, nlohmann::ordered_json& parsed) {
    if (depth == 1 && event == nlohmann::ordered_json::parse_event_t::key && !keys.insert(parsed.get<std::string>()).second &&
        duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  nlohmann::ordered_json header;
  try {
    header = nlohmann::ordered_json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n), on_key);
  } catch (const std::exception& e) {
    throw Error(fmt::format("load_safetensors: {} has a malformed header: {}", path, e.what()));
  }
  TP_CHECK(duplicate.empty(), "load_safetensors: {}: the name '{}' appears twice in the header", path, duplicate);
  TP_CHECK(header.is_object(), "load_safetensors: {} has a malformed header (not a JSON object)", path);
  const size_t data_start = 8 + n, data_size = bytes.size() - data_start;
  SafetensorsFile file;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      TP_CHECK(entry.is_object(), "load_safetensors: {}: __metadata__ is not an object", path);
      for (auto& [k, v] : entry.items())
        if (v.is_string()) file.metadata[k] = v.get<std::string>();
      continue;
    }
    try {
      Stored stored;
      TP_CHECK(parse_dtype(entry.at("dtype").get<std::string>(), stored),
               "load_safetensors: {}: tensor '{}' has unsupported dtype {} (readable: F32, F64, I64, BOOL, and BF16 "
               "and F16 into float32)",
               path, name, entry.at("dtype").get<std::string>());
      const DType dtype = stored.dtype;
      // Whole numbers only: nlohmann's get<> would truncate 200.9 to 200 (issue 44).
      for (const char* key : {"shape", "data_offsets"}) {
        const auto& list = entry.at(key);
        TP_CHECK(list.is_array(), "load_safetensors: {}: tensor '{}' has a {} that is not a list", path, name, key);
        for (const auto& x : list)
          TP_CHECK(x.is_number_integer(), "load_safetensors: {}: tensor '{}' has {} {}: not whole numbers", path, name,
                   key, list.dump());
      }
      Shape shape = entry.at("shape").get<Shape>();
      TP_CHECK(shape.size() <= 8, "load_safetensors: {}: tensor '{}' has {} dims", path, name, shape.size());
      auto offs = entry.at("data_offsets").get<std::vector<uint64_t>>();
      TP_CHECK(offs.size() == 2 && offs[0] <= offs[1] && offs[1] <= data_size,
               "load_safetensors: {}: tensor '{}' has data offsets outside the file", path, name);
      int64_t numel = 0;
      try {
        numel = shape_numel(shape);
      } catch (const Error&) {
        throw Error(fmt::format("load_safetensors: {}: tensor '{}' has an invalid shape {}", path, name, shape));
      }
      TP_CHECK(static_cast<uint64_t>(numel) <= data_size &&
                   static_cast<uint64_t>(numel) * stored.bytes == offs[1] - offs[0],
               "load_safetensors: {}: tensor '{}' of shape {} does not match its {} data bytes", path, name, shape,
               offs[1] - offs[0]);
      spans.emplace_back(offs[0], offs[1]);
      Tensor t = empty(shape, dtype);
      const char* src = bytes.data() + data_start + offs[0];
      if (dtype == DType::Bool)  // any other byte would be an invalid bool (undefined behaviour once read)
        for (uint64_t i = 0; i < offs[1] - offs[0]; ++i)
          TP_CHECK(src[i] == 0 || src[i] == 1, "load_safetensors: {}: BOOL tensor '{}' holds the byte {} at element {}",
                   path, name, static_cast<int>(static_cast<unsigned char>(src[i])), i);
      if (stored.half != Stored::Half::None) {
        float* dst = t.data_ptr<float>();
        for (int64_t i = 0; i < numel; ++i) {
          uint16_t h;
          std::memcpy(&h, src + 2 * i, 2);
          dst[i] = stored.half == Stored::Half::BF16 ? bf16_to_float(h) : f16_to_float(h);
        }
      } else if (numel > 0) {
        std::memcpy(t.raw_data(), src, offs[1] - offs[0]);
      }
      file.tensors.emplace_back(name, t);
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("load_safetensors: {}: tensor '{}' has a malformed entry: {}", path, name, e.what()));
    }
  }
  // The tensors must tile the data section exactly: a gap, an overlap or trailing bytes mean a
  // damaged file (a header length off by one shifts every tensor), not one to guess about.
  std::sort(spans.begin(), spans.end());
  uint64_t at = 0;
  for (auto& [b, e] : spans) {
    TP_CHECK(b == at, "load_safetensors: {}: the tensors' data {} at byte {} (a gap or an overlap in the data section)",
             path, b > at ? "leaves a gap" : "overlaps", at);
    at = e;
  }
  TP_CHECK(at == data_size, "load_safetensors: {}: the tensors cover {} of the {} data bytes", path, at, data_size);
  auto sum = file.metadata.find(kChecksumKey);
  if (sum != file.metadata.end()) {
    std::string got = data_crc32(bytes.data() + data_start, data_size);
    TP_CHECK(got == sum->second, "load_safetensors: {}: checksum mismatch (data crc32 {}, recorded {}): the file is damaged",
             path, got, sum->second);
    file.metadata.erase(sum);
  }
  return file;
}

}  // namespace tapestry::nn
