// CPU reductions: sum/max/min over any set of dims, max/min with indices over one dim, and the
// row-wise kernels softmax / log_softmax and layer norm with their backward passes.
//
// Note [Deterministic reductions]: a reduction over n elements is cut into fixed blocks of
// kReduceBlock elements; blocks are summed in order within, and block partials are combined in
// order. The cut depends on the shape only, never on the thread count, so every reduction gives
// bit-identical results whatever set_num_threads() says. Float32 sums accumulate in double.
// (Summing the leading dims of a contiguous tensor, a whole-tensor sum included, takes a fast
// path cut into 64-row blocks instead: also a function of the shape only.)
// (Matmul is OpenBLAS's and may round differently with another thread count.)
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "tapestry/ops/cpu/loops.h"
#include "tapestry/ops/factory.h"
#include "tapestry/ops/detail/backend.h"
#include "tapestry/ops/profile.h"

namespace tapestry::kernels::cpu {

using cpu::parallel_for;

namespace {

constexpr int64_t kReduceBlock = 4096;

template <class T> struct Acc { using type = double; };
template <> struct Acc<int64_t> { using type = int64_t; };
template <> struct Acc<bool> { using type = int64_t; };

// Walks elements [begin, end) of a strided multi-dim index space, calling f(offset).
struct StridedSpace {
  Shape shape, strides;
  template <class F>
  void walk(int64_t base, int64_t begin, int64_t end, F&& f) const {
    const int64_t nd = static_cast<int64_t>(shape.size());
    if (begin >= end) return;
    if (nd == 0) {
      f(base);
      return;
    }
    int64_t idx[16] = {0};
    int64_t rem = begin;
    for (int64_t d = nd - 1; d >= 0; --d) {
      idx[d] = rem % shape[d];
      rem /= shape[d];
    }
    const int64_t inner = shape[nd - 1], inner_stride = strides[nd - 1];
    while (begin < end) {
      int64_t off = base;
      for (int64_t d = 0; d < nd; ++d) off += idx[d] * strides[d];
      int64_t run = std::min(inner - idx[nd - 1], end - begin);
      for (int64_t i = 0; i < run; ++i) f(off + i * inner_stride);
      begin += run;
      idx[nd - 1] += run;
      for (int64_t d = nd - 1; d > 0 && idx[d] == shape[d]; --d) {
        idx[d] = 0;
        ++idx[d - 1];
      }
    }
  }
};

}  // namespace

Tensor sum_of_squares(const std::vector<Tensor>& tensors) {
  TP_PROFILE("sum_of_squares");
  // Tensor by tensor in list order; within one, squares in double (a float gradient of 1e20
  // squares to a finite 1e40), fixed chunks summed in vector lanes, then added in chunk order: the
  // result does not depend on the thread count.
  double total = 0;
  for (const Tensor& a_in : tensors) {
    Tensor a = contiguous(a_in);
    const int64_t n = a.numel();
    constexpr int64_t kChunk = 4096;
    const int64_t n_chunks = (n + kChunk - 1) / kChunk;
    std::vector<double> partial(static_cast<size_t>(n_chunks), 0.0);
    dispatch_floating(a.dtype(), "sum_of_squares", [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* p = a.data_ptr<T>();
      cpu::parallel_for(0, n_chunks, std::max<int64_t>(1, cpu::kGrainSize / kChunk), [&](int64_t b, int64_t e) {
        for (int64_t c = b; c < e; ++c) {
          const int64_t i0 = c * kChunk, i1 = std::min(n, i0 + kChunk);
          double s = 0;
#pragma omp simd reduction(+ : s)
          for (int64_t i = i0; i < i1; ++i) s += static_cast<double>(p[i]) * static_cast<double>(p[i]);
          partial[static_cast<size_t>(c)] = s;
        }
      });
    });
    double tensor_total = 0;
    for (double v : partial) tensor_total += v;
    total += tensor_total;
  }
  const Device device = tensors.empty() ? Device::CPU : tensors[0].device();
  return scalar_tensor(total, TensorOptions(DType::Float64, device));
}

Tensor reduce(const char* op, Reduce kind, const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  TP_PROFILE(op);
  const int64_t nd = a.dim();
  std::vector<bool> mask = dims_mask(op, dims, nd);
  if (dims.empty()) mask.assign(nd, true);  // no dims: reduce everything
  StridedSpace kept, red;
  Shape out_shape;
  for (int64_t d = 0; d < nd; ++d) {
    if (mask[d]) {
      red.shape.push_back(a.size(d));
      red.strides.push_back(a.stride(d));
      if (keepdim) out_shape.push_back(1);
    } else {
      kept.shape.push_back(a.size(d));
      kept.strides.push_back(a.stride(d));
      out_shape.push_back(a.size(d));
    }
  }
  const bool red_empty = std::find(red.shape.begin(), red.shape.end(), 0) != red.shape.end();
  if (kind != Reduce::Sum)
    TP_CHECK(!red_empty, "{}: cannot reduce an empty dimension (input shape {}, dims {})", op, a.sizes(), dims);
  const int64_t n_out = shape_numel(kept.shape);
  DType out_dtype = (kind == Reduce::Sum && !is_floating(a.dtype())) ? DType::Int64 : a.dtype();
  Tensor out = empty(out_shape, TensorOptions(out_dtype, a.device()));
  if (n_out == 0) return out;
  if (red_empty) {  // a sum over nothing; the empty input's strides address nothing, so never walk them
    fill_(out, 0.0);
    return out;
  }
  // With elements to write, n_red * n_out is the input's count (or n_red is 0): no overflow.
  const int64_t n_red = shape_numel(red.shape);

  // Fast path: summing the leading dims of a contiguous tensor ([rows, cols] -> [cols], as bias
  // gradients do) reads rows in order and adds them into per-block column sums; blocks of
  // kRowBlock rows are combined in order, so the cut depends on the shape only.
  bool leading = kind == Reduce::Sum && is_floating(a.dtype()) && a.is_contiguous() && n_red > 1;
  for (int64_t d = 0; d < nd && leading; ++d) leading = mask[d] == (d < static_cast<int64_t>(red.shape.size()));
  if (leading) {
    constexpr int64_t kRowBlock = 64;
    const int64_t rows = n_red, cols = n_out, n_blocks = (rows + kRowBlock - 1) / kRowBlock;
    const int64_t col_chunk = 1024, n_chunks = (cols + col_chunk - 1) / col_chunk;
    std::vector<double> partial(static_cast<size_t>(n_blocks * cols), 0.0);
    dispatch_floating(a.dtype(), op, [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* pa = a.data_ptr<T>();
      parallel_for(0, n_blocks * n_chunks, 1, [&](int64_t b, int64_t e) {
        for (int64_t w = b; w < e; ++w) {
          int64_t blk = w / n_chunks, c0 = (w % n_chunks) * col_chunk, c1 = std::min(cols, c0 + col_chunk);
          double* acc = &partial[static_cast<size_t>(blk * cols)];
          for (int64_t r = blk * kRowBlock; r < std::min(rows, (blk + 1) * kRowBlock); ++r) {
            const T* row = pa + r * cols;
            for (int64_t c = c0; c < c1; ++c) acc[c] += row[c];
          }
        }
      });
      T* po = out.data_ptr<T>();
      for (int64_t c = 0; c < cols; ++c) {
        double s = 0;
        for (int64_t blk = 0; blk < n_blocks; ++blk) s += partial[static_cast<size_t>(blk * cols + c)];
        po[c] = static_cast<T>(s);
      }
    });
    return out;
  }

  dispatch(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, bool>) {
      TP_CHECK(kind == Reduce::Sum, "{}: not supported for bool tensors", op);
    }
    using A = std::conditional_t<std::is_same_v<T, bool>, int64_t, typename Acc<T>::type>;
    const T* pa = a.data_ptr<T>();
    const int64_t n_blocks = std::max<int64_t>(1, (n_red + kReduceBlock - 1) / kReduceBlock);
    std::vector<A> partial(static_cast<size_t>(n_out * n_blocks));
    // One work item per (output, block); see Note [Deterministic reductions].
    parallel_for(0, n_out * n_blocks, std::max<int64_t>(1, kReduceBlock / std::max<int64_t>(1, n_red)), [&](int64_t b, int64_t e) {
      for (int64_t w = b; w < e; ++w) {
        int64_t o = w / n_blocks, blk = w % n_blocks;
        int64_t base = 0;
        kept.walk(0, o, o + 1, [&](int64_t off) { base = off; });
        int64_t r0 = blk * kReduceBlock, r1 = std::min(n_red, r0 + kReduceBlock);
        A acc;
        if (kind == Reduce::Sum) {
          acc = 0;
          red.walk(base, r0, r1, [&](int64_t off) { acc += static_cast<A>(pa[off]); });
        } else {
          bool first = true;
          acc = 0;
          red.walk(base, r0, r1, [&](int64_t off) {
            A v = static_cast<A>(pa[off]);
            // NaN propagates and sticks, as in PyTorch.
            if (first) acc = v;
            else if (!is_nan(acc) && (is_nan(v) || (kind == Reduce::Max ? v > acc : v < acc))) acc = v;
            first = false;
          });
        }
        partial[static_cast<size_t>(w)] = acc;
      }
    });
    dispatch(out_dtype, [&](auto otag) {
      using O = typename decltype(otag)::type;
      O* po = out.data_ptr<O>();
      for (int64_t o = 0; o < n_out; ++o) {
        A acc = partial[static_cast<size_t>(o * n_blocks)];
        for (int64_t blk = 1; blk < n_blocks; ++blk) {
          A v = partial[static_cast<size_t>(o * n_blocks + blk)];
          if (kind == Reduce::Sum) acc += v;
          else if (!is_nan(acc) && (is_nan(v) || (kind == Reduce::Max ? v > acc : v < acc))) acc = v;
        }
        po[o] = static_cast<O>(acc);
      }
    });
  });
  return out;
}

