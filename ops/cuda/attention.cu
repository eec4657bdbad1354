// Scaled dot-product attention on the GPU, two kernels (tapestry::cuda::set_attention_kernel):
//   Gemm:  the scores of every (batch..., head) slice in one cuBLAS batched gemm, one block per
//          query row for the masking, the softmax statistics and the dropout, and gemms again for
//          the output and for every gradient. It holds the [BH, Tq, Tk] scores in memory.
//   Tiled: FlashAttention-style kernels that hold one tile of keys (or queries) per block in
//          shared memory, whose per-thread steps live in ops/detail/attention_tiles.h, where the CPU test
//          suite runs them too (tests/test_attention_tiles.cpp).
// Auto picks Tiled where Gemm's scores would take more than cuda::auto_tiled_bytes().
//
// The semantics are the CPU's, term for term: masked scores (by the mask or causality) become
// -1e9, the statistics saved per row are the maximum and log sum exp(score - maximum), the
// probabilities are exp computed with vexp, and dropout keeps element (s, i, j) when
// dropout_keeps((s * Tq + i) * Tk + j) (mod 2^32), so both devices drop the same elements.
#include <limits>

#include "tapestry/ops/cuda/blas.cuh"
#include "tapestry/ops/cuda/group_reduce.cuh"
#include "tapestry/ops/detail/attention_tiles.h"

namespace tapestry::kernels::cuda {

namespace {

constexpr int kRowThreads = kThreads;  // one group of kThreads per row (group_reduce)

template <class T> struct MaxOp {
  __device__ T operator()(T a, T b) const { return a > b ? a : b; }
};
template <class T> struct SumOp {
  __device__ T operator()(T a, T b) const { return a + b; }
};


struct Dropout {
  bool on;
  uint32_t key, threshold;
  double scale;
};

__device__ inline bool is_masked(const bool* mask_row, bool causal, int64_t query, int64_t key) {
  return (mask_row && mask_row[key]) || (causal && key > query);
}

// One block per query row: mask the scaled scores, save (max, log sum), and turn the row into
// the (dropped) probabilities in place.
template <class T>
__global__ void softmax_rows(T* scores, T* stats, const bool* mask, int64_t rows, int64_t tq, int64_t tk, bool causal,
                             Dropout drop) {
  // Rows beyond the grid loop; every thread of a block takes the same rows (group_reduce syncs).
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
  const int64_t query = row % tq;
  T* s = scores + row * tk;
  const bool* m = mask ? mask + row * tk : nullptr;
  T mx = -std::numeric_limits<T>::infinity();
  for (int64_t c = threadIdx.x; c < tk; c += blockDim.x) {
    const T v = is_masked(m, causal, query, c) ? static_cast<T>(kAttentionMasked) : s[c];
    s[c] = v;
    mx = v > mx ? v : mx;
  }
  mx = group_reduce(mx, MaxOp<T>());
  T sum = 0;
  for (int64_t c = threadIdx.x; c < tk; c += blockDim.x) {
    const T e = vexp(s[c] - mx);
    s[c] = e;
    sum += e;
  }
  sum = group_reduce(sum, SumOp<T>());
  const T inv = sum == T(0) ? T(0) : T(1) / sum;  // a NaN sum stays NaN (the CPU's rule)
  const uint32_t base = static_cast<uint32_t>(row * tk);
  for (int64_t c = threadIdx.x; c < tk; c += blockDim.x) {
    T p = s[c] * inv;
    if (drop.on) p = dropout_keeps(base + static_cast<uint32_t>(c), drop.key, drop.threshold) ? p * static_cast<T>(drop.scale) : T(0);
    s[c] = p;
  }
  if (threadIdx.x == 0) {
    stats[2 * row] = mx;
    stats[2 * row + 1] = sum == T(0) ? std::numeric_limits<T>::infinity() : math::log(sum);
  }
  }
}

// One block per query row of the backward: from the raw scaled scores, the saved statistics and
// dP' = dO V^T, writes dS = P (dP' z - D) (0 where masked) over dP', and the dropped
// probabilities P z over the scores, with D = dO . O of the row.
template <class T>
__global__ void backward_rows(T* scores, T* dprobs, const T* stats, const T* out, const T* dout, int64_t ev,
                              const bool* mask, int64_t rows, int64_t tq, int64_t tk, bool causal, Dropout drop) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
  const int64_t query = row % tq;
  T d = 0;
  for (int64_t j = threadIdx.x; j < ev; j += blockDim.x) d += out[row * ev + j] * dout[row * ev + j];
  d = group_reduce(d, SumOp<T>());
  const T row_max = stats[2 * row], log_sum = stats[2 * row + 1];
  T* s = scores + row * tk;
  T* dp = dprobs + row * tk;
  const bool* m = mask ? mask + row * tk : nullptr;
  const uint32_t base = static_cast<uint32_t>(row * tk);
  for (int64_t c = threadIdx.x; c < tk; c += blockDim.x) {
    const bool masked = is_masked(m, causal, query, c);
    const T score = masked ? static_cast<T>(kAttentionMasked) : s[c];
    const T p = vexp((score - row_max) - log_sum);
    T z = 1;
    if (drop.on) z = dropout_keeps(base + static_cast<uint32_t>(c), drop.key, drop.threshold) ? static_cast<T>(drop.scale) : T(0);
    dp[c] = masked ? T(0) : p * (dp[c] * z - d);
    s[c] = p * z;
  }
  }
}

