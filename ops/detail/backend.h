// The backends behind ops/dispatch.cpp: every kernel entry point of ops/detail/kernel_entries.h, declared
// in kernels::cpu (ops/cpu/, always built) and kernels::cuda (ops/cuda/, built with
// -DTAPESTRY_CUDA=ON), and the layout rules both backends follow. Only the dispatcher and the
// backends include this header; everything else calls the dispatching entries of ops/detail/kernels.h.
// Checks that need no data (shapes, dtypes, in-place rules) run in the dispatcher, once, before
// a backend is chosen.
#pragma once
#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "tapestry/ops/detail/kernels.h"

namespace tapestry::kernels {

// Strides of t read as a tensor of `shape` (right-aligned broadcast: stride 0 where t has size 1).
inline Shape broadcast_strides(const Tensor& t, const Shape& shape) {
  Shape st(shape.size(), 0);
  size_t off = shape.size() - t.sizes().size();
  for (size_t i = 0; i < t.sizes().size(); ++i) st[off + i] = t.sizes()[i] == 1 ? 0 : t.strides()[i];
  return st;
}

// topk runs on the GPU when the selection is small and sorted (beam search takes 2 x beam per row):
// the CUDA kernel makes k passes over each row, so a large k goes through the host instead
// (ops/cuda/host_fallback.cu), as unsorted selections do.
constexpr int64_t kDeviceTopkMax = 64;
inline bool topk_on_device(int64_t k, bool sorted) { return sorted && k <= kDeviceTopkMax; }

// A tensor of shape s as [outer, n, inner] around `dim` (a 0-d shape: [1, 1, 1]).
struct DimSplit {
  int64_t outer = 1, n = 1, inner = 1;
};
inline DimSplit split_at(const Shape& s, int64_t dim) {
  DimSplit r;
  r.n = s.empty() ? 1 : s[dim];
  for (int64_t d = 0; d < dim; ++d) r.outer *= s[d];
  for (size_t d = dim + 1; d < s.size(); ++d) r.inner *= s[d];
  return r;
}

// matmul's checks (at least 2-D, one dtype, inner dims equal); returns the broadcast batch shape:
// the output is [batch..., M, N].
inline Shape matmul_batch(const Tensor& a, const Tensor& b) {
  TP_CHECK(a.dim() >= 2 && b.dim() >= 2, "matmul: kernel needs operands of at least 2 dims, got {} and {}",
           a.sizes(), b.sizes());
  TP_CHECK(a.dtype() == b.dtype(), "matmul: dtype mismatch: {} {} and {} {}", a.dtype(), a.sizes(), b.dtype(),
           b.sizes());
  TP_CHECK(b.size(-2) == a.size(-1), "matmul: shapes {} and {} cannot be multiplied (inner dims {} != {})",
           a.sizes(), b.sizes(), a.size(-1), b.size(-2));
  return broadcast_shapes("matmul", Shape(a.sizes().begin(), a.sizes().end() - 2),
                          Shape(b.sizes().begin(), b.sizes().end() - 2));
}

// Which of `ndim` dims `dims` names (wrapped; a dim named twice is an Error).
inline std::vector<bool> dims_mask(const char* op, const std::vector<int64_t>& dims, int64_t ndim) {
  std::vector<bool> mask(ndim, false);
  for (int64_t d : dims) {
    int64_t w = wrap_dim(op, d, ndim);
    TP_CHECK(ndim == 0 || !mask[w], "{}: dim {} appears more than once in {}", op, w, dims);
    if (ndim > 0) mask[w] = true;
  }
  return mask;
}

// How a row-major gemm can read a rows x cols matrix with row stride rs and column stride cs: as
// it is (ld = row stride), transposed (ld = column stride), or not at all (copy it first).
struct MatLayout {
  bool ok = false;
  bool trans = false;
  int64_t ld = 0;
};
inline MatLayout gemm_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  const int64_t r1 = std::max<int64_t>(1, rows), c1 = std::max<int64_t>(1, cols);
  if ((cs == 1 || cols == 1) && (rows == 1 || rs >= c1)) return {true, false, rows == 1 ? c1 : rs};
  if ((rs == 1 || rows == 1) && (cols == 1 || cs >= r1)) return {true, true, cols == 1 ? r1 : cs};
  return {};
}

