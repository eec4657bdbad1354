// CPU kernels for sorting, scans and triangles: triangle (tril / triu), cumsum (and its reversed
// form, cumsum's backward), sort, topk and multinomial sampling.
//
// Order: NaN ranks above every number, +inf included (last in an ascending sort, first in a
// descending one, and the largest for topk), as in PyTorch; NaNs tie with each other. Equal
// values keep their input order: sort compares (value, index) pairs, which makes it stable, and
// topk returns the lowest index first among equal values (PyTorch's CPU topk may order ties
// differently). Each row is sorted, selected or summed by one thread, in order, so the results
// never depend on the thread count. cumsum adds sequentially along the dim; float32 accumulates
// in double, as PyTorch's CPU kernel does. multinomial draws sequentially from the engine.
#include <algorithm>
#include <cmath>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

#include "tapestry/ops/cpu/loops.h"
#include "tapestry/ops/factory.h"
#include "tapestry/ops/detail/backend.h"
#include "tapestry/ops/profile.h"

namespace tapestry::kernels::cpu {

using cpu::parallel_for;

namespace {

// A contiguous shape as [outer, n, inner] around `dim` (a 0-d tensor is one row of one).
// Callers return early on empty tensors, so the products cannot overflow.
struct Rows {
  int64_t outer = 1, n = 1, inner = 1;
  int64_t count() const { return outer * inner; }
  // Offset of row r's first element; the row's elements are `inner` apart.
  int64_t base(int64_t r) const { return (r / inner) * n * inner + r % inner; }
};

Rows rows_of(const Shape& s, int64_t dim) {
  Rows r;
  const int64_t nd = static_cast<int64_t>(s.size());
  if (nd == 0) return r;
  r.n = s[dim];
  for (int64_t d = 0; d < dim; ++d) r.outer *= s[d];
  for (int64_t d = dim + 1; d < nd; ++d) r.inner *= s[d];
  return r;
}

// x before y in ascending order, NaN last; in descending order, NaN first.
template <class T> inline bool ascending_before(T x, T y) { return (!is_nan(x) && is_nan(y)) || x < y; }
template <class T> inline bool descending_before(T x, T y) { return (is_nan(x) && !is_nan(y)) || x > y; }

// (value, index) pairs in a total order: by value, equal values by index (the stable order).
template <class T> struct PairOrder {
  bool descending;
  bool operator()(const std::pair<T, int64_t>& x, const std::pair<T, int64_t>& y) const {
    const bool xy = descending ? descending_before(x.first, y.first) : ascending_before(x.first, y.first);
    if (xy) return true;
    const bool yx = descending ? descending_before(y.first, x.first) : ascending_before(y.first, x.first);
    return !yx && x.second < y.second;
  }
};

// Integer sums wrap around (two's complement, as PyTorch's) instead of overflowing.
inline double add_acc(double acc, double v) { return acc + v; }
inline int64_t add_acc(int64_t acc, int64_t v) {
  return static_cast<int64_t>(static_cast<uint64_t>(acc) + static_cast<uint64_t>(v));
}

// A uniform double in [0, 1) from the top 53 bits of one 64-bit draw (the same on every platform).
inline double uniform01(std::mt19937_64& engine) { return static_cast<double>(engine() >> 11) * 0x1.0p-53; }

}  // namespace

Tensor triangle(const char* op, const Tensor& a, int64_t diagonal, bool upper) {
  TP_PROFILE(op);
  Tensor out = empty(a.sizes(), a.options());
  const int64_t numel = out.numel();
  if (numel == 0) return out;
  const int64_t nd = a.dim();
  const int64_t n_rows = a.size(nd - 2), n_cols = a.size(nd - 1);
  const int64_t row_stride = a.stride(nd - 2), col_stride = a.stride(nd - 1);
  const Shape& sizes = a.sizes();
  const Shape& strides = a.strides();
  dispatch(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pa = a.data_ptr<T>();
    T* po = out.data_ptr<T>();
    // One work item per matrix row (over every batch); the output is contiguous.
    parallel_for(0, numel / n_cols, std::max<int64_t>(1, cpu::kGrainSize / n_cols), [&](int64_t b, int64_t e) {
      for (int64_t row = b; row < e; ++row) {
        const int64_t i = row % n_rows;
        int64_t off = i * row_stride;
        int64_t rem = row / n_rows;
        for (int64_t d = nd - 3; d >= 0; --d) {
          off += (rem % sizes[d]) * strides[d];
          rem /= sizes[d];
        }
        T* dst = po + row * n_cols;
        // j - i cannot overflow (both are indices); comparing it with diagonal never does either.
        for (int64_t j = 0; j < n_cols; ++j) {
          const bool keep = upper ? j - i >= diagonal : j - i <= diagonal;
          dst[j] = keep ? pa[off + j * col_stride] : T(0);
        }
      }
    });
  });
  return out;
}

