#include "tapestry/ops/autocast.h"

#include "tapestry/ops/cpu/gemm.h"
#include "tapestry/ops/error.h"

namespace tapestry {

namespace {
thread_local Precision current_precision = Precision::Float32;
}

Precision autocast_precision() { return current_precision; }

bool bf16_supported(std::string* why) { return kernels::cpu::bf16_hardware(why); }

AutocastGuard::AutocastGuard(Precision p) : prev_(current_precision) {
  // Checked only on a change: every matmul's backward opens a guard at its forward's precision.
  std::string why;
  TP_CHECK(p != Precision::BFloat16 || prev_ == p || bf16_supported(&why), "autocast to bfloat16: {}", why);
  current_precision = p;
}

AutocastGuard::~AutocastGuard() { current_precision = prev_; }

std::string gemm_library() { return kernels::cpu::gemm_library(); }

}  // namespace tapestry