// The label-smoothed target distribution q of cross_entropy (ops/detail/kernels.h).
struct Smoothing {
  double gold, other;  // q on the gold class and on each other class
  int64_t skip;        // a class that gets 0 (the padding class), or -1
  // The total mass of q on a counted row. It is 1 unless no class is left to spread smoothing
  // over (V = 1, or V = 2 with the padding class): then q is 1 - eps on gold alone.
  double total;
};
inline Smoothing smoothing_for(double eps, int64_t V, int64_t ignore_index) {
  bool pad_is_class = ignore_index >= 0 && ignore_index < V;
  int64_t spread = V - 1 - (pad_is_class ? 1 : 0);
  double other = spread > 0 ? eps / static_cast<double>(spread) : 0.0;
  // Exactly 1 when smoothing has classes to go to (as before, bit for bit), else 1 - eps.
  return {1.0 - eps, other, pad_is_class ? ignore_index : -1, spread > 0 ? 1.0 : 1.0 - eps};
}

// The score a masked attention entry takes (by the mask or by causality), in every attention
// kernel: -1e9 rather than -inf, so a fully masked row attends evenly instead of giving NaN.
constexpr double kAttentionMasked = -1e9;

// q [..., Tq, E], k [..., Tk, E] and v [..., Tk, Ev] with the same leading dims, or an Error.
inline void check_attention_operands(const char* op, const Tensor& q, const Tensor& k, const Tensor& v) {
  const Shape lead(q.sizes().begin(), q.sizes().end() - 2);
  TP_CHECK(q.dim() >= 2 && k.dim() == q.dim() && v.dim() == q.dim() &&
               Shape(k.sizes().begin(), k.sizes().end() - 2) == lead &&
               Shape(v.sizes().begin(), v.sizes().end() - 2) == lead && k.size(-2) == v.size(-2) &&
               k.size(-1) == q.size(-1),
           "{}: q {}, k {} and v {} do not fit together", op, q.sizes(), k.sizes(), v.sizes());
}

// Strides of a bool attention mask broadcast to the scores' shape `full` ([lead..., Tq, Tk]):
// right-aligned, size-1 dims read at stride 0; an Error when it does not broadcast or is not bool.
inline Shape attention_mask_strides(const char* op, const Tensor& mask, const Shape& full) {
  TP_CHECK(mask.dtype() == DType::Bool, "{}: the mask must be bool, got {}", op, mask.dtype());
  const int64_t nd = static_cast<int64_t>(full.size());
  Shape st(full.size(), 0);
  for (int64_t i = 1; i <= mask.dim(); ++i) {
    const int64_t md = mask.dim() - i, fd = nd - i;
    TP_CHECK(fd >= 0 && (mask.size(md) == full[fd] || mask.size(md) == 1),
             "{}: the mask {} does not broadcast to the scores {}", op, mask.sizes(), full);
    st[fd] = mask.size(md) == 1 ? 0 : mask.stride(md);
  }
  return st;
}

}  // namespace tapestry::kernels

#define TP_KERNEL(Ret, name, params, args, check) Ret name params;
namespace tapestry::kernels::cpu {
#include "tapestry/ops/detail/kernel_entries.h"
}  // namespace tapestry::kernels::cpu

// Defined by ops/cuda/ in a CUDA build, and by ops/no_cuda.cpp without one (each an Error saying
// how to get CUDA; unreachable, as no tensor can live on a GPU there), so that the dispatcher
// routes alike in both builds.
namespace tapestry::kernels::cuda {
#include "tapestry/ops/detail/kernel_entries.h"
}  // namespace tapestry::kernels::cuda
#undef TP_KERNEL