// The maximum (or minimum) of x[0..n) and the first index holding it; the first NaN if there is
// one, as the scalar loop below. 16 lanes keep running extremes and see NaNs, then one pass finds
// where the winner first occurs: two cheap vector passes instead of a serial compare chain.
template <class T>
std::pair<T, int64_t> unit_stride_extreme(const T* x, int64_t n, bool is_max) {
  T lane[16];
  bool nan[16] = {};
  std::fill_n(lane, 16, x[0]);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
#pragma omp simd
    for (int j = 0; j < 16; ++j) {
      const T v = x[i + j];
      lane[j] = (is_max ? v > lane[j] : v < lane[j]) ? v : lane[j];
      nan[j] |= v != v;
    }
  T best = x[0];
  bool any_nan = false;
  for (int j = 0; j < 16; ++j) {
    best = (is_max ? lane[j] > best : lane[j] < best) ? lane[j] : best;
    any_nan |= nan[j];
  }
  for (; i < n; ++i) {
    best = (is_max ? x[i] > best : x[i] < best) ? x[i] : best;
    any_nan |= x[i] != x[i];
  }
  int64_t at = 0;
  if (any_nan) {
    while (x[at] == x[at]) ++at;
  } else {
    while (x[at] != best) ++at;
  }
  return {x[at], at};  // x[at], not best: of 0 and -0, the first one's sign
}

