// Storage allocation, Tensor metadata accessors, element access and the autograd state fields.
// (Printing, which names the grad_fn, is autograd/print.cpp.)
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

// ---- autograd state: the fields of TensorImpl that autograd/ reads and writes. Setting them is the
// core's business; recording ops and running backward is autograd's (autograd/engine.cpp).
Tensor& Tensor::requires_grad_(bool on) {
  TP_CHECK(!on || is_floating(dtype()), "requires_grad_: only floating-point tensors can require grad, got {} {}",
           dtype(), sizes());
  TP_CHECK(on || is_leaf(), "requires_grad_: cannot turn off requires_grad on a non-leaf tensor (use detach())");
  impl().requires_grad = on;
  return *this;
}

void Tensor::zero_grad() { impl().grad.reset(); }

Tensor Tensor::detach() const {
  const TensorImpl& i = impl();
  return make_tensor(i.storage, i.shape, i.strides, i.offset, i.dtype);
}

}  // namespace tapestry
