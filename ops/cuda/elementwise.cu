// CUDA elementwise kernels: binary ops with broadcasting, unary ops, where, copy (with dtype
// conversion), fill, contiguous, to_dtype, dropout, the random fills and the fused Adam step.
//
// Design:
// - One templated kernel per shape of work (binary, unary, where, copy, fill), instantiated per
//   element type and per functor of ops/detail/math.h: the math is the CPU's, not a copy of it.
//   with_binary_op / with_unary_op pick the functor on the host; `if constexpr` keeps kernels
//   from being instantiated for pairs the checks refuse (bool arithmetic, Div on int64, ...).
// - Operands are read through their strides with StridedIndexer (broadcast dims have stride 0),
//   so views need no copies. When every operand is contiguous and of the output's shape, the
//   kernels skip the index arithmetic and use the linear index directly (a uniform branch).
// - Validation, dtype rules, error messages and version bumps are those of ops/cpu/elementwise.cpp.
// - Random fills draw on the host with the CPU backend and copy the numbers over, so a seed gives
//   the same tensor on every device; dropout uses the same counter-based hash as the CPU, so both
//   devices drop the same elements.
// - adam_step_ rounds after every operation (no fused multiply-add): the CPU's expression, as written.
#include <type_traits>

#include "tapestry/ops/cuda/common.cuh"

namespace tapestry::kernels::cuda {

namespace {

// True when t can be read with the output's linear index.
bool is_plain(const Tensor& t, const Shape& shape) { return t.is_contiguous() && t.sizes() == shape; }

// ---- binary

template <class R, class T, class Op>
__global__ void binary_kernel(StridedIndexer<3> ix, bool linear, R* out, const T* a, const T* b, Op fn, int64_t n) {
  if (linear) {
    TP_GRID_STRIDE(i, n) out[i] = fn(a[i], b[i]);
  } else {
    TP_GRID_STRIDE(i, n) {
      int64_t off[3];
      ix.offsets(i, off);
      out[off[0]] = fn(a[off[1]], b[off[2]]);
    }
  }
}

// out = fn(a, b) over out's shape; out may be a itself (in place), so it is written through its strides.
template <class R, class T, class Op>
void launch_binary(const char* op, const Tensor& out, const Tensor& a, const Tensor& b, Op fn) {
  const Shape& shape = out.sizes();
  const int64_t n = out.numel();
  if (n == 0) return;
  const bool linear = is_plain(out, shape) && is_plain(a, shape) && is_plain(b, shape);
  StridedIndexer<3> ix;
  if (!linear) ix = make_indexer<3>(shape, {out.strides(), broadcast_strides(a, shape), broadcast_strides(b, shape)});
  binary_kernel<R, T, Op><<<blocks_for(n), kThreads, 0, stream()>>>(ix, linear, out.data_ptr<R>(), a.data_ptr<T>(),
                                                                     b.data_ptr<T>(), fn, n);
  TP_CUDA_LAUNCHED(op);
}

// The functor of `kind` (ops/detail/math.h) over a and b, into out.
void run_binary(const char* op, Binary kind, const Tensor& out, const Tensor& a, const Tensor& b) {
  dispatch(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_binary_op(kind, [&](auto fn) {
      using Op = decltype(fn);
      if constexpr (Op::comparison) launch_binary<bool, T>(op, out, a, b, fn);
      else if constexpr (std::is_same_v<T, bool> || (Op::floating_only && !std::is_floating_point_v<T>))
        TP_CHECK(false, "binary: this kind takes floating tensors, got {}", dtype_of<T>());  // the dispatcher's check_binary stops these
      else launch_binary<T, T>(op, out, a, b, fn);
    });
  });
}

}  // namespace

Tensor binary(const char* op, Binary kind, const Tensor& a, const Tensor& b) {
  Shape shape = broadcast_shapes(op, a.sizes(), b.sizes());
  Tensor out = empty_on(shape, is_comparison(kind) ? DType::Bool : a.dtype(), a.device());
  run_binary(op, kind, out, a, b);
  return out;
}