std::pair<Tensor, Tensor> reduce_with_index(const char* op, Reduce kind, const Tensor& a, int64_t dim, bool keepdim) {
  TP_PROFILE(op);
  const int64_t nd = a.dim();
  dim = wrap_dim(op, dim, nd);
  const int64_t n = nd == 0 ? 1 : a.size(dim);
  const int64_t stride = nd == 0 ? 0 : a.stride(dim);
  TP_CHECK(n > 0, "{}: cannot reduce an empty dimension (input shape {}, dim {})", op, a.sizes(), dim);
  StridedSpace kept;
  Shape out_shape;
  for (int64_t d = 0; d < nd; ++d) {
    if (d == dim) {
      if (keepdim) out_shape.push_back(1);
      continue;
    }
    kept.shape.push_back(a.size(d));
    kept.strides.push_back(a.stride(d));
    out_shape.push_back(a.size(d));
  }
  Tensor values = empty(out_shape, a.options());
  Tensor indices = empty(out_shape, TensorOptions(DType::Int64, a.device()));
  dispatch_numeric(a.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pa = a.data_ptr<T>();
    T* pv = values.data_ptr<T>();
    int64_t* pi = indices.data_ptr<int64_t>();
    const int64_t n_out = shape_numel(kept.shape);
    parallel_for(0, n_out, std::max<int64_t>(1, cpu::kGrainSize / n), [&](int64_t b, int64_t e) {
      kept.walk(0, b, e, [&, o = b](int64_t base) mutable {
        if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
          if (stride == 1 && n >= 64) {  // a row: vectorized (decoding's argmax over the vocabulary)
            const auto [value, index] = unit_stride_extreme(pa + base, n, kind == Reduce::Max);
            pv[o] = value;
            pi[o] = index;
            ++o;
            return;
          }
        }
        T best = pa[base];
        int64_t arg = 0;
        for (int64_t i = 1; i < n && !is_nan(best); ++i) {
          T v = pa[base + i * stride];
          if (is_nan(v) || (kind == Reduce::Max ? v > best : v < best)) {
            best = v;
            arg = i;
          }
        }
        pv[o] = best;
        pi[o] = arg;
        ++o;
      });
    });
  });
  return {values, indices};
}

