// CPU elementwise kernels: binary ops with broadcasting, unary ops, where, copy (with dtype
// conversion), fill and the random fills. All loops go through cpu::strided_apply.
#include <cmath>

#include "tapestry/ops/cpu/loops.h"
#include "tapestry/ops/factory.h"
#include "tapestry/ops/kernels.h"
#include "tapestry/ops/profile.h"

namespace tapestry::kernels {

using cpu::strided_apply;

void check_device(const char* op, const Tensor& t) {
  TP_CHECK(t.device() == Device::CPU, "{}: tensor on {} but this build has only the cpu backend", op,
           device_name(t.device()));
}

namespace {

// Strides of t read as a tensor of `shape` (right-aligned broadcast: stride 0 where t has size 1).
Shape broadcast_strides(const Tensor& t, const Shape& shape) {
  Shape st(shape.size(), 0);
  size_t off = shape.size() - t.sizes().size();
  for (size_t i = 0; i < t.sizes().size(); ++i)
    st[off + i] = t.sizes()[i] == 1 ? 0 : t.strides()[i];
  return st;
}

template <class R, class T, class Op>
void binary_loop(const Tensor& out, const Tensor& a, const Tensor& b, Op op) {
  const Shape& shape = out.sizes();
  R* po = out.data_ptr<R>();
  const T* pa = a.data_ptr<T>();
  const T* pb = b.data_ptr<T>();
  strided_apply<3>(shape, {out.strides(), broadcast_strides(a, shape), broadcast_strides(b, shape)},
                   [&](const std::array<int64_t, 3>& off, const std::array<int64_t, 3>& st, int64_t n) {
                     R* o = po + off[0];
                     const T* x = pa + off[1];
                     const T* y = pb + off[2];
                     if (st[0] == 1 && st[1] == 1 && st[2] == 1) {
                       for (int64_t i = 0; i < n; ++i) o[i] = op(x[i], y[i]);
                     } else if (st[0] == 1 && st[1] == 1 && st[2] == 0) {
                       const T yv = *y;
                       for (int64_t i = 0; i < n; ++i) o[i] = op(x[i], yv);
                     } else if (st[0] == 1 && st[1] == 0 && st[2] == 1) {
                       const T xv = *x;
                       for (int64_t i = 0; i < n; ++i) o[i] = op(xv, y[i]);
                     } else {
                       for (int64_t i = 0; i < n; ++i) o[i * st[0]] = op(x[i * st[1]], y[i * st[2]]);
                     }
                   });
}

template <class T>
void binary_typed(Binary kind, const Tensor& out, const Tensor& a, const Tensor& b) {
  switch (kind) {
    case Binary::Add: return binary_loop<T, T>(out, a, b, [](T x, T y) { return static_cast<T>(x + y); });
    case Binary::Sub: return binary_loop<T, T>(out, a, b, [](T x, T y) { return static_cast<T>(x - y); });
    case Binary::Mul: return binary_loop<T, T>(out, a, b, [](T x, T y) { return static_cast<T>(x * y); });
    case Binary::Div: return binary_loop<T, T>(out, a, b, [](T x, T y) { return static_cast<T>(x / y); });
    case Binary::Pow:
      return binary_loop<T, T>(out, a, b, [](T x, T y) { return static_cast<T>(std::pow(x, y)); });
    case Binary::Maximum:
      return binary_loop<T, T>(out, a, b, [](T x, T y) { return (cpu::is_nan(x) || x > y) ? x : y; });
    case Binary::Minimum:
      return binary_loop<T, T>(out, a, b, [](T x, T y) { return (cpu::is_nan(x) || x < y) ? x : y; });
    case Binary::ReluBackward:
      return binary_loop<T, T>(out, a, b, [](T g, T y) { return y > T(0) || cpu::is_nan(y) ? g : T(0); });  // NaN passes, as torch
    case Binary::GeluBackward:  // g * d/dx gelu(x), d/dx gelu(x) = Phi(x) + x phi(x)
      if constexpr (std::is_floating_point_v<T>)
        return binary_loop<T, T>(out, a, b, [](T g, T x) {
          T cdf = T(0.5) * (T(1) + std::erf(x * T(M_SQRT1_2)));
          T pdf = std::exp(T(-0.5) * x * x) * T(0.3989422804014327);
          return g * (cdf + x * pdf);
        });
      break;
    case Binary::GeluTanhBackward:
      if constexpr (std::is_floating_point_v<T>)
        return binary_loop<T, T>(out, a, b, [](T g, T x) { return g * cpu::gelu_tanh_grad(x); });
      break;
    case Binary::Eq: return binary_loop<bool, T>(out, a, b, [](T x, T y) { return x == y; });
    case Binary::Ne: return binary_loop<bool, T>(out, a, b, [](T x, T y) { return x != y; });
    case Binary::Lt: return binary_loop<bool, T>(out, a, b, [](T x, T y) { return x < y; });
    case Binary::Le: return binary_loop<bool, T>(out, a, b, [](T x, T y) { return x <= y; });
    case Binary::Gt: return binary_loop<bool, T>(out, a, b, [](T x, T y) { return x > y; });
    case Binary::Ge: return binary_loop<bool, T>(out, a, b, [](T x, T y) { return x >= y; });
  }
  TP_CHECK(false, "binary: this kind takes floating tensors, got {}", dtype_of<T>());
}

// In-place writes into an expanded view would write one element many times (and race).
void check_writable(const char* op, const Tensor& dst) {
  if (dst.numel() == 0) return;  // nothing is written
  for (int64_t d = 0; d < dst.dim(); ++d)
    TP_CHECK(dst.stride(d) != 0 || dst.size(d) <= 1,
             "{}: the destination of shape {} (strides {}) is an expanded view whose elements share memory; "
             "clone() it first", op, dst.sizes(), dst.strides());
}

void check_binary(const char* op, Binary kind, const Tensor& a, const Tensor& b) {
  check_device(op, a);
  check_device(op, b);
  TP_CHECK(a.dtype() == b.dtype(), "{}: dtype mismatch: {} {} and {} {} (convert one with .to())", op, a.dtype(),
           a.sizes(), b.dtype(), b.sizes());
  if (a.dtype() == DType::Bool)
    TP_CHECK(kind == Binary::Eq || kind == Binary::Ne, "{}: not supported for bool tensors; convert with .to() first",
             op);
  if (a.dtype() == DType::Int64)
    TP_CHECK(kind != Binary::Div && kind != Binary::Pow,
             "{}: not supported for int64 tensors (integer division); convert to float first", op);
}

void run_binary(Binary kind, const Tensor& out, const Tensor& a, const Tensor& b) {
  dispatch(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, bool>) {
      if (kind == Binary::Eq) binary_loop<bool, bool>(out, a, b, [](bool x, bool y) { return x == y; });
      else binary_loop<bool, bool>(out, a, b, [](bool x, bool y) { return x != y; });
    } else {
      binary_typed<T>(kind, out, a, b);
    }
  });
}

}  // namespace

