// Storage allocation, Tensor metadata accessors, element access and printing.
#include "tapestry/ops/tensor.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <malloc.h>
#include <sstream>

#include "tapestry/ops/cuda.h"
#include "tapestry/ops/factory.h"
#include "tapestry/ops/detail/kernels.h"
#include "tapestry/ops/runtime.h"

namespace tapestry {

constexpr int64_t kMaxDims = 16;  // the loop machinery keeps multi-indices on the stack

namespace {
// Note [Allocator]: tensors of a training step are freed and allocated again, same sizes, every
// step. glibc serves large blocks with mmap and returns them with munmap, so every step would
// fault in (and the kernel zero) fresh pages. Keeping large blocks in the heap instead lets
// freed blocks be reused: a cache of recently freed memory, without an allocator of our own.
const bool heap_tuned = [] {
  mallopt(M_MMAP_THRESHOLD, 1 << 30);   // blocks up to 1 GiB come from the heap
  mallopt(M_TRIM_THRESHOLD, 1 << 30);   // and freed memory is not handed back eagerly
  return true;
}();
}  // namespace

Storage::Storage(size_t nbytes_, Device device_) : nbytes(nbytes_), device(device_) {
  (void)heap_tuned;
  if (device.is_cuda()) {
    data = cuda::detail::allocate(nbytes, device);  // the caching allocator (ops/cuda/runtime.cu)
    return;
  }
  // 64-byte alignment for SIMD; aligned_alloc needs a size that is a multiple of the alignment.
  size_t padded = (nbytes + 63) / 64 * 64;
  data = std::aligned_alloc(64, padded == 0 ? 64 : padded);
  TP_CHECK(data != nullptr, "Storage: out of memory allocating {} bytes", nbytes);
}

Storage::~Storage() {
  if (device.is_cuda()) cuda::detail::release(data, nbytes, device);
  else std::free(data);
}

Tensor make_tensor(std::shared_ptr<Storage> storage, Shape shape, Shape strides, int64_t offset, DType dtype) {
  TP_CHECK(static_cast<int64_t>(shape.size()) <= kMaxDims, "tensor: at most {} dims are supported, got {}", kMaxDims,
           shape.size());
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

TensorImpl& Tensor::impl() const {
  TP_CHECK(impl_ != nullptr, "Tensor: operation on an undefined tensor");
  return *impl_;
}

const Shape& Tensor::sizes() const { return impl().shape; }
const Shape& Tensor::strides() const { return impl().strides; }
int64_t Tensor::size(int64_t d) const {
  TP_CHECK(dim() > 0, "size: dimension {} specified, but a 0-d tensor has no dimensions", d);
  return sizes()[wrap_dim("size", d, dim())];
}
int64_t Tensor::stride(int64_t d) const {
  TP_CHECK(dim() > 0, "stride: dimension {} specified, but a 0-d tensor has no dimensions", d);
  return strides()[wrap_dim("stride", d, dim())];
}

bool Tensor::is_contiguous() const {
  const auto& s = sizes();
  const auto& st = strides();
  for (int64_t d : s)
    if (d == 0) return true;  // no element to lay out: contiguous whatever the strides (as PyTorch)
  int64_t expected = 1;
  for (size_t i = s.size(); i-- > 0;) {
    if (s[i] == 1) continue;
    if (st[i] != expected) return false;
    expected *= s[i];
  }
  return true;
}

void* Tensor::raw_data() const {
  runtime::check_host_access("data_ptr", device());  // the emulated device: only its kernels may (ops/runtime.h)
  if (numel() == 0) return impl().storage->data;  // addresses nothing; the offset of an empty view may be anything
  return static_cast<char*>(impl().storage->data) + impl().offset * static_cast<int64_t>(dtype_size(dtype()));
}

template <class T> T* Tensor::data_ptr() const {
  TP_CHECK(dtype() == dtype_of<T>(), "data_ptr: tensor is {}, asked for {}", dtype(), dtype_of<T>());
  return static_cast<T*>(raw_data());
}
template float* Tensor::data_ptr<float>() const;
template double* Tensor::data_ptr<double>() const;
template int64_t* Tensor::data_ptr<int64_t>() const;
template bool* Tensor::data_ptr<bool>() const;

template <class T> T Tensor::item() const {
  TP_CHECK(numel() == 1, "item: expected a tensor with one element, got shape {}", sizes());
  Tensor host = kernels::to_device(*this, Device::CPU);  // a GPU copy synchronises (and reports device errors)
  return dispatch(dtype(), [&](auto tag) {
    using S = typename decltype(tag)::type;
    return static_cast<T>(*static_cast<const S*>(host.raw_data()));
  });
}
template float Tensor::item<float>() const;
template double Tensor::item<double>() const;
template int64_t Tensor::item<int64_t>() const;
template bool Tensor::item<bool>() const;

template <class T> std::vector<T> Tensor::to_vector() const {
  Tensor c = kernels::to_dtype(kernels::to_device(*this, Device::CPU), dtype_of<T>());
  if (!c.is_contiguous()) c = kernels::contiguous(c);
  const T* p = c.data_ptr<T>();
  return std::vector<T>(p, p + c.numel());
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<bool> Tensor::to_vector<bool>() const;

// ---- printing, in the manner of PyTorch's repr: 4 decimals (scientific when the range calls for
// it), summarised with "..." past 1000 elements, then the shape, dtype and autograd state.
namespace {

struct Printer {
  std::vector<double> values;  // row-major, converted to double
  Shape shape;
  DType dtype;
  bool summarize;
  bool sci = false;
  int width = 0;
  static constexpr int64_t kEdge = 3;

  std::string fmt_value(double v) const {
    if (dtype == DType::Bool) return v != 0 ? "True" : "False";
    if (dtype == DType::Int64) return fmt::format("{}", static_cast<int64_t>(v));
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    return sci ? fmt::format("{:.4e}", v) : fmt::format("{:.4f}", v);
  }

  void rec(std::string& out, size_t d, int64_t base, int indent) const {
    if (shape.empty()) {
      out += fmt_value(values[0]);
      return;
    }
    int64_t n = shape[d];
    int64_t inner = 1;
    for (size_t i = d + 1; i < shape.size(); ++i) inner *= shape[i];
    out += "[";
    bool last = d + 1 == shape.size();
    for (int64_t i = 0; i < n; ++i) {
      if (summarize && n > 2 * kEdge && i == kEdge) {
        out += last ? "..., " : fmt::format("...,\n{:{}}", "", indent + 1);
        if (!last && d + 2 < shape.size()) out += "\n" + std::string(indent + 1, ' ');
        i = n - kEdge;
      }
      if (last) {
        std::string s = fmt_value(values[base + i]);
        out += fmt::format("{:>{}}", s, width);
      } else {
        rec(out, d + 1, base + i * inner, indent + 1);
      }
      if (i + 1 < n) {
        out += ",";
        if (last) out += " ";
        else out += std::string(shape.size() - d - 1, '\n') + std::string(indent + 1, ' ');
      }
    }
    out += "]";
  }
};

}  // namespace

std::string to_string(const Tensor& t) {
  if (!t.defined()) return "tensor(undefined)";
  Printer p;
  p.shape = t.sizes();
  p.dtype = t.dtype();
  p.summarize = t.numel() > 1000;
  p.values = t.to_vector<double>();
  if (is_floating(p.dtype)) {
    double mx = 0, mn = INFINITY;
    for (double v : p.values)
      if (std::isfinite(v) && v != 0) {
        mx = std::max(mx, std::fabs(v));
        mn = std::min(mn, std::fabs(v));
      }
    p.sci = mx >= 1e8 || (mn < 1e-4 && mn != INFINITY) || (mn != INFINITY && mx / mn > 1e3 && mx >= 1e3);
  }
  for (double v : p.values) p.width = std::max<int>(p.width, static_cast<int>(p.fmt_value(v).size()));
  std::string body;
  if (t.numel() == 0) body = "[]";
  else p.rec(body, 0, 0, 7);
  std::string extra = fmt::format("shape={}, dtype={}", t.sizes(), t.dtype());
  if (t.grad_fn()) extra += fmt::format(", grad_fn=<{}>", t.grad_fn_name());
  else if (t.requires_grad()) extra += ", requires_grad=True";
  return fmt::format("tensor({}, {})", body, extra);
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << to_string(t); }

}  // namespace tapestry