// ---- softmax over one dim of a contiguous tensor viewed as [outer, n, inner] (split_at)

Tensor softmax(const Tensor& a_in, int64_t dim, bool log) {
  TP_PROFILE(log ? "log_softmax" : "softmax");
  const char* op = log ? "log_softmax" : "softmax";
  dim = wrap_dim(op, dim, a_in.dim());
  Tensor a = contiguous(a_in);
  Tensor out = empty(a.sizes(), a.options());
  DimSplit rv = split_at(a.sizes(), dim);
  dispatch_floating(a.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pa = a.data_ptr<T>();
    T* po = out.data_ptr<T>();
    parallel_for(0, rv.outer * rv.inner, std::max<int64_t>(1, cpu::kGrainSize / std::max<int64_t>(1, rv.n)),
                 [&](int64_t b, int64_t e) {
                   for (int64_t r = b; r < e; ++r) {
                     int64_t base = (r / rv.inner) * rv.n * rv.inner + r % rv.inner;
                     const T* x = pa + base;
                     T* y = po + base;
                     const int64_t s = rv.inner;
                     const int64_t n = rv.n;
                     // Each pass has a unit-stride twin, the common case (the last dim), vectorized.
                     T mx = -std::numeric_limits<T>::infinity();
                     if (s == 1) {
                       // 16 running maxima, then one: a single one is a serial chain of vmaxss.
                       // (NaN is skipped, as std::max(mx, NaN) does; the sum makes the row NaN.)
                       T lane[16];
                       std::fill_n(lane, 16, mx);
                       int64_t i = 0;
                       for (; i + 16 <= n; i += 16)
#pragma omp simd
                         for (int j = 0; j < 16; ++j) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
                       for (; i < n; ++i) mx = std::max(mx, x[i]);
                       for (int j = 0; j < 16; ++j) mx = std::max(mx, lane[j]);
                     } else {
                       for (int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i * s]);
                     }
                     // A row masked entirely to -inf has no max to subtract: softmax gives NaN, as in PyTorch.
                     double sum = 0;
                     if (s == 1) {
                       // Blocks of 256 summed in T, in vector lanes, then in double: a double
                       // accumulator per element keeps the loop scalar (4x slower on AVX-512).
                       for (int64_t i0 = 0; i0 < n; i0 += 256) {
                         const int64_t i1 = std::min<int64_t>(n, i0 + 256);
                         T part = 0;
#pragma omp simd reduction(+ : part)
                         for (int64_t i = i0; i < i1; ++i) part += vexp(x[i] - mx);
                         sum += part;
                       }
                     } else {
                       for (int64_t i = 0; i < n; ++i) sum += vexp(x[i * s] - mx);
                     }
                     if (log) {
                       // (x - max) - log(sum), never x - (max + log(sum)): max + log(sum) rounds
                       // away the log-sum at large magnitudes (1e300 + log 2 == 1e300).
                       const T log_sum = static_cast<T>(std::log(sum));
                       if (s == 1) {
#pragma omp simd
                         for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - mx) - log_sum;
                       } else {
                         for (int64_t i = 0; i < n; ++i) y[i * s] = (x[i * s] - mx) - log_sum;
                       }
                     } else {
                       T inv = static_cast<T>(1.0 / sum);
                       if (s == 1) {
#pragma omp simd
                         for (int64_t i = 0; i < n; ++i) y[i] = vexp(x[i] - mx) * inv;
                       } else {
                         for (int64_t i = 0; i < n; ++i) y[i * s] = vexp(x[i * s] - mx) * inv;
                       }
                     }
                   }
                 });
  });
  return out;
}