bool is_comparison(Binary kind) { return kind >= Binary::Eq; }

Tensor binary(const char* op, Binary kind, const Tensor& a, const Tensor& b) {
  TP_PROFILE(op);
  check_binary(op, kind, a, b);
  Shape shape = broadcast_shapes(op, a.sizes(), b.sizes());
  Tensor out = empty(shape, is_comparison(kind) ? DType::Bool : a.dtype());
  run_binary(kind, out, a, b);
  return out;
}

void binary_(const char* op, Binary kind, Tensor& a, const Tensor& b) {
  TP_PROFILE(op);
  check_binary(op, kind, a, b);
  TP_CHECK(!is_comparison(kind), "{}: comparisons have no in-place form", op);
  check_writable(op, a);
  Shape shape = broadcast_shapes(op, a.sizes(), b.sizes());
  TP_CHECK(shape == a.sizes(), "{}: in-place result of shape {} does not fit the destination of shape {}", op, shape,
           a.sizes());
  run_binary(kind, a, a, b);
  a.impl().storage->version++;
}

namespace {

template <class R, class T, class Op>
void unary_loop(const Tensor& out, const Tensor& a, Op op) {
  R* po = out.data_ptr<R>();
  const T* pa = a.data_ptr<T>();
  strided_apply<2>(out.sizes(), {out.strides(), a.strides()},
                   [&](const std::array<int64_t, 2>& off, const std::array<int64_t, 2>& st, int64_t n) {
                     R* o = po + off[0];
                     const T* x = pa + off[1];
                     if (st[0] == 1 && st[1] == 1) {
                       for (int64_t i = 0; i < n; ++i) o[i] = op(x[i]);
                     } else {
                       for (int64_t i = 0; i < n; ++i) o[i * st[0]] = op(x[i * st[1]]);
                     }
                   });
}

template <class T>
void unary_floating(Unary kind, const Tensor& out, const Tensor& a, double p0, double p1) {
  const T pe = static_cast<T>(p0);
  (void)p1;
  switch (kind) {
    case Unary::Exp: return unary_loop<T, T>(out, a, [](T x) { return std::exp(x); });
    case Unary::Log: return unary_loop<T, T>(out, a, [](T x) { return std::log(x); });
    case Unary::Sqrt: return unary_loop<T, T>(out, a, [](T x) { return std::sqrt(x); });
    case Unary::Rsqrt: return unary_loop<T, T>(out, a, [](T x) { return T(1) / std::sqrt(x); });
    case Unary::Tanh: return unary_loop<T, T>(out, a, [](T x) { return std::tanh(x); });
    case Unary::Sigmoid:
      return unary_loop<T, T>(out, a, [](T x) {
        // Stable on both sides: never exponentiates a large positive number.
        if (x >= 0) return T(1) / (T(1) + std::exp(-x));
        T e = std::exp(x);
        return e / (T(1) + e);
      });
    case Unary::Gelu:  // the exact (erf) form, PyTorch's default
      return unary_loop<T, T>(out, a, [](T x) { return T(0.5) * x * (T(1) + std::erf(x * T(M_SQRT1_2))); });
    case Unary::GeluTanh:  // GPT-2's approximation (cpu::gelu_tanh)
      return unary_loop<T, T>(out, a, [](T x) { return cpu::gelu_tanh(x); });
    case Unary::PowScalar:
      // PyTorch computes x^0.5 and x^-0.5 as (r)sqrt: NaN for x = -inf, where std::pow gives inf / 0.
      if (pe == T(0.5)) return unary_loop<T, T>(out, a, [](T x) { return std::sqrt(x); });
      if (pe == T(-0.5)) return unary_loop<T, T>(out, a, [](T x) { return T(1) / std::sqrt(x); });
      return unary_loop<T, T>(out, a, [pe](T x) { return std::pow(x, pe); });
    default: break;
  }
}

template <class T>
void unary_numeric(Unary kind, const Tensor& out, const Tensor& a, double p0, double p1) {
  switch (kind) {
    case Unary::Neg: return unary_loop<T, T>(out, a, [](T x) { return static_cast<T>(-x); });
    case Unary::Abs: return unary_loop<T, T>(out, a, [](T x) { return x < 0 ? static_cast<T>(-x) : x; });
    case Unary::Sign: return unary_loop<T, T>(out, a, [](T x) { return static_cast<T>((x > 0) - (x < 0)); });
    case Unary::Relu: return unary_loop<T, T>(out, a, [](T x) { return x > 0 || cpu::is_nan(x) ? x : T(0); });  // NaN stays NaN
    case Unary::Clamp: {
      T lo = static_cast<T>(p0), hi = static_cast<T>(p1);
      return unary_loop<T, T>(out, a, [lo, hi](T x) { return x < lo ? lo : (x > hi ? hi : x); });
    }
    default:
      if constexpr (std::is_floating_point_v<T>) unary_floating<T>(kind, out, a, p0, p1);
  }
}

bool needs_floating(Unary kind) {
  switch (kind) {
    case Unary::Neg: case Unary::Abs: case Unary::Sign: case Unary::Relu: case Unary::Clamp: return false;
    default: return true;
  }
}

}  // namespace

