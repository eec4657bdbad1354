// CPU indexing kernels: index_select / index_add (embedding lookup and its backward), gather /
// scatter(_add), and cat. Index values are range-checked before any work starts, so a bad index
// throws a tapestry::Error naming the op, the index and the size, never a crash.
#include "tapestry/ops/cpu/loops.h"
#include "tapestry/ops/factory.h"
#include "tapestry/ops/detail/backend.h"
#include "tapestry/ops/profile.h"

namespace tapestry::kernels::cpu {

namespace {

void check_index(const char* op, const Tensor& index, int64_t size, int64_t dim, const Shape& shape) {
  TP_CHECK(index.dtype() == DType::Int64, "{}: index must be int64, got {} {}", op, index.dtype(), index.sizes());
  for (int64_t v : index.to_vector<int64_t>())
    TP_CHECK(v >= 0 && v < size, "{}: index {} is out of range for dim {} of size {} (tensor shape {})", op, v, dim,
             size, shape);
}

}  // namespace

Tensor index_select(const char* op, const Tensor& a_in, int64_t dim, const Tensor& index_in) {
  TP_PROFILE(op);
  dim = wrap_dim(op, dim, a_in.dim());
  TP_CHECK(index_in.dim() <= 1, "{}: index must be 0-D or 1-D, got shape {}", op, index_in.sizes());
  // A 0-d source has one element to select, and its 0-d output room for one (as in PyTorch).
  TP_CHECK(a_in.dim() > 0 || index_in.numel() == 1, "{}: a 0-d tensor takes exactly one index, got {}", op,
           index_in.numel());
  check_index(op, index_in, a_in.dim() == 0 ? 1 : a_in.size(dim), dim, a_in.sizes());
  Tensor a = contiguous(a_in), index = contiguous(index_in);
  Shape out_shape = a.sizes();
  if (!out_shape.empty()) out_shape[dim] = index.numel();
  Tensor out = empty(out_shape, a.options());
  DimSplit s = split_at(a.sizes(), dim);
  const int64_t m = index.numel();
  const int64_t* pi = index.data_ptr<int64_t>();
  dispatch(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pa = a.data_ptr<T>();
    T* po = out.data_ptr<T>();
    cpu::parallel_for(0, s.outer * m, std::max<int64_t>(1, cpu::kGrainSize / std::max<int64_t>(1, s.inner)),
                      [&](int64_t b, int64_t e) {
                        for (int64_t r = b; r < e; ++r) {
                          int64_t o = r / m, j = r % m;
                          std::copy_n(pa + (o * s.n + pi[j]) * s.inner, s.inner, po + r * s.inner);
                        }
                      });
  });
  return out;
}

Tensor index_add(const Shape& shape, int64_t dim, const Tensor& index_in, const Tensor& src_in) {
  TP_PROFILE("index_add");
  Tensor index = contiguous(index_in), src = contiguous(src_in);
  // Callers pass indices their forward checked, but as a kernel entry it must never write out of
  // bounds (one pass over the indices).
  check_index("index_add", index, shape.empty() ? 1 : shape[dim], dim, shape);
  Tensor out = zeros(shape, src.options());
  DimSplit s = split_at(shape, dim);
  const int64_t m = index.numel();
  const int64_t* pi = index.data_ptr<int64_t>();
  dispatch_numeric(src.dtype(), "index_add", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* ps = src.data_ptr<T>();
    T* po = out.data_ptr<T>();
    // Parallel over (outer, column) pairs: repeated indices add into the same row, so rows are
    // walked in order by one thread per column range; the result is deterministic.
    cpu::parallel_for(0, s.outer * s.inner, std::max<int64_t>(1, cpu::kGrainSize / std::max<int64_t>(1, m)),
                      [&](int64_t b, int64_t e) {
                        while (b < e) {
                          int64_t o = b / s.inner, c0 = b % s.inner;
                          int64_t c1 = std::min(s.inner, c0 + (e - b));
                          for (int64_t j = 0; j < m; ++j) {
                            T* dst = po + (o * s.n + pi[j]) * s.inner;
                            const T* from = ps + (o * m + j) * s.inner;
                            for (int64_t c = c0; c < c1; ++c) dst[c] += from[c];
                          }
                          b += c1 - c0;
                        }
                      });
  });
  return out;
}

namespace {
void check_gather_shapes(const char* op, const Shape& a, int64_t dim, const Tensor& index) {
  if (index.numel() == 0) return;  // an empty index reads and writes nothing (PyTorch's gather checks no shapes then)
  TP_CHECK(index.dim() == static_cast<int64_t>(a.size()), "{}: index of shape {} must have as many dims as the input {}",
           op, index.sizes(), a);
  for (int64_t d = 0; d < index.dim(); ++d)
    if (d != dim)
      TP_CHECK(index.size(d) <= a[d], "{}: index shape {} exceeds input shape {} at dim {}", op, index.sizes(), a, d);
}
}  // namespace

Tensor gather(const Tensor& a, int64_t dim, const Tensor& index) {
  TP_PROFILE("gather");
  dim = wrap_dim("gather", dim, a.dim());
  check_gather_shapes("gather", a.sizes(), dim, index);
  check_index("gather", index, a.dim() == 0 ? 1 : a.size(dim), dim, a.sizes());
  Tensor out = empty(index.sizes(), a.options());
  Shape a_strides = a.strides();
  const int64_t dim_stride = a.dim() == 0 ? 0 : a_strides[dim];
  if (a.dim() > 0) a_strides[dim] = 0;
  dispatch(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pa = a.data_ptr<T>();
    const int64_t* pi = index.data_ptr<int64_t>();
    T* po = out.data_ptr<T>();
    cpu::strided_apply<3>(index.sizes(), {out.strides(), index.strides(), a_strides},
                          [&](const std::array<int64_t, 3>& off, const std::array<int64_t, 3>& st, int64_t n) {
                            for (int64_t i = 0; i < n; ++i)
                              po[off[0] + i * st[0]] = pa[off[2] + i * st[2] + pi[off[1] + i * st[1]] * dim_stride];
                          });
  });
  return out;
}

Tensor scatter(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src, bool accumulate) {
  const char* op = accumulate ? "scatter_add" : "scatter";
  TP_PROFILE(op);
  dim = wrap_dim(op, dim, static_cast<int64_t>(shape.size()));
  check_gather_shapes(op, shape, dim, index);
  check_index(op, index, shape.empty() ? 1 : shape[dim], dim, shape);
  TP_CHECK(src.sizes() == index.sizes(), "{}: src shape {} must equal index shape {}", op, src.sizes(), index.sizes());
  Tensor out = zeros(shape, src.options());
  Shape o_strides = out.strides();
  const int64_t dim_stride = shape.empty() ? 0 : o_strides[dim];
  if (!shape.empty()) o_strides[dim] = 0;
  dispatch_numeric(src.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* ps = src.data_ptr<T>();
    const int64_t* pi = index.data_ptr<int64_t>();
    T* po = out.data_ptr<T>();
    // Serial: two index entries may write one element (summed, or the last one kept).
    cpu::strided_apply<3>(
        index.sizes(), {o_strides, index.strides(), src.strides()},
        [&](const std::array<int64_t, 3>& off, const std::array<int64_t, 3>& st, int64_t n) {
          for (int64_t i = 0; i < n; ++i) {
            T& dst = po[off[0] + i * st[0] + pi[off[1] + i * st[1]] * dim_stride];
            const T v = ps[off[2] + i * st[2]];
            dst = accumulate ? dst + v : v;
          }
        },
        INT64_MAX);
  });
  return out;
}

}  // namespace tapestry::kernels::cpu