Tensor cumsum(const Tensor& a_in, int64_t dim, bool reverse) {
  const char* op = reverse ? "cumsum_backward" : "cumsum";
  TP_PROFILE(op);
  dim = wrap_dim(op, dim, a_in.dim());
  const DType out_dtype = is_floating(a_in.dtype()) ? a_in.dtype() : DType::Int64;
  Tensor out = empty(a_in.sizes(), TensorOptions(out_dtype, a_in.device()));
  if (out.numel() == 0) return out;
  Tensor a = contiguous(a_in);
  const Rows rv = rows_of(a.sizes(), dim);
  dispatch(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    using O = std::conditional_t<std::is_floating_point_v<T>, T, int64_t>;
    using A = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;
    const T* pa = a.data_ptr<T>();
    O* po = out.data_ptr<O>();
    // One work item per (outer index, block of up to kCols inner columns): the columns of a
    // block run side by side along the dim, each summed in order.
    constexpr int64_t kCols = 256;
    const int64_t n_chunks = (rv.inner + kCols - 1) / kCols;
    const int64_t work = rv.n * std::min(rv.inner, kCols);
    parallel_for(0, rv.outer * n_chunks, std::max<int64_t>(1, cpu::kGrainSize / work), [&](int64_t b, int64_t e) {
      A acc[kCols];
      for (int64_t w = b; w < e; ++w) {
        const int64_t o = w / n_chunks, c0 = (w % n_chunks) * kCols, c1 = std::min(rv.inner, c0 + kCols);
        std::fill(acc, acc + (c1 - c0), A(0));
        for (int64_t s = 0; s < rv.n; ++s) {
          const int64_t i = reverse ? rv.n - 1 - s : s;
          const int64_t base = (o * rv.n + i) * rv.inner;
          for (int64_t c = c0; c < c1; ++c) {
            acc[c - c0] = add_acc(acc[c - c0], static_cast<A>(pa[base + c]));
            po[base + c] = static_cast<O>(acc[c - c0]);
          }
        }
      }
    });
  });
  return out;
}

std::pair<Tensor, Tensor> sort(const Tensor& a_in, int64_t dim, bool descending, bool stable) {
  TP_PROFILE("sort");
  dim = wrap_dim("sort", dim, a_in.dim());
  (void)stable;  // always stable: ties are ordered by index
  Tensor values = empty(a_in.sizes(), a_in.options());
  Tensor indices = empty(a_in.sizes(), TensorOptions(DType::Int64, a_in.device()));
  if (values.numel() == 0) return {values, indices};
  Tensor a = contiguous(a_in);
  const Rows rv = rows_of(a.sizes(), dim);
  dispatch(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pa = a.data_ptr<T>();
    T* pv = values.data_ptr<T>();
    int64_t* pi = indices.data_ptr<int64_t>();
    const PairOrder<T> order{descending};
    parallel_for(0, rv.count(), std::max<int64_t>(1, cpu::kGrainSize / rv.n), [&](int64_t b, int64_t e) {
      std::vector<std::pair<T, int64_t>> buf(static_cast<size_t>(rv.n));
      std::pair<T, int64_t>* row = buf.data();
      for (int64_t r = b; r < e; ++r) {
        const int64_t base = rv.base(r);
        for (int64_t i = 0; i < rv.n; ++i) row[i] = {pa[base + i * rv.inner], i};
        std::sort(row, row + rv.n, order);
        for (int64_t i = 0; i < rv.n; ++i) {
          pv[base + i * rv.inner] = row[i].first;
          pi[base + i * rv.inner] = row[i].second;
        }
      }
    });
  });
  return {values, indices};
}