void binary_(const char* op, Binary kind, Tensor& a, const Tensor& b) {
  run_binary(op, kind, a, a, b);
  a.impl().storage->version++;
}

// ---- unary

namespace {

// The output is fresh and contiguous: written at the linear index; only the input is strided.
template <class T, class Op>
__global__ void unary_kernel(StridedIndexer<1> ix, bool linear, T* out, const T* a, Op fn, int64_t n) {
  if (linear) {
    TP_GRID_STRIDE(i, n) out[i] = fn(a[i]);
  } else {
    TP_GRID_STRIDE(i, n) {
      int64_t off[1];
      ix.offsets(i, off);
      out[i] = fn(a[off[0]]);
    }
  }
}

template <class T, class Op>
void launch_unary(const char* op, const Tensor& out, const Tensor& a, Op fn) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const bool linear = a.is_contiguous();
  StridedIndexer<1> ix;
  if (!linear) ix = make_indexer<1>(a.sizes(), {a.strides()});
  unary_kernel<T, Op><<<blocks_for(n), kThreads, 0, stream()>>>(ix, linear, out.data_ptr<T>(), a.data_ptr<T>(), fn, n);
  TP_CUDA_LAUNCHED(op);
}

}  // namespace

Tensor unary(const char* op, Unary kind, const Tensor& a, double p0, double p1) {
  Tensor out = empty_on(a.sizes(), a.dtype(), a.device());
  auto run = [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_unary_op(kind, p0, p1, [&](auto fn) {
      if constexpr (!decltype(fn)::floating_only || std::is_floating_point_v<T>) launch_unary<T>(op, out, a, fn);
    });
  };
  if (unary_needs_floating(kind)) dispatch_floating(a.dtype(), op, run);
  else dispatch_numeric(a.dtype(), op, run);
  return out;
}

// ---- where

namespace {

template <class T>
__global__ void where_kernel(StridedIndexer<3> ix, bool linear, T* out, const bool* cond, const T* a, const T* b,
                             int64_t n) {
  if (linear) {
    TP_GRID_STRIDE(i, n) out[i] = cond[i] ? a[i] : b[i];
  } else {
    TP_GRID_STRIDE(i, n) {
      int64_t off[3];
      ix.offsets(i, off);
      out[i] = cond[off[0]] ? a[off[1]] : b[off[2]];
    }
  }
}

}  // namespace

Tensor where(const char* op, const Tensor& cond, const Tensor& a, const Tensor& b) {
  Shape shape = broadcast_shapes(op, broadcast_shapes(op, cond.sizes(), a.sizes()), b.sizes());
  Tensor out = empty_on(shape, a.dtype(), a.device());
  const int64_t n = out.numel();
  if (n == 0) return out;
  const bool linear = is_plain(cond, shape) && is_plain(a, shape) && is_plain(b, shape);
  StridedIndexer<3> ix;
  if (!linear)
    ix = make_indexer<3>(shape,
                         {broadcast_strides(cond, shape), broadcast_strides(a, shape), broadcast_strides(b, shape)});
  dispatch(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    where_kernel<T><<<blocks_for(n), kThreads, 0, stream()>>>(ix, linear, out.data_ptr<T>(), cond.data_ptr<bool>(),
                                                              a.data_ptr<T>(), b.data_ptr<T>(), n);
    TP_CUDA_LAUNCHED(op);
  });
  return out;
}

// ---- copy, fill, contiguous, to_dtype

