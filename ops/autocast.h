// Mixed precision for a scope, as torch.autocast("cpu", dtype=torch.bfloat16): inside an
// AutocastGuard, float32 matmuls (matmul, linear, and their backward, even when backward runs
// after the guard is gone) round their operands to bfloat16 and multiply with float32
// accumulation and a float32 result. Everything else stays float32: the master weights, the
// optimizer, softmax, norms, the loss, and the fused attention (whose small gemms keep float32, as
// its softmax statistics do). float64 tensors are never cast.
//
// On the CPU (and the emulated device, which runs the CPU's kernels) only CPUs that multiply
// bfloat16 in hardware (AVX512-BF16), in a build with oneDNN, run it. On a GPU, cuBLAS's bfloat16
// gemm with float32 accumulation runs it (compute capability 8.0 or later). Elsewhere the guard,
// or the first matmul on a device that cannot, throws a tapestry::Error saying why. bf16_round is
// the software reference of the rounding (to nearest, ties to even, NaN kept NaN), tested on every
// machine.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

#include "tapestry/ops/dtype.h"

namespace tapestry {

enum class Precision { Float32, BFloat16 };

// The precision float32 matmuls run at on this thread now.
Precision autocast_precision();

// Whether this machine and build can run Precision::BFloat16 on `device`; when not, `why` says what
// is missing.
bool bf16_supported(std::string* why = nullptr);  // the CPU's
bool bf16_supported(Device device, std::string* why = nullptr);

// Sets the matmul precision for a scope and restores the previous one after. Throws (before
// changing anything) when BFloat16 is asked for and bf16_supported(device) is false: name the
// device the scope's matmuls run on, as torch.autocast's device_type.
class AutocastGuard {
 public:
  explicit AutocastGuard(Precision p = Precision::BFloat16, Device device = Device::CPU);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  Precision prev_;
};

// float32 -> bfloat16 bits, round to nearest even; a NaN stays a (quiet) NaN. Inline and
// branch-free so that the gemm's conversion loop vectorizes.
inline uint16_t bf16_round(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // half to even on the 16 bits dropped
  const uint32_t quiet_nan = (u >> 16) | 0x0040u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}
inline float bf16_to_float(uint16_t bits) {  // exact: bfloat16 is a float32's top half
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The library behind float32 gemms on the CPU: "onednn" or "openblas" (TAPESTRY_GEMM picks one
// for A/B runs; the default is oneDNN where the build has it: it reads the CPU's features where
// OpenBLAS 0.3.21 reads model numbers and falls back to SSE3 kernels on a CPU it does not know).
std::string gemm_library();
// What runs `device`'s float32 matmuls at precision `p` now: on the CPU (and emulated) the above,
// "+bf16" under autocast; on a GPU "cublas" with its mode: "cublas-fp32", "cublas-tf32" (with
// cuda::set_allow_tf32) or "cublas-bf16" (autocast: bfloat16 operands, float32 accumulation).
std::string gemm_library(Device device, Precision p = Precision::Float32);

}  // namespace tapestry
