// The CPU loop machinery every kernel uses: parallel_for over an index range (OpenMP above a
// grain size, serial inside an existing parallel region) and strided_apply, which walks K
// strided operands of one shape in runs along their innermost (coalesced) dim.
// Work is split by index range only, so elementwise results never depend on the thread count.
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "tapestry/ops/shape.h"

namespace tapestry::cpu {

// NaN test that also compiles (to false) for integer types.
template <class T> inline bool is_nan(T v) {
  if constexpr (std::is_floating_point_v<T>) return v != v;
  else return false;
}

// exp that the compiler can vectorize: float uses a Cephes-style range reduction and degree-6
// polynomial (within 2 ulp of std::exp over the range, 0 below -87.3, as exp underflows);
// double keeps std::exp, so gradchecks see the library exp.
inline float vexp(float x) {
  float xc = std::min(std::max(x, -87.3f), 88.37f);  // e^88.37 is still finite
  xc = xc == xc ? xc : 0.0f;  // NaN: computed on 0 and replaced below (casting NaN to int is UB)
  // round(xc * log2(e)) with the 1.5 * 2^23 trick (no SSE4.1 needed)
  const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = xc - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // n is in [-126, 128); the biased exponent n + 127 is positive, shifted as unsigned.
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  // Every caller passes x - max <= 0; above 88.72 float exp overflows to inf, as std::exp does.
  return x < -87.3f ? 0.0f : x > 88.7228f ? HUGE_VALF : x != x ? x : p * scale;
}
inline double vexp(double x) { return std::exp(x); }

// GELU's tanh form (GPT-2's): 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3), computed
// as x * gate with gate = (1 + tanh(u)) / 2 = 1 / (1 + e^-2u): the same function, through vexp
// (which vectorizes, where std::tanh does not) and without the cancellation in 1 + tanh(u).
// Special values as PyTorch: gelu(-inf) = NaN, gelu(inf) = inf.
constexpr double kGeluTanhK = 0.7978845608028654, kGeluTanhC = 0.044715;
template <class T> inline T gelu_tanh_gate(T x) {
  const T u = static_cast<T>(kGeluTanhK) * (x + static_cast<T>(kGeluTanhC) * x * x * x);
  return T(1) / (T(1) + vexp(T(-2) * u));
}
template <class T> inline T gelu_tanh(T x) { return x * gelu_tanh_gate(x); }
// d/dx gelu_tanh = gate + x gate (1 - gate) 2 du/dx, the chain rule through 1 / (1 + e^-2u).
template <class T> inline T gelu_tanh_grad(T x) {
  const T s = gelu_tanh_gate(x);
  return s + (T(2) * x * s * (T(1) - s)) * static_cast<T>(kGeluTanhK) *
                 (T(1) + static_cast<T>(3 * kGeluTanhC) * x * x);
}

// Dropout's mask as a counter-based hash: element `index` of a dropout with seed s is kept when
// the top 24 bits of a 32-bit hash (lowbias32, by Chris Wellons) of (index, key(s)) reach
// threshold(p). Both kernels::dropout and the fused attention's dropout use it, so they drop the
// same elements, and a backward regenerates a mask from its seed instead of storing it. 32-bit
// multiplies vectorize on every x86, 64-bit ones do not.
inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}
inline uint32_t dropout_key(uint64_t seed) {
  return mix32(static_cast<uint32_t>(seed) ^ mix32(static_cast<uint32_t>(seed >> 32) + 0x9e3779b9U));
}
inline uint32_t dropout_threshold(double p) { return static_cast<uint32_t>(p * 16777216.0 + 0.5); }
inline bool dropout_keeps(uint32_t index, uint32_t key, uint32_t threshold) {
  return (mix32(index * 0x9e3779b9U ^ key) >> 8) >= threshold;
}

// Below this many elements an op runs on one thread: spawning costs more than it saves.
constexpr int64_t kGrainSize = 32768;

template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  if (end <= begin) return;
#ifdef _OPENMP
  int64_t n = end - begin;
  if (n > grain && !omp_in_parallel() && omp_get_max_threads() > 1) {
    int64_t max_chunks = (n + grain - 1) / grain;
#pragma omp parallel num_threads(static_cast<int>(std::min<int64_t>(omp_get_max_threads(), max_chunks)))
    {
      int64_t nt = omp_get_num_threads(), tid = omp_get_thread_num();
      int64_t chunk = (n + nt - 1) / nt;
      int64_t b = begin + tid * chunk, e = std::min(end, b + chunk);
      if (b < e) f(b, e);
    }
    return;
  }
#endif
  (void)grain;
  f(begin, end);
}

// Merges adjacent dims that are contiguous with each other in every operand, so a contiguous
// tensor becomes one long run. Drops size-1 dims. strides[k] are the operand k strides.
template <size_t K>
void coalesce(Shape& shape, std::array<Shape, K>& strides) {
  Shape s;
  std::array<Shape, K> st;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !s.empty();
    for (size_t k = 0; merge && k < K; ++k) merge = st[k].back() == strides[k][d] * shape[d];
    if (merge) {
      s.back() *= shape[d];
      for (size_t k = 0; k < K; ++k) st[k].back() = strides[k][d];
    } else {
      s.push_back(shape[d]);
      for (size_t k = 0; k < K; ++k) st[k].push_back(strides[k][d]);
    }
  }
  if (s.empty()) {
    s.push_back(1);
    for (size_t k = 0; k < K; ++k) st[k].push_back(0);
  }
  shape = std::move(s);
  strides = std::move(st);
}

// Calls f(offsets, inner_strides, count) for runs of `count` elements along the innermost dim;
// offsets[k] is operand k's element offset of the run's first element.
template <size_t K, class F>
void strided_apply(Shape shape, std::array<Shape, K> strides, const F& f, int64_t grain = kGrainSize) {
  int64_t total = shape_numel(shape);
  if (total == 0) return;
  coalesce(shape, strides);
  const int64_t nd = static_cast<int64_t>(shape.size());
  const int64_t inner = shape[nd - 1];
  std::array<int64_t, K> inner_strides;
  for (size_t k = 0; k < K; ++k) inner_strides[k] = strides[k][nd - 1];

  parallel_for(0, total, grain, [&](int64_t begin, int64_t end) {
    // Multi-index of `begin`, then walk forward run by run.
    int64_t idx[16] = {0};
    int64_t rem = begin;
    for (int64_t d = nd - 1; d >= 0; --d) {
      idx[d] = rem % shape[d];
      rem /= shape[d];
    }
    while (begin < end) {
      std::array<int64_t, K> off{};
      for (size_t k = 0; k < K; ++k)
        for (int64_t d = 0; d < nd; ++d) off[k] += idx[d] * strides[k][d];
      int64_t run = std::min(inner - idx[nd - 1], end - begin);
      f(off, inner_strides, run);
      begin += run;
      idx[nd - 1] += run;
      for (int64_t d = nd - 1; d > 0 && idx[d] == shape[d]; --d) {
        idx[d] = 0;
        ++idx[d - 1];
      }
    }
  });
}

}  // namespace tapestry::cpu