Tensor unary(const char* op, Unary kind, const Tensor& a, double p0, double p1) {
  TP_PROFILE(op);
  check_device(op, a);
  if (kind == Unary::Clamp) TP_CHECK(p0 <= p1, "{}: min {} is greater than max {}", op, p0, p1);
  Tensor out = empty(a.sizes(), a.dtype());
  auto run = [&](auto tag) {
    using T = typename decltype(tag)::type;
    unary_numeric<T>(kind, out, a, p0, p1);
  };
  if (needs_floating(kind)) dispatch_floating(a.dtype(), op, run);
  else dispatch_numeric(a.dtype(), op, run);
  return out;
}

Tensor where(const char* op, const Tensor& cond, const Tensor& a, const Tensor& b) {
  TP_PROFILE(op);
  check_device(op, cond);
  TP_CHECK(cond.dtype() == DType::Bool, "{}: condition must be a bool mask, got {} {}", op, cond.dtype(),
           cond.sizes());
  TP_CHECK(a.dtype() == b.dtype(), "{}: dtype mismatch: {} {} and {} {}", op, a.dtype(), a.sizes(), b.dtype(),
           b.sizes());
  Shape shape = broadcast_shapes(op, broadcast_shapes(op, cond.sizes(), a.sizes()), b.sizes());
  Tensor out = empty(shape, a.dtype());
  dispatch(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* po = out.data_ptr<T>();
    const bool* pc = cond.data_ptr<bool>();
    const T* pa = a.data_ptr<T>();
    const T* pb = b.data_ptr<T>();
    strided_apply<4>(shape,
                     {out.strides(), broadcast_strides(cond, shape), broadcast_strides(a, shape),
                      broadcast_strides(b, shape)},
                     [&](const std::array<int64_t, 4>& off, const std::array<int64_t, 4>& st, int64_t n) {
                       for (int64_t i = 0; i < n; ++i)
                         po[off[0] + i * st[0]] =
                             pc[off[1] + i * st[1]] ? pa[off[2] + i * st[2]] : pb[off[3] + i * st[3]];
                     });
  });
  return out;
}

