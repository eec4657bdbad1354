// The math of every elementwise op, written once. Each op is a small functor whose call operator
// is __host__ __device__ under nvcc (TP_HD), so the CPU loops (ops/cpu/) and the CUDA kernels
// (ops/cuda/) call the same code: the math is tested on the CPU even where no GPU exists, and an
// op's definition lives in one place. with_binary_op / with_unary_op map the kernel enums to
// functors, for both backends. Also here: the float exp both backends use in softmaxes (vexp),
// GELU's tanh form and dropout's counter-based hash.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "tapestry/ops/detail/kernels.h"

#ifdef __CUDACC__
#define TP_HD __host__ __device__
#else
#define TP_HD
#endif

namespace tapestry::kernels {

// ---- scalar functions for float and double, the same names on host and device
namespace math {
TP_HD inline float exp(float x) { return ::expf(x); }
TP_HD inline double exp(double x) { return ::exp(x); }
TP_HD inline float log(float x) { return ::logf(x); }
TP_HD inline double log(double x) { return ::log(x); }
TP_HD inline float log1p(float x) { return ::log1pf(x); }
TP_HD inline double log1p(double x) { return ::log1p(x); }
TP_HD inline float expm1(float x) { return ::expm1f(x); }
TP_HD inline double expm1(double x) { return ::expm1(x); }
TP_HD inline float sqrt(float x) { return ::sqrtf(x); }
TP_HD inline double sqrt(double x) { return ::sqrt(x); }
TP_HD inline float tanh(float x) { return ::tanhf(x); }
TP_HD inline double tanh(double x) { return ::tanh(x); }
TP_HD inline float erf(float x) { return ::erff(x); }
TP_HD inline double erf(double x) { return ::erf(x); }
TP_HD inline float pow(float x, float y) { return ::powf(x, y); }
TP_HD inline double pow(double x, double y) { return ::pow(x, y); }
}  // namespace math

// NaN test that also compiles (to false) for integer types.
template <class T> TP_HD inline bool is_nan(T v) {
  if constexpr (std::is_floating_point_v<T>) return v != v;
  else return false;
}

// exp that the compiler can vectorize: float uses a Cephes-style range reduction and degree-6
// polynomial (within 2 ulp of std::exp over the range, 0 below -87.3, as exp underflows);
// double keeps the library exp, so gradchecks see it. The GPU runs the same polynomial, so
// softmaxes agree across devices to rounding (nvcc fuses its multiply-adds; the CPU build may not).
TP_HD inline float vexp(float x) {
  float xc = x < -87.3f ? -87.3f : (x > 88.37f ? 88.37f : x);  // e^88.37 is still finite
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
TP_HD inline double vexp(double x) { return math::exp(x); }

// Phi(x), the standard normal CDF, for the exact GELU. The float form vectorizes: erfc(|x|/sqrt 2)
// from the Chebyshev fit of Numerical Recipes' erfcc (relative error below 1.2e-7 over the whole
// range, so Phi keeps its relative accuracy far into the lower tail, where 1 + erf cancels) and
// vexp, where the library's erff stops the loop from vectorizing. Double keeps the library erf,
// so gradchecks see it. NaN stays NaN; Phi(-inf) = 0, Phi(inf) = 1.
TP_HD inline float normal_cdf(float x) {
  const float z = (x < 0 ? -x : x) * 0.70710678118654752440f;
  const float t = 1.0f / (1.0f + 0.5f * z);
  float p = 0.17087277f;
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  const float erfc = t * vexp(p - z * z);
  return x >= 0 ? 1.0f - 0.5f * erfc : 0.5f * erfc;
}
TP_HD inline double normal_cdf(double x) { return 0.5 * (1.0 + math::erf(x * 0.70710678118654752440)); }

// GELU's tanh form (GPT-2's): 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3), computed
// as x * gate with gate = (1 + tanh(u)) / 2 = 1 / (1 + e^-2u): the same function, through vexp
// (which vectorizes, where tanh does not) and without the cancellation in 1 + tanh(u).
// Special values as PyTorch: gelu(-inf) = NaN, gelu(inf) = inf.
constexpr double kGeluTanhK = 0.7978845608028654, kGeluTanhC = 0.044715;
template <class T> TP_HD inline T gelu_tanh_gate(T x) {
  const T u = static_cast<T>(kGeluTanhK) * (x + static_cast<T>(kGeluTanhC) * x * x * x);
  return T(1) / (T(1) + vexp(T(-2) * u));
}
template <class T> TP_HD inline T gelu_tanh(T x) { return x * gelu_tanh_gate(x); }
// d/dx gelu_tanh = gate + x gate (1 - gate) 2 du/dx, the chain rule through 1 / (1 + e^-2u).
template <class T> TP_HD inline T gelu_tanh_grad(T x) {
  const T s = gelu_tanh_gate(x);
  return s + (T(2) * x * s * (T(1) - s)) * static_cast<T>(kGeluTanhK) *
                 (T(1) + static_cast<T>(3 * kGeluTanhC) * x * x);
}

// Dropout's mask as a counter-based hash: element `index` of a dropout with seed s is kept when
// the top 24 bits of a 32-bit hash (lowbias32, by Chris Wellons) of (index, key(s)) reach
// threshold(p). kernels::dropout and the fused attention's dropout use it on both devices, so
// they drop the same elements everywhere, and a backward regenerates a mask from its seed
// instead of storing it. 32-bit multiplies vectorize on every x86, 64-bit ones do not.
TP_HD inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}
TP_HD inline uint32_t dropout_key(uint64_t seed) {
  return mix32(static_cast<uint32_t>(seed) ^ mix32(static_cast<uint32_t>(seed >> 32) + 0x9e3779b9U));
}
inline uint32_t dropout_threshold(double p) { return static_cast<uint32_t>(p * 16777216.0 + 0.5); }
TP_HD inline bool dropout_keeps(uint32_t index, uint32_t key, uint32_t threshold) {
  return (mix32(index * 0x9e3779b9U ^ key) >> 8) >= threshold;
}

// ---- the elementwise ops. `comparison`: the result is bool; `floating_only`: float types only.
namespace op {
struct BinaryTraits {
  static constexpr bool comparison = false, floating_only = false;
};
struct Add : BinaryTraits {
  template <class T> TP_HD T operator()(T x, T y) const { return static_cast<T>(x + y); }
};
struct Sub : BinaryTraits {
  template <class T> TP_HD T operator()(T x, T y) const { return static_cast<T>(x - y); }
};
struct Mul : BinaryTraits {
  template <class T> TP_HD T operator()(T x, T y) const { return static_cast<T>(x * y); }
};
struct Div : BinaryTraits {
  static constexpr bool floating_only = true;
  template <class T> TP_HD T operator()(T x, T y) const { return x / y; }
};
struct Maximum : BinaryTraits {  // NaN wins, as torch.maximum
  template <class T> TP_HD T operator()(T x, T y) const { return (is_nan(x) || x > y) ? x : y; }
};
struct Minimum : BinaryTraits {
  template <class T> TP_HD T operator()(T x, T y) const { return (is_nan(x) || x < y) ? x : y; }
};
struct ReluBackward : BinaryTraits {  // g where relu's output y > 0; NaN passes, as torch
  template <class T> TP_HD T operator()(T g, T y) const { return y > T(0) || is_nan(y) ? g : T(0); }
};
struct GeluBackward : BinaryTraits {  // g * d/dx gelu(x), d/dx gelu(x) = Phi(x) + x phi(x)
  static constexpr bool floating_only = true;
  template <class T> TP_HD T operator()(T g, T x) const {
    const T pdf = vexp(T(-0.5) * x * x) * T(0.3989422804014327);
    return g * (normal_cdf(x) + x * pdf);
  }
};
struct GeluTanhBackward : BinaryTraits {
  static constexpr bool floating_only = true;
  template <class T> TP_HD T operator()(T g, T x) const { return g * gelu_tanh_grad(x); }
};
struct CompareTraits {
  static constexpr bool comparison = true, floating_only = false;
};
struct Eq : CompareTraits {
  template <class T> TP_HD bool operator()(T x, T y) const { return x == y; }
};
struct Ne : CompareTraits {
  template <class T> TP_HD bool operator()(T x, T y) const { return x != y; }
};
struct Lt : CompareTraits {
  template <class T> TP_HD bool operator()(T x, T y) const { return x < y; }
};
struct Le : CompareTraits {
  template <class T> TP_HD bool operator()(T x, T y) const { return x <= y; }
};
struct Gt : CompareTraits {
  template <class T> TP_HD bool operator()(T x, T y) const { return x > y; }
};
struct Ge : CompareTraits {
  template <class T> TP_HD bool operator()(T x, T y) const { return x >= y; }
};

struct UnaryTraits {
  static constexpr bool floating_only = true;
};
struct IntegerTraits {
  static constexpr bool floating_only = false;
};
struct Neg : IntegerTraits {
  template <class T> TP_HD T operator()(T x) const { return static_cast<T>(-x); }
};
struct Abs : IntegerTraits {
  template <class T> TP_HD T operator()(T x) const { return x < 0 ? static_cast<T>(-x) : x; }
};
struct Sign : IntegerTraits {
  template <class T> TP_HD T operator()(T x) const { return static_cast<T>((x > 0) - (x < 0)); }
};
struct Relu : IntegerTraits {  // NaN stays NaN
  template <class T> TP_HD T operator()(T x) const { return x > 0 || is_nan(x) ? x : T(0); }
};
struct Clamp : IntegerTraits {
  double lo, hi;
  template <class T> TP_HD T operator()(T x) const {
    const T l = static_cast<T>(lo), h = static_cast<T>(hi);
    return x < l ? l : (x > h ? h : x);
  }
};
struct Exp : UnaryTraits {
  template <class T> TP_HD T operator()(T x) const { return math::exp(x); }
};
struct Log : UnaryTraits {
  template <class T> TP_HD T operator()(T x) const { return math::log(x); }
};
struct Log1p : UnaryTraits {  // log(1 + x), exact near 0 where 1 + x rounds
  template <class T> TP_HD T operator()(T x) const { return math::log1p(x); }
};
struct Expm1 : UnaryTraits {  // exp(x) - 1, exact near 0 where exp(x) - 1 cancels
  template <class T> TP_HD T operator()(T x) const { return math::expm1(x); }
};
struct Sqrt : UnaryTraits {
  template <class T> TP_HD T operator()(T x) const { return math::sqrt(x); }
};
struct Rsqrt : UnaryTraits {
  template <class T> TP_HD T operator()(T x) const { return T(1) / math::sqrt(x); }
};
struct Tanh : UnaryTraits {
  template <class T> TP_HD T operator()(T x) const { return math::tanh(x); }
};
struct Sigmoid : UnaryTraits {  // stable on both sides: never exponentiates a large positive number
  template <class T> TP_HD T operator()(T x) const {
    if (x >= 0) return T(1) / (T(1) + math::exp(-x));
    T e = math::exp(x);
    return e / (T(1) + e);
  }
};
struct Gelu : UnaryTraits {  // the exact (erf) form, PyTorch's default
  template <class T> TP_HD T operator()(T x) const {
    return x * normal_cdf(x);
  }
};
struct GeluTanh : UnaryTraits {  // GPT-2's approximation
  template <class T> TP_HD T operator()(T x) const { return gelu_tanh(x); }
};
struct PowScalar : UnaryTraits {
  double exponent;
  template <class T> TP_HD T operator()(T x) const { return math::pow(x, static_cast<T>(exponent)); }
};
}  // namespace op

// f(functor) for a Binary kind; the kinds are listed in ops/detail/kernels.h.
template <class F>
decltype(auto) with_binary_op(Binary kind, F&& f) {
  switch (kind) {
    case Binary::Add: return f(op::Add{});
    case Binary::Sub: return f(op::Sub{});
    case Binary::Mul: return f(op::Mul{});
    case Binary::Div: return f(op::Div{});
    case Binary::Maximum: return f(op::Maximum{});
    case Binary::Minimum: return f(op::Minimum{});
    case Binary::ReluBackward: return f(op::ReluBackward{});
    case Binary::GeluBackward: return f(op::GeluBackward{});
    case Binary::GeluTanhBackward: return f(op::GeluTanhBackward{});
    case Binary::Eq: return f(op::Eq{});
    case Binary::Ne: return f(op::Ne{});
    case Binary::Lt: return f(op::Lt{});
    case Binary::Le: return f(op::Le{});
    case Binary::Gt: return f(op::Gt{});
    case Binary::Ge: return f(op::Ge{});
  }
  return f(op::Add{});  // unreachable: every kind is listed
}

// Whether a Unary kind takes only float32/float64 (the rest also take int64).
inline bool unary_needs_floating(Unary kind) {
  switch (kind) {
    case Unary::Neg: case Unary::Abs: case Unary::Sign: case Unary::Relu: case Unary::Clamp: return false;
    default: return true;
  }
}

// f(functor) for a Unary kind with its parameters (p0: PowScalar's exponent, Clamp's min; p1:
// Clamp's max). PyTorch computes x^0.5 and x^-0.5 as (r)sqrt: NaN for x = -inf, where pow gives
// inf / 0; so do we.
template <class F>
decltype(auto) with_unary_op(Unary kind, double p0, double p1, F&& f) {
  switch (kind) {
    case Unary::Neg: return f(op::Neg{});
    case Unary::Exp: return f(op::Exp{});
    case Unary::Log: return f(op::Log{});
    case Unary::Sqrt: return f(op::Sqrt{});
    case Unary::Rsqrt: return f(op::Rsqrt{});
    case Unary::Tanh: return f(op::Tanh{});
    case Unary::Relu: return f(op::Relu{});
    case Unary::Gelu: return f(op::Gelu{});
    case Unary::GeluTanh: return f(op::GeluTanh{});
    case Unary::Sigmoid: return f(op::Sigmoid{});
    case Unary::Abs: return f(op::Abs{});
    case Unary::Sign: return f(op::Sign{});
    case Unary::PowScalar:
      if (p0 == 0.5) return f(op::Sqrt{});
      if (p0 == -0.5) return f(op::Rsqrt{});
      return f(op::PowScalar{{}, p0});
    case Unary::Clamp: return f(op::Clamp{{}, p0, p1});
    case Unary::Log1p: return f(op::Log1p{});
    case Unary::Expm1: return f(op::Expm1{});
  }
  return f(op::Neg{});  // unreachable: every kind is listed
}

}  // namespace tapestry::kernels
