// IDX reading (see idx.h): the header is parsed from the first bytes, the values read in one go,
// so a file is either read whole or refused.
#include "tapestry/data/idx.h"

#include <zlib.h>

#include <array>
#include <cmath>
#include <type_traits>
#include <cstring>
#include <filesystem>
#include <vector>

#include "tapestry/autograd/functions.h"
#include "tapestry/ops/factory.h"

namespace tapestry::data {

namespace {

// A gzip or plain file read through zlib, closed on scope exit.
class ZFile {
 public:
  explicit ZFile(const std::string& path) : path_(path) {
    std::error_code ec;
    TP_CHECK(std::filesystem::is_regular_file(path, ec), "{}: no such file", path);
    f_ = gzopen(path.c_str(), "rb");
    TP_CHECK(f_ != nullptr, "{}: cannot open", path);
  }
  ~ZFile() {
    if (f_) gzclose(f_);
  }
  ZFile(const ZFile&) = delete;
  ZFile& operator=(const ZFile&) = delete;
  // Reads up to n bytes; returns how many were read (fewer at the end of the file).
  size_t read(void* dst, size_t n) {
    size_t done = 0;
    auto* out = static_cast<unsigned char*>(dst);
    while (done < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - done, 1u << 30));
      const int got = gzread(f_, out + done, chunk);
      if (got < 0) {
        int code = 0;
        const char* why = gzerror(f_, &code);
        TP_CHECK(false, "{}: corrupt or unreadable ({})", path_, why ? why : "read error");
      }
      if (got == 0) break;
      done += static_cast<size_t>(got);
    }
    return done;
  }

 private:
  std::string path_;
  gzFile f_ = nullptr;
};

struct IdxType {
  unsigned char code;
  const char* name;
  size_t size;
};
constexpr std::array<IdxType, 6> kTypes = {{{0x08, "ubyte", 1},
                                            {0x09, "byte", 1},
                                            {0x0B, "short", 2},
                                            {0x0C, "int", 4},
                                            {0x0D, "float", 4},
                                            {0x0E, "double", 8}}};

// Value i of the big-endian data as a double.
double value_at(const unsigned char* p, unsigned char code) {
  uint64_t bits = 0;
  const size_t size = code == 0x08 || code == 0x09 ? 1 : code == 0x0B ? 2 : code == 0x0E ? 8 : 4;
  for (size_t b = 0; b < size; ++b) bits = (bits << 8) | p[b];
  switch (code) {
    case 0x08: return static_cast<double>(static_cast<uint8_t>(bits));
    case 0x09: return static_cast<double>(static_cast<int8_t>(bits));
    case 0x0B: return static_cast<double>(static_cast<int16_t>(bits));
    case 0x0C: return static_cast<double>(static_cast<int32_t>(bits));
    case 0x0D: {
      float f;
      const uint32_t u = static_cast<uint32_t>(bits);
      std::memcpy(&f, &u, 4);
      return f;
    }
    default: {
      double d;
      std::memcpy(&d, &bits, 8);
      return d;
    }
  }
}

}  // namespace