namespace {

constexpr int64_t kFewTop = 16;

// The kk (<= kFewTop) best of x[0..n) in PairOrder (ties: lower index first) by insertion, to
// values/indices with stride `out`. False, with nothing written, if the row holds a NaN. Once kk
// are held, a block of 16 with nothing better than the kk-th (and no NaN) is passed over whole:
// one vector compare for most of a vocabulary.
template <bool Largest, class T>
bool few_top(const T* x, int64_t n, int64_t kk, T* values, int64_t* indices, int64_t out) {
  T val[kFewTop];
  int64_t idx[kFewTop], held = 0;
  auto better = [](T u, T v) { return Largest ? u > v : u < v; };
  for (int64_t i0 = 0; i0 < n; i0 += 16) {
    const int64_t i1 = std::min<int64_t>(n, i0 + 16);
    if (held == kk && i1 - i0 == 16) {
      const T worst = val[kk - 1];
      bool any = false;
#pragma omp simd reduction(| : any)
      for (int64_t l = 0; l < 16; ++l) any |= better(x[i0 + l], worst) | (x[i0 + l] != x[i0 + l]);
      if (!any) continue;
    }
    for (int64_t i = i0; i < i1; ++i) {
      const T v = x[i];
      if (v != v) return false;
      if (held == kk && !better(v, val[kk - 1])) continue;  // equal ranks after: it comes later
      int64_t p = held < kk ? held++ : kk - 1;
      for (; p > 0 && better(v, val[p - 1]); --p) val[p] = val[p - 1], idx[p] = idx[p - 1];
      val[p] = v, idx[p] = i;
    }
  }
  for (int64_t i = 0; i < kk; ++i) values[i * out] = val[i], indices[i * out] = idx[i];
  return true;
}

}  // namespace