// One block per row, looping when there are more rows than a grid holds.
unsigned row_blocks(int64_t rows) { return static_cast<unsigned>(std::min<int64_t>(rows, 65535LL * 32)); }

Dropout make_dropout(double p, uint64_t seed) {
  if (p <= 0) return {false, 0, 0, 1.0};
  return {true, dropout_key(seed), dropout_threshold(p), 1.0 / (1.0 - p)};
}

struct Prepared {
  Tensor q, k, v, mask;  // contiguous [lead..., T, E]; the mask as contiguous bool [lead..., Tq, Tk]
  int64_t bh = 0, tq = 0, tk = 0, e = 0, ev = 0;
};

Prepared prepare(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask) {
  Prepared P;
  check_attention_operands(op, q, k, v);
  const Shape lead(q.sizes().begin(), q.sizes().end() - 2);
  P.tq = q.size(-2), P.tk = k.size(-2), P.e = q.size(-1), P.ev = v.size(-1), P.bh = shape_numel(lead);
  P.q = contiguous(q), P.k = contiguous(k), P.v = contiguous(v);
  if (mask.defined()) {
    Shape full = lead;
    full.push_back(P.tq);
    full.push_back(P.tk);
    const Shape st = attention_mask_strides(op, mask, full);
    P.mask = contiguous(make_tensor(mask.impl().storage, full, st, mask.offset(), DType::Bool));
  }
  return P;
}


// ---- the tiled kernels: the steps of ops/detail/attention_tiles.h with barriers between them. Blocks
// of tiles::kThreads threads: x over query rows (or keys), y over the (batch..., head) slices.
// The forward (Steps = tiles::ForwardSteps: out, stats) and the dQ kernel (tiles::QueryGradSteps:
// dq): a thread per query row over tiles of keys.
template <class T, int HEAD, class Steps>
__global__ void tiled_query_rows(tiles::Params<T> P, T* out0, T* out1) {
  constexpr int kTile = tiles::tile_len<T, HEAD>();
  __shared__ T Ks[kTile * HEAD], Vs[kTile * HEAD];
  const int64_t r0 = blockIdx.x * static_cast<int64_t>(blockDim.x), i = r0 + threadIdx.x;
  const bool live = i < P.tq;
  const int64_t end = tiles::key_end(P, r0 + blockDim.x < P.tq ? r0 + blockDim.x : P.tq);
  for (int64_t s = blockIdx.y; s < P.bh; s += gridDim.y) {
    typename Steps::State row;
    if (live) Steps::begin(P, s, i, row);
    for (int64_t j0 = 0; j0 < end; j0 += kTile) {
      const int64_t len = end - j0 < kTile ? end - j0 : kTile;
      __syncthreads();  // every thread is done with the previous tile
      tiles::stage_keys<T, HEAD>(P, s, j0, len, threadIdx.x, blockDim.x, Ks, Vs);
      __syncthreads();
      if (live) Steps::consume(P, j0, len, Ks, Vs, row);
    }
    if (live) Steps::end(P, row, out0, out1);
  }
}

