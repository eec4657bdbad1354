// 16 floats as one value (GCC/Clang vector extensions: one AVX-512 register, or two AVX ones, or
// four SSE ones, whatever -march allows), for the CPU kernels' hand-written inner loops: the tiny
// gemms (ops/cpu/gemm.cpp) and decoding's attention rows (ops/cpu/attention.cpp).
#pragma once
#include <cstdint>
#include <cstring>

namespace tapestry::kernels::cpu {

using F16 = float __attribute__((vector_size(64)));
using F8 = float __attribute__((vector_size(32)));
using F4 = float __attribute__((vector_size(16)));

inline F16 load16(const float* p) {  // unaligned
  F16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store16(float* p, F16 v) { std::memcpy(p, &v, sizeof v); }

// The lanes added as a tree (halves, then quarters): a chain of 16 scalar adds was the attention
// step's critical path, one per key. Shuffles, not a copy through memory, so the argument stays
// in registers (a memcpy here kept every accumulator of the calling loop on the stack).
inline float lanes_sum(F16 v) {
  const F8 h = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
               __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const F4 q = __builtin_shufflevector(h, h, 0, 1, 2, 3) + __builtin_shufflevector(h, h, 4, 5, 6, 7);
  return (q[0] + q[2]) + (q[1] + q[3]);
}

// a . b over n floats: 16 lanes, their tree sum, then the tail.
inline float dot16(const float* a, const float* b, int64_t n) {
  F16 acc = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) acc += load16(a + i) * load16(b + i);
  float r = lanes_sum(acc);
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

}  // namespace tapestry::kernels::cpu