Tensor softmax_backward(const Tensor& y_in, const Tensor& dy_in, int64_t dim, bool log) {
  TP_PROFILE(log ? "log_softmax_backward" : "softmax_backward");
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  dim = wrap_dim(op, dim, y_in.dim());
  Tensor y = contiguous(y_in), dy = contiguous(dy_in);
  Tensor dx = empty(y.sizes(), y.options());
  DimSplit rv = split_at(y.sizes(), dim);
  dispatch_floating(y.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* py = y.data_ptr<T>();
    const T* pg = dy.data_ptr<T>();
    T* pd = dx.data_ptr<T>();
    parallel_for(0, rv.outer * rv.inner, std::max<int64_t>(1, cpu::kGrainSize / std::max<int64_t>(1, rv.n)),
                 [&](int64_t b, int64_t e) {
                   for (int64_t r = b; r < e; ++r) {
                     int64_t base = (r / rv.inner) * rv.n * rv.inner + r % rv.inner;
                     const int64_t s = rv.inner;
                     double dot = 0;
                     if (log) {
                       for (int64_t i = 0; i < rv.n; ++i) dot += pg[base + i * s];
                       // d log_softmax: dx = dy - softmax * sum(dy)
                       for (int64_t i = 0; i < rv.n; ++i)
                         pd[base + i * s] = pg[base + i * s] - vexp(py[base + i * s]) * static_cast<T>(dot);
                     } else {
                       for (int64_t i = 0; i < rv.n; ++i) dot += static_cast<double>(pg[base + i * s]) * py[base + i * s];
                       // d softmax: dx = y * (dy - sum(dy * y))
                       for (int64_t i = 0; i < rv.n; ++i)
                         pd[base + i * s] = py[base + i * s] * (pg[base + i * s] - static_cast<T>(dot));
                     }
                   }
                 });
  });
  return dx;
}

// Note [Row sums in lanes]: a row's sums of floats accumulate in double, as they always did, but
// in vector lanes rather than one chain: a chain of dependent double adds runs at one add per
// 4 cycles, which made a decoding step's layer norm (64 rows of 256) cost 40 us. Each term is the
// same float or double as before; only the order of the double adds changes. A double holds a
// sum of floats exactly unless their exponents spread over more than 29 bits, so the mean and
// the backward's sums come out the same, and the variance (squares rounded to double) moves by an
// ulp of a double, which reaches the float rstd in about one row in 2^29.
// ---- layer norm over the last norm_dims dims, rows = everything before; with center false, RMSNorm
LayerNormOut layer_norm(const Tensor& x_in, int64_t norm_dims, const Tensor& weight, const Tensor& bias, double eps,
                        bool center) {
  TP_PROFILE("layer_norm");
  Tensor x = contiguous(x_in);
  int64_t n = 1;
  for (int64_t d = x.dim() - norm_dims; d < x.dim(); ++d) n *= x.size(d);
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  Shape row_shape(x.sizes().begin(), x.sizes().end() - norm_dims);
  LayerNormOut r{empty(x.sizes(), x.options()), empty(row_shape, x.options()), empty(row_shape, x.options())};
  Tensor w = weight.defined() ? contiguous(weight) : weight, b = bias.defined() ? contiguous(bias) : bias;
  dispatch_floating(x.dtype(), "layer_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = x.data_ptr<T>();
    const T* pw = w.defined() ? w.data_ptr<T>() : nullptr;
    const T* pb = b.defined() ? b.data_ptr<T>() : nullptr;
    T* py = r.y.data_ptr<T>();
    T* pm = r.mean.data_ptr<T>();
    T* pr = r.rstd.data_ptr<T>();
    parallel_for(0, rows, std::max<int64_t>(1, cpu::kGrainSize / std::max<int64_t>(1, n)), [&](int64_t b0, int64_t e0) {
      for (int64_t row = b0; row < e0; ++row) {
        const T* xr = px + row * n;
        T* yr = py + row * n;
        // The sums run in double lanes (Note [Row sums in lanes]).
        double mean = 0, var = 0;
        if (center) {
#pragma omp simd reduction(+ : mean)
          for (int64_t i = 0; i < n; ++i) mean += xr[i];
          mean /= static_cast<double>(n);
        }
#pragma omp simd reduction(+ : var)
        for (int64_t i = 0; i < n; ++i) var += (xr[i] - mean) * (xr[i] - mean);
        var /= static_cast<double>(n);  // biased, as in the paper and PyTorch (RMSNorm: the mean square)
        const T m = static_cast<T>(mean), rs = static_cast<T>(1.0 / std::sqrt(var + eps));
        pm[row] = m;
        pr[row] = rs;
        for (int64_t i = 0; i < n; ++i) {
          T v = (xr[i] - m) * rs;
          if (pw) v *= pw[i];
          if (pb) v += pb[i];
          yr[i] = v;
        }
      }
    });
  });
  return r;
}