template <class T, int HEAD>
__global__ void tiled_dkv(tiles::Params<T> P, T* dk, T* dv) {
  constexpr int kTile = tiles::tile_len<T, HEAD>();
  __shared__ T Qs[kTile * HEAD], dOs[kTile * HEAD], rows[3 * kTile];
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const bool live = j < P.tk;
  const int64_t begin = tiles::query_begin(P, blockIdx.x * static_cast<int64_t>(blockDim.x));
  for (int64_t s = blockIdx.y; s < P.bh; s += gridDim.y) {
    tiles::KeyGrad<T, HEAD> key;
    if (live) tiles::dkv_begin(P, s, j, key);
    for (int64_t i0 = begin; i0 < P.tq; i0 += kTile) {
      const int64_t len = P.tq - i0 < kTile ? P.tq - i0 : kTile;
      __syncthreads();
      tiles::stage_queries<T, HEAD>(P, s, i0, len, threadIdx.x, blockDim.x, Qs, dOs, rows);
      __syncthreads();
      if (live) tiles::dkv_consume(P, i0, len, Qs, dOs, rows, key);
    }
    if (live) tiles::dkv_end(P, key, dk, dv);
  }
}

dim3 tiled_grid(int64_t rows, int64_t bh) {
  return dim3(static_cast<unsigned>((rows + tiles::kThreads - 1) / tiles::kThreads),
              static_cast<unsigned>(std::min<int64_t>(bh, 65535)));
}

// Whether this call runs the tiled kernels (tapestry::cuda::set_attention_kernel).
// (q, k and v were checked by the op: [..., Tq, E], [..., Tk, E], [..., Tk, Ev].)
bool use_tiled(const Tensor& q, const Tensor& k, const Tensor& v) {
  if (!tiles::head_fits(q.size(-1), v.size(-1))) return false;
  switch (::tapestry::cuda::attention_kernel()) {
    case ::tapestry::cuda::AttentionKernel::Gemm: return false;
    case ::tapestry::cuda::AttentionKernel::Tiled: return true;
    case ::tapestry::cuda::AttentionKernel::Auto: break;
  }
  const int64_t query_rows = shape_numel(Shape(q.sizes().begin(), q.sizes().end() - 1));  // B·H·Tq
  const double score_bytes = static_cast<double>(query_rows) * static_cast<double>(k.size(-2)) *
                             static_cast<double>(dtype_size(q.dtype()));
  return score_bytes > static_cast<double>(::tapestry::cuda::auto_tiled_bytes());
}

// The outputs of an attention over q [..., Tq, E] and v [..., Tk, Ev], uninitialised: out
// [..., Tq, Ev] and the statistics [..., Tq, 2].
AttentionOut empty_outputs(const Tensor& q, const Tensor& v) {
  Shape out_shape = q.sizes();
  out_shape.back() = v.size(-1);
  Shape lse_shape(q.sizes().begin(), q.sizes().end() - 1);
  lse_shape.push_back(2);
  return {empty_on(out_shape, q.dtype(), q.device()), empty_on(lse_shape, q.dtype(), q.device())};
}

// Fills `result` (empty_outputs).
void tiled_attention(const char* op, const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const Tensor& mask,
                     bool is_causal, double scale, double dropout_p, uint64_t seed, const AttentionOut& result) {
  const Tensor q = contiguous(q_in), k = contiguous(k_in), v = contiguous(v_in);
  dispatch_floating(q.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    Tensor mask_copy;
    const tiles::Params<T> P = tiles::make_params<T>(op, q, k, v, mask, is_causal, scale, dropout_p, seed, &mask_copy);
    if (P.bh == 0 || P.tq == 0) return;
    tiles::with_head(P.e, P.ev, [&](auto head) {
      constexpr int kHead = decltype(head)::value;
      tiled_query_rows<T, kHead, tiles::ForwardSteps<T, kHead>><<<tiled_grid(P.tq, P.bh), tiles::kThreads, 0, stream()>>>(
          P, result.out.template data_ptr<T>(), result.lse.template data_ptr<T>());
      TP_CUDA_LAUNCHED(op);
    });
  });
}