namespace {

template <class D, class S>
__global__ void copy_kernel(StridedIndexer<2> ix, bool linear, D* dst, const S* src, int64_t n) {
  if (linear) {
    TP_GRID_STRIDE(i, n) dst[i] = static_cast<D>(src[i]);
  } else {
    TP_GRID_STRIDE(i, n) {
      int64_t off[2];
      ix.offsets(i, off);
      dst[off[0]] = static_cast<D>(src[off[1]]);
    }
  }
}

template <class T>
__global__ void fill_kernel(StridedIndexer<1> ix, bool linear, T* dst, T value, int64_t n) {
  if (linear) {
    TP_GRID_STRIDE(i, n) dst[i] = value;
  } else {
    TP_GRID_STRIDE(i, n) {
      int64_t off[1];
      ix.offsets(i, off);
      dst[off[0]] = value;
    }
  }
}

}  // namespace

// Both tensors are on this device (the dispatcher stages cross-device copies).
void copy_(const Tensor& dst, const Tensor& src) {
  const Shape& shape = dst.sizes();  // src broadcasts to it (checked by the dispatcher)
  const int64_t n = dst.numel();
  if (n > 0) {
    const bool linear = is_plain(dst, shape) && is_plain(src, shape);
    if (linear && dst.dtype() == src.dtype()) {
      // A byte copy is the fastest form; a tensor copied onto itself needs nothing (and memcpy
      // on overlapping memory is undefined).
      if (dst.raw_data() != src.raw_data())
        TP_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), static_cast<size_t>(n) * dtype_size(dst.dtype()),
                                      cudaMemcpyDeviceToDevice, stream()),
                      "copy_");
    } else {
      StridedIndexer<2> ix;
      if (!linear) ix = make_indexer<2>(shape, {dst.strides(), broadcast_strides(src, shape)});
      dispatch(dst.dtype(), [&](auto dtag) {
        using D = typename decltype(dtag)::type;
        dispatch(src.dtype(), [&](auto stag) {
          using S = typename decltype(stag)::type;
          copy_kernel<D, S><<<blocks_for(n), kThreads, 0, stream()>>>(ix, linear, dst.data_ptr<D>(),
                                                                      src.data_ptr<S>(), n);
          TP_CUDA_LAUNCHED("copy_");
        });
      });
    }
  }
  dst.impl().storage->version++;
}

void fill_(const Tensor& dst, double value) {
  const int64_t n = dst.numel();
  if (n > 0) {
    dispatch(dst.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      const bool linear = dst.is_contiguous();
      StridedIndexer<1> ix;
      if (!linear) ix = make_indexer<1>(dst.sizes(), {dst.strides()});
      fill_kernel<T><<<blocks_for(n), kThreads, 0, stream()>>>(ix, linear, dst.data_ptr<T>(), static_cast<T>(value), n);
      TP_CUDA_LAUNCHED("fill_");
    });
  }
  dst.impl().storage->version++;
}

// ---- dropout

namespace {

// The CPU's expression (ops/cpu/elementwise.cpp dropout_run), element k of the contiguous input.
template <class T>
__global__ void dropout_kernel(const T* x, T* out, int64_t n, uint32_t key, uint32_t threshold, T scale) {
  TP_GRID_STRIDE(k, n) out[k] = x[k] * (dropout_keeps(static_cast<uint32_t>(k), key, threshold) ? scale : T(0));
}

}  // namespace

Tensor dropout(const Tensor& x_in, double p, uint64_t seed) {
  Tensor x = contiguous(x_in);
  Tensor out = empty_on(x.sizes(), x.dtype(), x.device());
  const uint32_t threshold = dropout_threshold(p);
  dispatch_floating(x.dtype(), "dropout", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t n = x.numel();
    if (n == 0) return;
    const T scale = static_cast<T>(1.0 / (1.0 - p));
    dropout_kernel<T><<<blocks_for(n), kThreads, 0, stream()>>>(x.data_ptr<T>(), out.data_ptr<T>(), n,
                                                                dropout_key(seed), threshold, scale);
    TP_CUDA_LAUNCHED("dropout");
  });
  return out;
}

// ---- random fills