LayerNormGrads layer_norm_backward(const Tensor& dy_in, const Tensor& x_in, const Tensor& mean, const Tensor& rstd,
                                   int64_t norm_dims, const Tensor& weight, bool need_weight_grads, bool center) {
  TP_PROFILE("layer_norm_backward");
  Tensor x = contiguous(x_in), dy = contiguous(dy_in);
  int64_t n = 1;
  for (int64_t d = x.dim() - norm_dims; d < x.dim(); ++d) n *= x.size(d);
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  Shape norm_shape(x.sizes().end() - norm_dims, x.sizes().end());
  LayerNormGrads g{empty(x.sizes(), x.options()), Tensor(), Tensor()};
  Tensor w = weight.defined() ? contiguous(weight) : weight;
  dispatch_floating(x.dtype(), "layer_norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = x.data_ptr<T>();
    const T* pg = dy.data_ptr<T>();
    const T* pm = mean.data_ptr<T>();
    const T* pr = rstd.data_ptr<T>();
    const T* pw = w.defined() ? w.data_ptr<T>() : nullptr;
    T* pd = g.dx.data_ptr<T>();
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), with g = dy * weight; RMSNorm has no
    // mean(g) term (no mean was subtracted), and its stored mean is 0.
    parallel_for(0, rows, std::max<int64_t>(1, cpu::kGrainSize / std::max<int64_t>(1, n)), [&](int64_t b0, int64_t e0) {
      for (int64_t row = b0; row < e0; ++row) {
        const T* xr = px + row * n;
        const T* gr = pg + row * n;
        const T m = pm[row], rs = pr[row];
        double sum_g = 0, sum_gx = 0;
#pragma omp simd reduction(+ : sum_g, sum_gx)
        for (int64_t i = 0; i < n; ++i) {
          T gi = pw ? gr[i] * pw[i] : gr[i];
          sum_g += gi;
          sum_gx += gi * (xr[i] - m) * rs;
        }
        const T mg = center ? static_cast<T>(sum_g / n) : T(0), mgx = static_cast<T>(sum_gx / n);
        for (int64_t i = 0; i < n; ++i) {
          T gi = pw ? gr[i] * pw[i] : gr[i];
          pd[row * n + i] = rs * (gi - mg - (xr[i] - m) * rs * mgx);
        }
      }
    });
    if (!need_weight_grads) return;
    // dweight = sum_rows dy * xhat, dbias = sum_rows dy: fixed row blocks, combined in order.
    const int64_t block = 64, n_blocks = (rows + block - 1) / block;
    std::vector<double> pw_part(static_cast<size_t>(std::max<int64_t>(1, n_blocks) * n), 0.0), pb_part(pw_part.size(), 0.0);
    parallel_for(0, n_blocks, 1, [&](int64_t b0, int64_t e0) {
      for (int64_t blk = b0; blk < e0; ++blk) {
        double* aw = &pw_part[static_cast<size_t>(blk * n)];
        double* ab = &pb_part[static_cast<size_t>(blk * n)];
        for (int64_t row = blk * block; row < std::min(rows, (blk + 1) * block); ++row)
          for (int64_t i = 0; i < n; ++i) {
            T gi = pg[row * n + i];
            aw[i] += gi * (px[row * n + i] - pm[row]) * pr[row];
            ab[i] += gi;
          }
      }
    });
    g.dweight = empty(norm_shape, x.options());
    g.dbias = empty(norm_shape, x.options());
    T* gw = g.dweight.data_ptr<T>();
    T* gb = g.dbias.data_ptr<T>();
    for (int64_t i = 0; i < n; ++i) {
      double sw = 0, sb = 0;
      for (int64_t blk = 0; blk < n_blocks; ++blk) {
        sw += pw_part[static_cast<size_t>(blk * n + i)];
        sb += pb_part[static_cast<size_t>(blk * n + i)];
      }
      gw[i] = static_cast<T>(sw);
      gb[i] = static_cast<T>(sb);
    }
  });
  return g;
}

}  // namespace tapestry::kernels::cpu