Tensor read_idx(const std::string& path, DType dtype) {
  ZFile file(path);
  unsigned char magic[4];
  TP_CHECK(file.read(magic, 4) == 4, "{}: not an IDX file (shorter than its 4-byte magic number)", path);
  const IdxType* type = nullptr;
  for (const IdxType& t : kTypes)
    if (t.code == magic[2]) type = &t;
  TP_CHECK(magic[0] == 0 && magic[1] == 0 && type != nullptr && magic[3] >= 1,
           "{}: not an IDX file (magic number {:02x}{:02x}{:02x}{:02x}; expected 0000 then a type 08-0e and a rank)",
           path, magic[0], magic[1], magic[2], magic[3]);
  const int rank = magic[3];
  std::vector<unsigned char> dims_raw(static_cast<size_t>(4 * rank));
  TP_CHECK(file.read(dims_raw.data(), dims_raw.size()) == dims_raw.size(),
           "{}: truncated in its header ({} sizes declared)", path, rank);
  Shape shape(static_cast<size_t>(rank));
  for (int d = 0; d < rank; ++d) {
    const unsigned char* p = &dims_raw[static_cast<size_t>(4 * d)];
    shape[static_cast<size_t>(d)] = (int64_t{p[0]} << 24) | (int64_t{p[1]} << 16) | (int64_t{p[2]} << 8) | p[3];
  }
  const int64_t count = shape_numel(shape);  // at most 2^32 per dim: the product fits below 2^63 or throws
  TP_CHECK(count <= (int64_t{1} << 40) / static_cast<int64_t>(type->size),
           "{}: its header declares shape {} of {}, over 1 TiB of values", path, shape, type->name);
  const size_t bytes = static_cast<size_t>(count) * type->size;
  // Read in chunks, the buffer growing with what arrives: a header that declares more than the
  // file holds costs no allocation beyond the file itself.
  std::vector<unsigned char> raw;
  size_t got = 0;
  while (got < bytes) {
    raw.resize(std::min(bytes, got + (size_t{64} << 20)));
    const size_t n = file.read(raw.data() + got, raw.size() - got);
    got += n;
    if (got < raw.size()) break;
  }
  TP_CHECK(got == bytes, "{}: truncated: shape {} of {} needs {} bytes of values, the file has {}", path, shape,
           type->name, bytes, got);
  unsigned char extra;
  TP_CHECK(file.read(&extra, 1) == 0, "{}: bytes past the {} values its header declares (shape {})", path, count,
           shape);
  Tensor out = empty(shape, dtype);
  dispatch_numeric(dtype, "read_idx", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* dst = out.data_ptr<T>();
    if (type->code == 0x08) {  // the common case, bytes: no per-value decode
      for (int64_t i = 0; i < count; ++i) dst[i] = static_cast<T>(raw[static_cast<size_t>(i)]);
      return;
    }
    for (int64_t i = 0; i < count; ++i) {
      const double v = value_at(&raw[static_cast<size_t>(i) * type->size], type->code);
      if constexpr (!std::is_floating_point_v<T>)
        TP_CHECK(std::isfinite(v) && v >= -9.2e18 && v <= 9.2e18, "{}: value {} (index {}) is not an integer that {} holds",
                 path, v, i, dtype);
      dst[i] = static_cast<T>(v);
    }
  });
  return out;
}

namespace {
// DIR/NAME.gz, else DIR/NAME; the .gz name when neither exists (for the error).
std::string idx_path(const std::string& dir, const std::string& name) {
  const std::string gz = dir + "/" + name + ".gz", plain = dir + "/" + name;
  std::error_code ec;
  if (std::filesystem::exists(gz, ec)) return gz;
  if (std::filesystem::exists(plain, ec)) return plain;
  TP_CHECK(false, "{}: no {} or {} (an MNIST-layout folder holds train-images-idx3-ubyte.gz and its siblings)", dir,
           name + ".gz", name);
  return gz;
}
}  // namespace

ImageSet read_mnist(const std::string& dir, bool train) {
  const std::string prefix = train ? "train" : "t10k";
  const std::string images_path = idx_path(dir, prefix + "-images-idx3-ubyte");
  const std::string labels_path = idx_path(dir, prefix + "-labels-idx1-ubyte");
  ImageSet set;
  set.images = read_idx(images_path, DType::Float32);
  set.labels = read_idx(labels_path, DType::Int64);
  TP_CHECK(set.images.dim() == 3, "{}: images must be 3-D [N, H, W], got shape {}", images_path, set.images.sizes());
  TP_CHECK(set.labels.dim() == 1, "{}: labels must be 1-D [N], got shape {}", labels_path, set.labels.sizes());
  TP_CHECK(set.images.size(0) == set.labels.size(0), "{} holds {} images but {} holds {} labels", images_path,
           set.images.size(0), labels_path, set.labels.size(0));
  const Shape s = set.images.sizes();
  set.images = div(set.images, 255.0).reshape({s[0], 1, s[1], s[2]});
  return set;
}

}  // namespace tapestry::data