AttentionGrads tiled_attention_backward(const char* op, const Tensor& dout_in, const Tensor& q_in, const Tensor& k_in,
                                        const Tensor& v_in, const Tensor& out_in, const Tensor& lse,
                                        const Tensor& mask, bool is_causal, double scale, double dropout_p,
                                        uint64_t seed) {
  const Tensor q = contiguous(q_in), k = contiguous(k_in), v = contiguous(v_in);
  const Tensor dout = contiguous(dout_in), out = contiguous(out_in), stats = contiguous(lse);
  const Device device = q.device();
  Tensor dq = empty_on(q_in.sizes(), q.dtype(), device), dk = empty_on(k_in.sizes(), q.dtype(), device),
         dv = empty_on(v_in.sizes(), q.dtype(), device);
  dispatch_floating(q.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    Tensor mask_copy;
    tiles::Params<T> P = tiles::make_params<T>(op, q, k, v, mask, is_causal, scale, dropout_p, seed, &mask_copy);
    if (P.bh == 0 || P.tq == 0 || P.tk == 0) {  // nothing reaches q, k or v
      fill_(dq, 0.0), fill_(dk, 0.0), fill_(dv, 0.0);
      return;
    }
    Tensor d = empty_on({P.bh, P.tq}, q.dtype(), device);
    P.out = out.template data_ptr<T>(), P.dout = dout.template data_ptr<T>(), P.stats = stats.template data_ptr<T>();
    P.d = d.template data_ptr<T>();
    tiles::with_head(P.e, P.ev, [&](auto head) {
      constexpr int kHead = decltype(head)::value;
      tiled_query_rows<T, kHead, tiles::QueryGradSteps<T, kHead>><<<tiled_grid(P.tq, P.bh), tiles::kThreads, 0, stream()>>>(
          P, dq.template data_ptr<T>(), nullptr);
      TP_CUDA_LAUNCHED(op);
      tiled_dkv<T, kHead><<<tiled_grid(P.tk, P.bh), tiles::kThreads, 0, stream()>>>(
          P, dk.template data_ptr<T>(), dv.template data_ptr<T>());
      TP_CUDA_LAUNCHED(op);
    });
  });
  return {dq, dk, dv};
}
}  // namespace

AttentionOut scaled_dot_product_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                          const Tensor& mask, bool is_causal, double scale, double dropout_p,
                                          uint64_t seed) {
  const char* op = "scaled_dot_product_attention";
  const AttentionOut result = empty_outputs(q_in, v_in);
  if (use_tiled(q_in, k_in, v_in)) {
    tiled_attention(op, q_in, k_in, v_in, mask, is_causal, scale, dropout_p, seed, result);
    return result;
  }
  Prepared P = prepare(op, q_in, k_in, v_in, mask);
  const Device device = q_in.device();
  Tensor out = result.out, lse = result.lse;
  if (P.bh == 0 || P.tq == 0) return {out, lse};
  if (P.tk == 0 || P.ev == 0) {  // no keys: the CPU's zeros and an empty sum
    fill_(out, 0.0);
    // lse[..., 0] and lse[..., 1], as views built here (Tensor::select is autograd's).
    Shape rows(lse.sizes().begin(), lse.sizes().end() - 1), row_strides(lse.strides().begin(), lse.strides().end() - 1);
    fill_(make_tensor(lse.impl().storage, rows, row_strides, lse.offset(), lse.dtype()), -std::numeric_limits<double>::infinity());
    fill_(make_tensor(lse.impl().storage, rows, row_strides, lse.offset() + lse.stride(-1), lse.dtype()),
          std::numeric_limits<double>::infinity());
    if (P.tk > 0) {  // values of width 0: the statistics still hold
      Tensor scores = empty_on({P.bh, P.tq, P.tk}, q_in.dtype(), device);
      dispatch_floating(q_in.dtype(), op, [&](auto tag) {
        using T = typename decltype(tag)::type;
        if (P.e == 0) fill_(scores, 0.0);  // no features: every score is 0 (cuBLAS is not asked for k = 0)
        else
          gemm_batched<T>(op, false, true, P.tq, P.tk, P.e, scale, P.q.template data_ptr<T>(), P.e, P.tq * P.e,
                          P.k.template data_ptr<T>(), P.e, P.tk * P.e, 0.0, scores.template data_ptr<T>(), P.tk,
                          P.tq * P.tk, P.bh);
        softmax_rows<T><<<row_blocks(P.bh * P.tq), kRowThreads, 0, stream()>>>(
            scores.template data_ptr<T>(), lse.template data_ptr<T>(),
            P.mask.defined() ? P.mask.template data_ptr<bool>() : nullptr, P.bh * P.tq, P.tq, P.tk, is_causal,
            make_dropout(dropout_p, seed));
        TP_CUDA_LAUNCHED(op);
      });
    }
    return {out, lse};
  }
  Tensor scores = empty_on({P.bh, P.tq, P.tk}, q_in.dtype(), device);
  dispatch_floating(q_in.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* S = scores.template data_ptr<T>();
    if (P.e == 0) fill_(scores, 0.0);  // no features: every score is 0 (cuBLAS is not asked for k = 0)
    else
      gemm_batched<T>(op, false, true, P.tq, P.tk, P.e, scale, P.q.template data_ptr<T>(), P.e, P.tq * P.e,
                      P.k.template data_ptr<T>(), P.e, P.tk * P.e, 0.0, S, P.tk, P.tq * P.tk, P.bh);
    softmax_rows<T><<<row_blocks(P.bh * P.tq), kRowThreads, 0, stream()>>>(
        S, lse.template data_ptr<T>(), P.mask.defined() ? P.mask.template data_ptr<bool>() : nullptr, P.bh * P.tq,
        P.tq, P.tk,
        is_causal, make_dropout(dropout_p, seed));
    TP_CUDA_LAUNCHED(op);
    gemm_batched<T>(op, false, false, P.tq, P.ev, P.tk, 1.0, S, P.tk, P.tq * P.tk, P.v.template data_ptr<T>(), P.ev,
                    P.tk * P.ev, 0.0, out.template data_ptr<T>(), P.ev, P.tq * P.ev, P.bh);
  });
  return {out, lse};
}