namespace {

// Draws into a CPU tensor with the CPU backend (its checks, its order of draws), then copies it
// into dst through the dispatcher, which stages the transfer and bumps dst's version.
template <class Draw>
void fill_from_host(const Tensor& dst, Draw draw) {
  Tensor host = tapestry::empty(dst.sizes(), TensorOptions(dst.dtype(), Device::CPU));
  draw(host);
  ::tapestry::kernels::copy_(dst, host);
}

}  // namespace

void uniform_(const Tensor& dst, double lo, double hi, std::mt19937_64& engine) {
  fill_from_host(dst, [&](const Tensor& host) { ::tapestry::kernels::cpu::uniform_(host, lo, hi, engine); });
}

void normal_(const Tensor& dst, double mean, double std, std::mt19937_64& engine) {
  fill_from_host(dst, [&](const Tensor& host) { ::tapestry::kernels::cpu::normal_(host, mean, std, engine); });
}

void randint_(const Tensor& dst, int64_t low, int64_t high, std::mt19937_64& engine) {
  fill_from_host(dst, [&](const Tensor& host) { ::tapestry::kernels::cpu::randint_(host, low, high, engine); });
}

// ---- Adam

namespace {

// nvcc contracts a * b + c into one fused multiply-add wherever it likes. These intrinsics are
// never contracted: each operation of the CPU's expression is rounded as written, which gives the
// bits of a CPU build without FMA (TAPESTRY_NATIVE=OFF). A -march=native host build may fuse some
// of the multiply-adds itself (GCC contracts by default in C++) and differ in the last bit.
__device__ inline float mul_rn(float x, float y) { return __fmul_rn(x, y); }
__device__ inline double mul_rn(double x, double y) { return __dmul_rn(x, y); }
__device__ inline float add_rn(float x, float y) { return __fadd_rn(x, y); }
__device__ inline double add_rn(double x, double y) { return __dadd_rn(x, y); }
__device__ inline float div_rn(float x, float y) { return __fdiv_rn(x, y); }
__device__ inline double div_rn(double x, double y) { return __ddiv_rn(x, y); }

template <class T>
struct AdamScalars {
  T b1, b2, wd, decay, step_size, bc, eps;
  bool decoupled, l2;
};

// Up to kAdamTable tensors per launch, their pointers passed by value as a kernel argument (no
// copy of a table to the device, so no synchronisation): 48 x 40 bytes, within the 4 KiB limit.
constexpr int kAdamTable = 48;
constexpr int64_t kAdamChunk = 65536;  // elements per block-chunk of one tensor
template <class T> struct AdamTable {
  T* param[kAdamTable];
  const T* grad[kAdamTable];
  T* exp_avg[kAdamTable];
  T* exp_avg_sq[kAdamTable];
  int64_t numel[kAdamTable];
  int64_t first_chunk[kAdamTable + 1];  // tensor t owns chunks [first_chunk[t], first_chunk[t + 1])
  int count;
};

// One element's update, in the CPU's order of operations (cpu::adam_step_).
template <class T>
__device__ void adam_update(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, const AdamScalars<T>& s, int64_t j) {
  T g = grad[j];
  T p = param[j];
  if (s.decoupled) p = mul_rn(p, s.decay);
  else if (s.l2) g = add_rn(g, mul_rn(s.wd, p));
  const T m = add_rn(mul_rn(exp_avg[j], s.b1), mul_rn(g, add_rn(T(1), -s.b1)));
  const T v = add_rn(mul_rn(exp_avg_sq[j], s.b2), mul_rn(mul_rn(g, g), add_rn(T(1), -s.b2)));
  exp_avg[j] = m;
  exp_avg_sq[j] = v;
  param[j] = add_rn(p, -div_rn(mul_rn(s.step_size, m), add_rn(div_rn(math::sqrt(v), s.bc), s.eps)));
}

// Block-chunks over the table's tensors: chunk c (grid-strided) belongs to the tensor t that owns it
// and covers kAdamChunk of its elements, which the block's threads stride over.
template <class T>
__global__ void adam_multi_kernel(AdamTable<T> table, AdamScalars<T> s, int64_t chunks) {
  for (int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    int t = 0;
    while (t + 1 < table.count && table.first_chunk[t + 1] <= c) ++t;
    const int64_t begin = (c - table.first_chunk[t]) * kAdamChunk;
    const int64_t end = begin + kAdamChunk < table.numel[t] ? begin + kAdamChunk : table.numel[t];
    for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x)
      adam_update(table.param[t], table.grad[t], table.exp_avg[t], table.exp_avg_sq[t], s, j);
  }
}

}  // namespace

