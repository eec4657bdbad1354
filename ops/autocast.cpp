#include "tapestry/ops/autocast.h"

#include <atomic>

#include "tapestry/ops/cpu/gemm.h"
#include "tapestry/ops/cuda.h"
#include "tapestry/ops/error.h"

namespace tapestry {

namespace {
thread_local Precision current_precision = Precision::Float32;
}

Precision autocast_precision() { return current_precision; }

bool bf16_supported(std::string* why) {
  // Asked at every matmul under autocast: the CPU's features and oneDNN's cap do not change.
  static std::string reason;
  static const bool supported = kernels::cpu::bf16_hardware(&reason);
  if (!supported && why) *why = reason;
  return supported;
}

bool bf16_supported(Device device, std::string* why) {
  // The emulated device runs the CPU's kernels (Note [Emulated device]), so it needs the CPU's support.
  return device.is_cuda() ? cuda::bf16_supported(device, why) : bf16_supported(why);
}

AutocastGuard::AutocastGuard(Precision p, Device device) : prev_(current_precision) {
  // Checked only on a change: every matmul's backward opens a guard at its forward's precision.
  std::string why;
  TP_CHECK(p != Precision::BFloat16 || prev_ == p || bf16_supported(device, &why), "autocast to bfloat16 on {}: {}",
           device_name(device), why);
  current_precision = p;
}

AutocastGuard::~AutocastGuard() { current_precision = prev_; }

std::string gemm_library() { return kernels::cpu::gemm_library(); }

// The TF32 switch (ops/cuda.h) lives here, in every build: it is the GPU's float32 matmul
// precision, which gemm_library reports, and a program that sets it runs on a CPU build too.
namespace cuda {
namespace {
std::atomic<bool> tf32_allowed{false};
}  // namespace
void set_allow_tf32(bool on) { tf32_allowed = on; }
bool allow_tf32() { return tf32_allowed; }
}  // namespace cuda

std::string gemm_library(Device device, Precision p) {
  if (!device.is_cuda()) return gemm_library() + (p == Precision::BFloat16 ? "+bf16" : "");
  if (p == Precision::BFloat16) return "cublas-bf16";
  return cuda::allow_tf32() ? "cublas-tf32" : "cublas-fp32";
}

}  // namespace tapestry