AttentionGrads scaled_dot_product_attention_backward(const Tensor& dout_in, const Tensor& q_in, const Tensor& k_in,
                                                     const Tensor& v_in, const Tensor& out_in, const Tensor& lse,
                                                     const Tensor& mask, bool is_causal, double scale,
                                                     double dropout_p, uint64_t seed) {
  const char* op = "scaled_dot_product_attention_backward";
  if (use_tiled(q_in, k_in, v_in))
    return tiled_attention_backward(op, dout_in, q_in, k_in, v_in, out_in, lse, mask, is_causal, scale, dropout_p,
                                    seed);
  Prepared P = prepare(op, q_in, k_in, v_in, mask);
  const Device device = q_in.device();
  const DType dtype = q_in.dtype();
  Tensor dq = empty_on(q_in.sizes(), dtype, device), dk = empty_on(k_in.sizes(), dtype, device),
         dv = empty_on(v_in.sizes(), dtype, device);
  // Every element of dq, dk and dv is written by a beta-0 gemm below (a width of 0 leaves nothing
  // to write), so only the cases without queries or keys fill them: nothing reaches q, k or v.
  if (P.bh == 0 || P.tq == 0 || P.tk == 0) {
    fill_(dq, 0.0), fill_(dk, 0.0), fill_(dv, 0.0);
    return {dq, dk, dv};
  }
  Tensor dout = contiguous(dout_in), out = contiguous(out_in), stats = contiguous(lse);
  Tensor scores = empty_on({P.bh, P.tq, P.tk}, dtype, device), dprobs = empty_on({P.bh, P.tq, P.tk}, dtype, device);
  dispatch_floating(dtype, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *Q = P.q.template data_ptr<T>(), *K = P.k.template data_ptr<T>(), *V = P.v.template data_ptr<T>();
    const T* dO = dout.template data_ptr<T>();
    T *S = scores.template data_ptr<T>(), *dP = dprobs.template data_ptr<T>();
    const int64_t tq = P.tq, tk = P.tk, e = P.e, ev = P.ev, bh = P.bh;
    if (e == 0) fill_(scores, 0.0);
    else gemm_batched<T>(op, false, true, tq, tk, e, scale, Q, e, tq * e, K, e, tk * e, 0.0, S, tk, tq * tk, bh);
    if (ev > 0)  // dP' = dO V^T
      gemm_batched<T>(op, false, true, tq, tk, ev, 1.0, dO, ev, tq * ev, V, ev, tk * ev, 0.0, dP, tk, tq * tk, bh);
    else
      fill_(dprobs, 0.0);
    backward_rows<T><<<row_blocks(bh * tq), kRowThreads, 0, stream()>>>(
        S, dP, stats.template data_ptr<T>(), out.template data_ptr<T>(), dO, ev,
        P.mask.defined() ? P.mask.template data_ptr<bool>() : nullptr, bh * tq, tq, tk, is_causal,
        make_dropout(dropout_p, seed));
    TP_CUDA_LAUNCHED(op);
    // dV = (P z)^T dO, dQ = scale dS K, dK = scale dS^T Q
    if (ev > 0)
      gemm_batched<T>(op, true, false, tk, ev, tq, 1.0, S, tk, tq * tk, dO, ev, tq * ev, 0.0, dv.template data_ptr<T>(),
                      ev, tk * ev, bh);
    if (e > 0) {
      gemm_batched<T>(op, false, false, tq, e, tk, scale, dP, tk, tq * tk, K, e, tk * e, 0.0,
                      dq.template data_ptr<T>(), e, tq * e, bh);
      gemm_batched<T>(op, true, false, tk, e, tq, scale, dP, tk, tq * tk, Q, e, tq * e, 0.0,
                      dk.template data_ptr<T>(), e, tk * e, bh);
    }
  });
  return {dq, dk, dv};
}

}  // namespace tapestry::kernels::cuda