void copy_(const Tensor& dst, const Tensor& src) {
  TP_PROFILE("copy_");
  check_device("copy_", dst);
  check_device("copy_", src);
  Shape shape = broadcast_shapes("copy_", dst.sizes(), src.sizes());
  TP_CHECK(shape == dst.sizes(), "copy_: source of shape {} cannot be broadcast to the destination shape {}",
           src.sizes(), dst.sizes());
  check_writable("copy_", dst);
  dispatch(dst.dtype(), [&](auto dtag) {
    using D = typename decltype(dtag)::type;
    dispatch(src.dtype(), [&](auto stag) {
      using S = typename decltype(stag)::type;
      D* pd = dst.data_ptr<D>();
      const S* ps = src.data_ptr<S>();
      strided_apply<2>(shape, {dst.strides(), broadcast_strides(src, shape)},
                       [&](const std::array<int64_t, 2>& off, const std::array<int64_t, 2>& st, int64_t n) {
                         D* o = pd + off[0];
                         const S* x = ps + off[1];
                         if (st[0] == 1 && st[1] == 1) {
                           for (int64_t i = 0; i < n; ++i) o[i] = static_cast<D>(x[i]);
                         } else {
                           for (int64_t i = 0; i < n; ++i) o[i * st[0]] = static_cast<D>(x[i * st[1]]);
                         }
                       });
    });
  });
  dst.impl().storage->version++;
}

