// Mixed precision for a scope, as torch.autocast("cpu", dtype=torch.bfloat16): inside an
// AutocastGuard, float32 matmuls (matmul, linear, and their backward, even when backward runs
// after the guard is gone) round their operands to bfloat16 and multiply with float32
// accumulation and a float32 result. Everything else stays float32: the master weights, the
// optimizer, softmax, norms, the loss, and the fused attention (whose small gemms keep float32, as
// its softmax statistics do). float64 tensors are never cast.
//
// Only CPUs that multiply bfloat16 in hardware (AVX512-BF16), in a build with oneDNN, run it:
// elsewhere the guard throws a tapestry::Error saying why. bf16_round is the software reference of
// the rounding (to nearest, ties to even, NaN kept NaN), tested on every machine.
#pragma once
#include <cstdint>
#include <string>

namespace tapestry {

enum class Precision { Float32, BFloat16 };

// The precision float32 matmuls run at on this thread now.
Precision autocast_precision();

// Whether this machine and build can run Precision::BFloat16; when not, `why` says what is missing.
bool bf16_supported(std::string* why = nullptr);

// Sets the matmul precision for a scope and restores the previous one after. Throws (before
// changing anything) when BFloat16 is asked for and bf16_supported() is false.
class AutocastGuard {
 public:
  explicit AutocastGuard(Precision p = Precision::BFloat16);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  Precision prev_;
};

// float32 -> bfloat16 bits, round to nearest even; a NaN stays a (quiet) NaN.
uint16_t bf16_round(float x);
float bf16_to_float(uint16_t bits);

// The library behind float32 gemms on the CPU: "onednn" or "openblas" (TAPESTRY_GEMM picks one
// for A/B runs; the default is oneDNN where the build has it: it reads the CPU's features where
// OpenBLAS 0.3.21 reads model numbers and falls back to SSE3 kernels on a CPU it does not know).
std::string gemm_library();

}  // namespace tapestry
