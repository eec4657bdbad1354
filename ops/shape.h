// Shape arithmetic shared by every op: element counts, contiguous strides, dim wrapping
// (negative dims count from the end, as in PyTorch) and NumPy broadcasting.
#pragma once
#include <cstdint>
#include <vector>

#include "tapestry/ops/error.h"

namespace tapestry {

using Shape = std::vector<int64_t>;

// Throws instead of overflowing: a crafted shape (a file's header, say) must not wrap around to a
// small count that a small buffer then passes for.
inline int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  bool empty = false;  // a size-0 dim makes the count 0, however large the others
  for (int64_t d : s) {
    TP_CHECK(d >= 0, "shape {} is invalid (negative size)", s);
    empty = empty || d == 0;
  }
  if (empty) return 0;
  for (int64_t d : s)
    TP_CHECK(!__builtin_mul_overflow(n, d, &n), "shape {} is invalid (more than 2^63 elements)", s);
  return n;
}

// base + index * stride in wrapping (unsigned) arithmetic. Exact whenever the result addresses an
// element; only an empty tensor, whose strides and offsets address nothing, can have sizes whose
// products exceed 2^63, and there it wraps instead of overflowing (undefined behaviour).
inline int64_t wrapping_add_mul(int64_t base, int64_t index, int64_t stride) {
  return static_cast<int64_t>(static_cast<uint64_t>(base) + static_cast<uint64_t>(index) * static_cast<uint64_t>(stride));
}

inline Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc = wrapping_add_mul(0, acc, s[i] > 0 ? s[i] : 1);
  }
  return st;
}

// Wraps dim into [0, ndim): -1 is the last dim. Throws naming the op when out of range.
inline int64_t wrap_dim(const char* op, int64_t dim, int64_t ndim) {
  int64_t lo = ndim == 0 ? -1 : -ndim, hi = ndim == 0 ? 0 : ndim - 1;
  TP_CHECK(dim >= lo && dim <= hi, "{}: dim {} out of range for a tensor of {} dims (expected [{}, {}])", op, dim,
           ndim, lo, hi);
  return dim < 0 ? dim + (ndim == 0 ? 1 : ndim) : dim;
}

// NumPy broadcasting of two shapes; throws naming the op and both shapes.
inline Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    TP_CHECK(da == db || da == 1 || db == 1, "{}: shapes {} and {} cannot be broadcast (dim {}: {} vs {})", op, a, b,
             i, da, db);
    out[i] = da == 1 ? db : da;
  }
  return out;
}

}  // namespace tapestry