std::pair<Tensor, Tensor> topk(const Tensor& a_in, int64_t k, int64_t dim, bool largest, bool sorted) {
  TP_PROFILE("topk");
  dim = wrap_dim("topk", dim, a_in.dim());
  dispatch_numeric(a_in.dtype(), "topk", [](auto) {});
  const bool scalar = a_in.dim() == 0;
  const int64_t n = scalar ? 1 : a_in.size(dim);
  TP_CHECK(k >= 0 && k <= n, "topk: selected index k out of range: k = {} for dim {} of size {} (input shape {})", k,
           dim, n, a_in.sizes());
  // A 0-d input is its own top element, for k = 0 as well (as in PyTorch).
  const int64_t kk = scalar ? 1 : k;
  Shape out_shape = a_in.sizes();
  if (!scalar) out_shape[dim] = k;
  Tensor values = empty(out_shape, a_in.options());
  Tensor indices = empty(out_shape, TensorOptions(DType::Int64, a_in.device()));
  if (values.numel() == 0) return {values, indices};
  Tensor a = contiguous(a_in);
  const Rows in_rows = rows_of(a.sizes(), dim);
  const Rows out_rows = rows_of(out_shape, dim);
  dispatch_numeric(a.dtype(), "topk", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pa = a.data_ptr<T>();
    T* pv = values.data_ptr<T>();
    int64_t* pi = indices.data_ptr<int64_t>();
    const PairOrder<T> order{largest};  // largest first: the descending order
    auto by_index = [](const std::pair<T, int64_t>& x, const std::pair<T, int64_t>& y) { return x.second < y.second; };
    parallel_for(0, in_rows.count(), std::max<int64_t>(1, cpu::kGrainSize / n), [&](int64_t b, int64_t e) {
      std::vector<std::pair<T, int64_t>> buf(static_cast<size_t>(n));
      std::pair<T, int64_t>* row = buf.data();
      for (int64_t r = b; r < e; ++r) {
        const int64_t in_base = in_rows.base(r), out_base = out_rows.base(r);
        if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
          // A few of a long row, sorted (beam search's 2K of the vocabulary): one pass keeps the kk
          // best in order, most elements cost one compare with the kk-th. A NaN sends the row on
          // to the general path below.
          if (sorted && kk <= kFewTop && in_rows.inner == 1 &&
              (largest ? few_top<true>(pa + in_base, n, kk, pv + out_base, pi + out_base, out_rows.inner)
                       : few_top<false>(pa + in_base, n, kk, pv + out_base, pi + out_base, out_rows.inner)))
            continue;
        }
        for (int64_t i = 0; i < n; ++i) row[i] = {pa[in_base + i * in_rows.inner], i};
        if (sorted) {
          std::partial_sort(row, row + kk, row + n, order);
        } else {
          if (kk < n) std::nth_element(row, row + kk, row + n, order);
          std::sort(row, row + kk, by_index);
        }
        for (int64_t i = 0; i < kk; ++i) {
          pv[out_base + i * out_rows.inner] = row[i].first;
          pi[out_base + i * out_rows.inner] = row[i].second;
        }
      }
    });
  });
  return {values, indices};
}

Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement, std::mt19937_64& engine) {
  TP_PROFILE("multinomial");
  TP_CHECK(probs.dim() == 1 || probs.dim() == 2,
           "multinomial: probabilities must be 1-D [V] or 2-D [B, V], got shape {}", probs.sizes());
  TP_CHECK(is_floating(probs.dtype()), "multinomial: probabilities must be float32 or float64, got {} {}",
           probs.dtype(), probs.sizes());
  TP_CHECK(num_samples > 0, "multinomial: num_samples must be positive, got {}", num_samples);
  const int64_t n_rows = probs.dim() == 2 ? probs.size(0) : 1;
  const int64_t n_cats = probs.size(probs.dim() - 1);
  TP_CHECK(replacement || num_samples <= n_cats,
           "multinomial: cannot draw {} samples without replacement from {} categories (probabilities of shape {})",
           num_samples, n_cats, probs.sizes());
  Shape out_shape = probs.dim() == 2 ? Shape{n_rows, num_samples} : Shape{num_samples};
  Tensor out = empty(out_shape, TensorOptions(DType::Int64, probs.device()));
  if (n_rows == 0) return out;

  // Every row as float64 weights, checked before the first draw.
  std::vector<double> weights(static_cast<size_t>(n_rows * n_cats));
  {
    Tensor p = to_dtype(contiguous(probs), DType::Float64);
    const double* pp = p.data_ptr<double>();
    std::copy(pp, pp + n_rows * n_cats, weights.begin());
  }
  for (int64_t r = 0; r < n_rows; ++r) {
    double* w = weights.data() + r * n_cats;
    double total = 0, largest = 0;
    int64_t nonzero = 0;
    for (int64_t i = 0; i < n_cats; ++i) {
      const double v = w[i];
      TP_CHECK(std::isfinite(v) && v >= 0,
               "multinomial: probabilities must be finite and non-negative, got {} at category {} of row {} "
               "(shape {})",
               v, i, r, probs.sizes());
      total += v;
      largest = std::max(largest, v);
      nonzero += v > 0 ? 1 : 0;
    }
    TP_CHECK(nonzero > 0, "multinomial: row {} of probabilities {} has no positive weight (it sums to 0)", r,
             probs.sizes());
    if (!std::isfinite(total)) {
      // The weights are finite but their sum overflows: scale the row by its largest weight.
      nonzero = 0;
      for (int64_t i = 0; i < n_cats; ++i) {
        w[i] /= largest;
        nonzero += w[i] > 0 ? 1 : 0;
      }
    }
    TP_CHECK(replacement || num_samples <= nonzero,
             "multinomial: cannot draw {} samples without replacement from row {}, which has only {} categories "
             "with nonzero probability (shape {})",
             num_samples, r, nonzero, probs.sizes());
  }

  int64_t* po = out.data_ptr<int64_t>();
  std::vector<double> cum(static_cast<size_t>(n_cats));
  for (int64_t r = 0; r < n_rows; ++r) {
    double* w = weights.data() + r * n_cats;
    int64_t* dst = po + r * num_samples;
    int64_t last_positive = 0;
    for (int64_t i = 0; i < n_cats; ++i)
      if (w[i] > 0) last_positive = i;
    if (replacement) {
      // Inverse CDF: the first category whose running sum exceeds u * total. A zero weight
      // repeats the running sum before it, so it is never the first to exceed anything >= 0.
      double run = 0;
      for (int64_t i = 0; i < n_cats; ++i) cum[static_cast<size_t>(i)] = run += w[i];
      const double total = run;
      for (int64_t s = 0; s < num_samples; ++s) {
        const double t = uniform01(engine) * total;
        int64_t i = std::upper_bound(cum.begin(), cum.end(), t) - cum.begin();
        dst[s] = i < n_cats ? i : last_positive;  // u * total rounded up to total
      }
      continue;
    }
    // Without replacement: each draw takes a category and zeroes its weight. Weights are kept in
    // blocks of about sqrt(V) with their sums recomputed exactly after each removal, so a draw
    // costs O(sqrt(V)) and a removed category can never come back through rounding.
    const int64_t block = std::max<int64_t>(1, static_cast<int64_t>(std::sqrt(static_cast<double>(n_cats))));
    const int64_t n_blocks = (n_cats + block - 1) / block;
    std::vector<double> block_sum(static_cast<size_t>(n_blocks), 0.0);
    auto resum = [&](int64_t blk) {
      double s = 0;
      for (int64_t i = blk * block; i < std::min(n_cats, (blk + 1) * block); ++i) s += w[i];
      block_sum[static_cast<size_t>(blk)] = s;
    };
    for (int64_t blk = 0; blk < n_blocks; ++blk) resum(blk);
    for (int64_t s = 0; s < num_samples; ++s) {
      double total = 0;
      for (double bs : block_sum) total += bs;
      const double t = uniform01(engine) * total;
      // The block where the running sum first exceeds t (only blocks with weight count).
      double acc = 0;
      int64_t blk = 0;
      for (; blk < n_blocks; ++blk) {
        const double bs = block_sum[static_cast<size_t>(blk)];
        if (bs > 0 && acc + bs > t) break;
        acc += bs;
      }
      const bool past_end = blk == n_blocks;  // u * total rounded up to total
      if (past_end) {  // the last block with weight left
        blk = n_blocks - 1;
        while (blk > 0 && !(block_sum[static_cast<size_t>(blk)] > 0)) --blk;
      }
      // Within the block: the first positive weight whose running sum exceeds t, else (rounding)
      // the block's last positive weight. A drawable category remains: num_samples <= nonzero.
      int64_t pick = -1, last = -1;
      for (int64_t i = blk * block; i < std::min(n_cats, (blk + 1) * block); ++i) {
        if (!(w[i] > 0)) continue;
        last = i;
        if (!past_end && acc + w[i] > t) {
          pick = i;
          break;
        }
        acc += w[i];
      }
      if (pick < 0) pick = last;
      dst[s] = pick;
      w[pick] = 0;
      resum(blk);
    }
  }
  return out;
}

}  // namespace tapestry::kernels::cpu
