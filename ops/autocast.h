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
#include <functional>
#include <memory>
#include <string>

#include "tapestry/ops/dtype.h"

namespace tapestry {

class Tensor;
struct Storage;

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

// Note [Autocast weight cache]: inside the outermost AutocastGuard on a thread, a weight's
// bfloat16 copy is made at its first matmul and kept until that guard closes, as torch.autocast's
// cache: the backward's other layout, a tied weight, further micro-batches and decoding steps all
// read the same copy. matmul and linear mark their operands that are leaves requiring grad (the
// weights, as PyTorch's cache); activations are new at every step and are rounded at each use. The
// copy mirrors the weight's whole storage (element i is bf16_round of float element i), so every
// view reads it with its own offset and strides. A write to the weight bumps its storage's version
// and the next use makes a new copy; a storage that died is never mistaken for a new one at its
// address. Memory: half the marked weights' bytes, for the guard's life.
void autocast_cache_weight(const Tensor& weight);  // no-op outside a BFloat16 guard or for a non-float32 tensor
// The bfloat16 mirror of `storage` when it is marked, made by `convert` at its first use (or after a
// write); null when it is not marked or no guard is open: the caller rounds its own operand then.
std::shared_ptr<Storage> autocast_bf16_mirror(const std::shared_ptr<Storage>& storage,
                                              const std::function<std::shared_ptr<Storage>(const Storage&)>& convert);
// This thread's mirror counts since its outermost guard opened: copies made, and uses that found one.
struct AutocastCacheCounts {
  int64_t copies = 0, reuses = 0;
};
AutocastCacheCounts autocast_cache_counts();

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
