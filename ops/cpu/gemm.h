// The one place the CPU backend calls a BLAS: matmul (ops/cpu/matmul.cpp) and the fused attention
// (ops/cpu/attention.cpp) multiply through these. Row-major; lda, ldb and ldc are row strides;
// ta/tb read A/B transposed.
#pragma once
#include <cstdint>
#include <string>

namespace tapestry::kernels::cpu {

// C = alpha op(A) op(B) + beta C. float32 goes to oneDNN's sgemm where the build has it (see
// gemm_library() in ops/autocast.h), float64 to OpenBLAS.
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
          const double* b, int64_t ldb, double beta, double* c, int64_t ldc);

// C = op(A) op(B) with A and B rounded to bfloat16 (bf16_round) and float32 accumulation: autocast's
// matmul, through oneDNN's bf16 matmul. Throws unless bf16_hardware(). a16 / b16, when given, are A / B
// already rounded, in the same layout and leading dimension (a weight's cached mirror, Note
// [Autocast weight cache]); a and b are not read then.
void gemm_bf16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
               int64_t ldb, float* c, int64_t ldc, const uint16_t* a16 = nullptr, const uint16_t* b16 = nullptr);
// out[i] = bf16_round(x[i]) for n contiguous elements, across threads.
void round_to_bf16(const float* x, int64_t n, uint16_t* out);

// Whether gemm_bf16 can run here (AVX512-BF16 and a build with oneDNN); `why` says what is missing.
bool bf16_hardware(std::string* why);

const char* gemm_library();  // "onednn" or "openblas": the float32 gemm's library

}  // namespace tapestry::kernels::cpu
