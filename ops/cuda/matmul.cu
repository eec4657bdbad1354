// matmul on cuBLAS: cublasGemmStridedBatchedEx for every batch at once. cuBLAS is column-major;
// a row-major C = A B is the column-major C^T = B^T A^T, so the operands are passed swapped
// (gemm_batched). Strided operands go in as transposes and leading dimensions, as on the CPU
// (the same gemm_layout rules); a batch whose matrices are not evenly spaced (a broadcast over
// some batch dims but not others) is first copied to an evenly spaced one. Under autocast to
// bfloat16 (ops/autocast.h), float32 operands are rounded to contiguous bfloat16 copies (a weight
// reads its kept mirror instead, Note [Autocast weight cache]) and multiplied by cuBLAS with
// float32 accumulation and a float32 result, as PyTorch's CUDA autocast.
#include <cuda_bf16.h>

#include <memory>
#include <tuple>
#include <vector>

#include "tapestry/ops/autocast.h"
#include "tapestry/ops/cuda/blas.cuh"

namespace tapestry::kernels::cuda {

template <class T>
void gemm_batched(const char* op, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha,
                  const T* A, int64_t lda, int64_t stride_a, const T* B, int64_t ldb, int64_t stride_b, double beta,
                  T* C, int64_t ldc, int64_t stride_c, int64_t batch) {
  if (M == 0 || N == 0 || batch == 0) return;
  constexpr bool is_float = std::is_same_v<T, float>;
  const cudaDataType_t type = is_float ? CUDA_R_32F : CUDA_R_64F;
  const cublasComputeType_t compute =
      is_float ? (::tapestry::cuda::allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F) : CUBLAS_COMPUTE_64F;
  const T a = static_cast<T>(alpha), b = static_cast<T>(beta);
  TP_CHECK(M <= INT32_MAX && N <= INT32_MAX && K <= INT32_MAX && batch <= INT32_MAX && lda <= INT32_MAX &&
               ldb <= INT32_MAX && ldc <= INT32_MAX,
           "{}: a matrix dimension, leading dimension or batch count above 2^31 is beyond cuBLAS", op);
  // Column-major C^T (N x M) = op(B)^T (N x K) op(A)^T (K x M).
  runtime::count_launch();
  TP_CUBLAS_CHECK(cublasGemmStridedBatchedEx(cublas(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                             trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(N),
                                             static_cast<int>(M), static_cast<int>(K), &a, B, type,
                                             static_cast<int>(std::max<int64_t>(ldb, 1)), stride_b, A, type,
                                             static_cast<int>(std::max<int64_t>(lda, 1)), stride_a, &b, C, type,
                                             static_cast<int>(std::max<int64_t>(ldc, 1)), stride_c,
                                             static_cast<int>(batch), compute, CUBLAS_GEMM_DEFAULT),
                  op);
}

template void gemm_batched<float>(const char*, bool, bool, int64_t, int64_t, int64_t, double, const float*, int64_t,
                                  int64_t, const float*, int64_t, int64_t, double, float*, int64_t, int64_t, int64_t);
template void gemm_batched<double>(const char*, bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t,
                                   int64_t, const double*, int64_t, int64_t, double, double*, int64_t, int64_t,
                                   int64_t);

namespace {

// dst[i] = bfloat16(src at the i-th element of the view), rounded to nearest even (bf16_round).
__global__ void to_bf16_kernel(const float* src, StridedIndexer<1> ix, __nv_bfloat16* dst, int64_t n) {
  TP_GRID_STRIDE(i, n) {
    int64_t off[1];
    ix.offsets(i, off);
    dst[i] = __float2bfloat16_rn(src[off[0]]);
  }
}

// A view's elements as a contiguous bfloat16 buffer on its device (row-major over its shape).
std::shared_ptr<Storage> bf16_copy(const Tensor& view) {
  const int64_t n = view.numel();
  auto out = std::make_shared<Storage>(static_cast<size_t>(std::max<int64_t>(n, 1)) * 2, view.device());
  const StridedIndexer<1> ix = make_indexer<1>(view.sizes(), {view.strides()});
  to_bf16_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(view.data_ptr<float>(), ix,
                                                            static_cast<__nv_bfloat16*>(out->data), n);
  TP_CUDA_LAUNCHED("matmul");
  return out;
}

// C (float32, row-major, contiguous) = op(A) op(B) over `batch` matrices from bfloat16 operands,
// float32 accumulation; the operands' layouts as gemm_batched's (a stride of 0 repeats one matrix).
void gemm_bf16_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda,
                       int64_t stride_a, const void* B, int64_t ldb, int64_t stride_b, float* C, int64_t batch) {
  TP_CHECK(M <= INT32_MAX && N <= INT32_MAX && K <= INT32_MAX && batch <= INT32_MAX && lda <= INT32_MAX &&
               ldb <= INT32_MAX,
           "matmul: a matrix dimension, leading dimension or batch count above 2^31 is beyond cuBLAS");
  const float one = 1.0f, zero = 0.0f;
  runtime::count_launch();
  // Column-major C^T (N x M) = op(B)^T op(A)^T, as gemm_batched.
  TP_CUBLAS_CHECK(cublasGemmStridedBatchedEx(cublas(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                             trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(N),
                                             static_cast<int>(M), static_cast<int>(K), &one, B, CUDA_R_16BF,
                                             static_cast<int>(std::max<int64_t>(ldb, 1)), stride_b, A, CUDA_R_16BF,
                                             static_cast<int>(std::max<int64_t>(lda, 1)), stride_a, &zero, C,
                                             CUDA_R_32F, static_cast<int>(std::max<int64_t>(N, 1)), M * N,
                                             static_cast<int>(batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                  "matmul");
}

// A float32 storage's bfloat16 mirror (element i rounded from element i): a weight's copy kept for
// the guard's life (Note [Autocast weight cache]).
std::shared_ptr<Storage> bf16_mirror(const Storage& s) {
  const int64_t n = static_cast<int64_t>(s.nbytes / sizeof(float));
  auto out = std::make_shared<Storage>(static_cast<size_t>(std::max<int64_t>(n, 1)) * 2, s.device);
  const StridedIndexer<1> ix = make_indexer<1>(Shape{n}, std::array<Shape, 1>{Shape{1}});
  to_bf16_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(static_cast<const float*>(s.data), ix,
                                                            static_cast<__nv_bfloat16*>(out->data), n);
  TP_CUDA_LAUNCHED("matmul");
  return out;
}

// t's matrices over the broadcast batch shape: the view [batch..., rows, cols] (stride 0 on
// broadcast dims), and the single element distance between consecutive matrices when there is
// one (-1 otherwise).
std::pair<Tensor, int64_t> batched_view(const Tensor& t, const Shape& batch) {
  const int64_t nb = static_cast<int64_t>(batch.size()), lead = nb - (t.dim() - 2);
  Shape shape = batch, strides(batch.size(), 0);
  for (int64_t d = 0; d < nb; ++d) {
    const int64_t td = d - lead;
    if (td >= 0 && t.size(td) != 1) strides[d] = t.stride(td);
  }
  shape.push_back(t.size(-2));
  shape.push_back(t.size(-1));
  strides.push_back(t.stride(-2));
  strides.push_back(t.stride(-1));
  Tensor view = make_tensor(t.impl().storage, shape, strides, t.offset(), t.dtype());
  // Evenly spaced: walking the batch in row-major order adds the same distance each time, the
  // innermost (non-1) dim's stride, and each outer dim's stride spans the dims inside it.
  int64_t step = -1, inner = 1;
  bool even = true;
  for (int64_t d = nb - 1; d >= 0; --d) {
    if (batch[d] == 1) continue;
    if (step < 0) {
      step = strides[d];
      inner = batch[d];
    } else {
      even = even && strides[d] == step * inner;
      inner *= batch[d];
    }
  }
  if (step < 0) step = 0;  // one matrix
  return {view, even ? step : -1};
}

}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  const Shape batch = matmul_batch(a_in, b_in);
  const int64_t M = a_in.size(-2), K = a_in.size(-1), N = b_in.size(-1);
  Shape out_shape = batch;
  out_shape.push_back(M);
  out_shape.push_back(N);
  dispatch_floating(a_in.dtype(), "matmul", [](auto) {});
  Tensor out = empty_on(out_shape, a_in.dtype(), a_in.device());
  if (K == 0) fill_(out, 0.0);
  if (K == 0 || out.numel() == 0) return out;

  // Each operand: a readable matrix layout and evenly spaced matrices, else a contiguous copy.
  auto prepare = [&](const Tensor& t, int64_t rows, int64_t cols) {
    std::pair<Tensor, int64_t> viewed = batched_view(t, batch);
    Tensor view = viewed.first;
    int64_t step = viewed.second;
    MatLayout layout = gemm_layout(rows, cols, view.stride(-2), view.stride(-1));
    if (!layout.ok || step < 0) {
      view = contiguous(view);
      step = rows * cols;
      if (shape_numel(batch) <= 1) step = 0;
      layout = gemm_layout(rows, cols, view.stride(-2), view.stride(-1));
    }
    return std::make_tuple(view, step, layout);
  };
  Tensor a, b;
  int64_t step_a = 0, step_b = 0;
  MatLayout la, lb;
  std::tie(a, step_a, la) = prepare(a_in, M, K);
  std::tie(b, step_b, lb) = prepare(b_in, K, N);
  const int64_t n_batch = shape_numel(batch);
  if (a.dtype() == DType::Float32 && autocast_precision() == Precision::BFloat16) {
    // A weight reads its kept mirror in its own layout (Note [Autocast weight cache]); any other
    // operand is rounded now into a contiguous copy: one matrix when the batch repeats it (step
    // 0), else every matrix.
    struct Operand {
      std::shared_ptr<Storage> keep;
      const __nv_bfloat16* data;
      bool trans;
      int64_t ld, step;
    };
    auto operand = [&](const Tensor& view, int64_t step, const MatLayout& layout, int64_t rows, int64_t cols) {
      if (std::shared_ptr<Storage> m = autocast_bf16_mirror(view.impl().storage, bf16_mirror))
        return Operand{m, static_cast<const __nv_bfloat16*>(m->data) + view.offset(), layout.trans, layout.ld, step};
      std::shared_ptr<Storage> copy =
          step != 0 || view.dim() == 2
              ? bf16_copy(view)
              // Step 0: every batch index reads the same matrix, the one at the view's offset.
              : bf16_copy(make_tensor(view.impl().storage, {view.size(-2), view.size(-1)},
                                      {view.stride(-2), view.stride(-1)}, view.offset(), view.dtype()));
      return Operand{copy, static_cast<const __nv_bfloat16*>(copy->data), false, cols, step == 0 ? 0 : rows * cols};
    };
    const Operand oa = operand(a, step_a, la, M, K), ob = operand(b, step_b, lb, K, N);
    gemm_bf16_batched(oa.trans, ob.trans, M, N, K, oa.data, oa.ld, oa.step, ob.data, ob.ld, ob.step,
                      out.data_ptr<float>(), n_batch);
    return out;
  }
  dispatch_floating(a.dtype(), "matmul", [&](auto tag) {
    using T = typename decltype(tag)::type;
    gemm_batched<T>("matmul", la.trans, lb.trans, M, N, K, 1.0, a.template data_ptr<T>(), la.ld, step_a,
                    b.template data_ptr<T>(), lb.ld, step_b, 0.0, out.template data_ptr<T>(), N, M * N, n_batch);
  });
  return out;
}

}  // namespace tapestry::kernels::cuda