void fill_(const Tensor& dst, double value) {
  TP_PROFILE("fill_");
  check_device("fill_", dst);
  dispatch(dst.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = dst.data_ptr<T>();
    const T v = static_cast<T>(value);
    strided_apply<1>(dst.sizes(), {dst.strides()},
                     [&](const std::array<int64_t, 1>& off, const std::array<int64_t, 1>& st, int64_t n) {
                       for (int64_t i = 0; i < n; ++i) p[off[0] + i * st[0]] = v;
                     });
  });
  dst.impl().storage->version++;
}

Tensor contiguous(const Tensor& a) {
  if (a.is_contiguous()) return a;
  Tensor out = empty(a.sizes(), a.dtype());
  copy_(out, a);
  return out;
}

Tensor to_dtype(const Tensor& a, DType dtype) {
  if (a.dtype() == dtype) return a;
  Tensor out = empty(a.sizes(), dtype);
  copy_(out, a);
  return out;
}

namespace {
// Random fills draw sequentially in row-major order, into a contiguous buffer when needed.
template <class Draw>
void random_fill(const char* op, const Tensor& dst, Draw draw) {
  check_device(op, dst);
  Tensor buf = dst.is_contiguous() ? dst : empty(dst.sizes(), dst.dtype());
  dispatch_numeric(dst.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = buf.data_ptr<T>();
    for (int64_t i = 0, n = buf.numel(); i < n; ++i) p[i] = static_cast<T>(draw());
  });
  if (!dst.is_contiguous()) copy_(dst, buf);
  else dst.impl().storage->version++;
}
}  // namespace

namespace {
// A plain function (not a lambda) so that GCC vectorizes it (cpu::dropout_keeps, loops.h).
template <class T>
void dropout_run(const T* x, T* out, int64_t n, uint32_t start, uint32_t key, uint32_t threshold, T scale) {
#pragma omp simd
  for (int64_t k = 0; k < n; ++k)
    out[k] = x[k] * (cpu::dropout_keeps(start + static_cast<uint32_t>(k), key, threshold) ? scale : T(0));
}
}  // namespace

Tensor dropout(const Tensor& x_in, double p, uint64_t seed) {
  TP_PROFILE("dropout");
  check_device("dropout", x_in);
  Tensor x = contiguous(x_in);
  Tensor out = empty(x.sizes(), x.dtype());
  const uint32_t threshold = cpu::dropout_threshold(p);
  dispatch_floating(x.dtype(), "dropout", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = x.data_ptr<T>();
    T* po = out.data_ptr<T>();
    const T scale = static_cast<T>(1.0 / (1.0 - p));
    const uint32_t key = cpu::dropout_key(seed);
    cpu::parallel_for(0, x.numel(), cpu::kGrainSize, [&](int64_t b, int64_t e) {
      dropout_run(px + b, po + b, e - b, static_cast<uint32_t>(b), key, threshold, scale);
    });
  });
  return out;
}

void uniform_(const Tensor& dst, double lo, double hi, std::mt19937_64& engine) {
  TP_PROFILE("uniform_");
  dispatch_floating(dst.dtype(), "uniform_", [](auto) {});
  std::uniform_real_distribution<double> dist(lo, hi);
  random_fill("uniform_", dst, [&] { return dist(engine); });
}

void normal_(const Tensor& dst, double mean, double std, std::mt19937_64& engine) {
  TP_PROFILE("normal_");
  dispatch_floating(dst.dtype(), "normal_", [](auto) {});
  TP_CHECK(std >= 0, "normal_: std must be non-negative, got {}", std);
  std::normal_distribution<double> dist(mean, std);
  random_fill("normal_", dst, [&] { return dist(engine); });
}

void randint_(const Tensor& dst, int64_t low, int64_t high, std::mt19937_64& engine) {
  std::uniform_int_distribution<int64_t> dist(low, high - 1);
  random_fill("randint_", dst, [&] { return dist(engine); });
}

}  // namespace tapestry::kernels
