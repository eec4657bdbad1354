// Row-major gemm on cuBLAS for the CUDA backend (matmul.cu, attention.cu).
#pragma once
#include "tapestry/ops/cuda/common.cuh"

namespace tapestry::kernels::cuda {

// C = alpha op(A) op(B) + beta C for `batch` matrices, all row-major: A is M x K (K x M stored
// when trans_a), B is K x N (N x K when trans_b), C is M x N; ld* are row strides and stride_*
// the element distance between consecutive matrices (0 repeats one matrix). float and double;
// float uses TF32 tensor cores only when tapestry::cuda::set_allow_tf32(true) was called.
template <class T>
void gemm_batched(const char* op, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha,
                  const T* A, int64_t lda, int64_t stride_a, const T* B, int64_t ldb, int64_t stride_b, double beta,
                  T* C, int64_t ldc, int64_t stride_c, int64_t batch);

}  // namespace tapestry::kernels::cuda