void adam_step_(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                const std::vector<Tensor>& exp_avgs, const std::vector<Tensor>& exp_avg_sqs, const AdamStep& step) {
  for (size_t i = 0; i < params.size();) {
    dispatch_floating(params[i].dtype(), "adam_step_", [&](auto tag) {
      using T = typename decltype(tag)::type;
      AdamScalars<T> s;
      s.b1 = static_cast<T>(step.beta1);
      s.b2 = static_cast<T>(step.beta2);
      s.wd = static_cast<T>(step.weight_decay);
      s.decay = static_cast<T>(step.decay);
      s.step_size = static_cast<T>(step.step_size);
      s.bc = static_cast<T>(step.bias_correction2_sqrt);
      s.eps = static_cast<T>(step.eps);
      s.decoupled = step.decoupled;
      s.l2 = !step.decoupled && step.weight_decay != 0;
      AdamTable<T> table{};
      int64_t chunks = 0;
      for (; i < params.size() && table.count < kAdamTable && params[i].dtype() == dtype_of<T>(); ++i) {
        params[i].impl().storage->version++;
        const int64_t n = params[i].numel();
        if (n == 0) continue;
        const int k = table.count++;
        table.param[k] = params[i].data_ptr<T>();
        table.grad[k] = grads[i].data_ptr<T>();
        table.exp_avg[k] = exp_avgs[i].data_ptr<T>();
        table.exp_avg_sq[k] = exp_avg_sqs[i].data_ptr<T>();
        table.numel[k] = n;
        table.first_chunk[k] = chunks;
        chunks += (n + kAdamChunk - 1) / kAdamChunk;
      }
      table.first_chunk[table.count] = chunks;
      if (chunks == 0) return;
      const unsigned grid = static_cast<unsigned>(chunks < 65535 ? chunks : 65535);
      adam_multi_kernel<T><<<grid, kThreads, 0, stream()>>>(table, s, chunks);
      TP_CUDA_LAUNCHED("adam_step_");
    });
  }
}

namespace {

// out[i] = in[i] inside the triangle of its [rows, cols] matrix, 0 (false) outside; in contiguous.
template <class T>
__global__ void triangle_kernel(const T* in, T* out, int64_t n, int64_t rows, int64_t cols, int64_t diagonal,
                                bool upper) {
  TP_GRID_STRIDE(i, n) {
    const int64_t j = i % cols, r = (i / cols) % rows;
    const bool keep = upper ? j - r >= diagonal : j - r <= diagonal;
    out[i] = keep ? in[i] : T(0);
  }
}

}  // namespace

// On the device (causal masks are made with it every forward: a host round trip would be two
// synchronisations per step). The dispatcher checked the dims.
Tensor triangle(const char* op, const Tensor& a_in, int64_t diagonal, bool upper) {
  Tensor out = empty_on(a_in.sizes(), a_in.dtype(), a_in.device());
  const int64_t n = out.numel();
  if (n == 0) return out;
  Tensor a = contiguous(a_in);
  const int64_t rows = a.size(-2), cols = a.size(-1);
  dispatch(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    triangle_kernel<T><<<blocks_for(n), kThreads, 0, stream()>>>(a.data_ptr<T>(), out.data_ptr<T>(), n, rows, cols,
                                                                 diagonal, upper);
    TP_CUDA_LAUNCHED(op);
  });
  return out;
}

}  // namespace tapestry::kernels::cuda
