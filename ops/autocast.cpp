#include "tapestry/ops/autocast.h"

#include <cstring>

#include "tapestry/ops/cpu/gemm.h"
#include "tapestry/ops/error.h"

namespace tapestry {

namespace {
thread_local Precision current_precision = Precision::Float32;
}

Precision autocast_precision() { return current_precision; }

bool bf16_supported(std::string* why) { return kernels::cpu::bf16_hardware(why); }

AutocastGuard::AutocastGuard(Precision p) : prev_(current_precision) {
  std::string why;
  TP_CHECK(p != Precision::BFloat16 || bf16_supported(&why), "autocast to bfloat16: {}", why);
  current_precision = p;
}

AutocastGuard::~AutocastGuard() { current_precision = prev_; }

uint16_t bf16_round(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN: keep it NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round half to even on the 16 bits dropped
  return static_cast<uint16_t>(u >> 16);
}

float bf16_to_float(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::string gemm_library() { return kernels::cpu::gemm_library(); }

}  // namespace tapestry
