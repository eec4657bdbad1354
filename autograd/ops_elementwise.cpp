// Elementwise ops: forward via kernels::binary / kernels::unary, backward beside each.
// Broadcasting needs no code here: the engine sums each gradient back to its input's shape.
#include <cmath>
#include <limits>

#include "tapestry/autograd/functions.h"
#include "tapestry/ops/detail/kernels.h"

namespace tapestry {

using kernels::Binary;
using kernels::Unary;

namespace {
Tensor scalar_like(double v, const Tensor& a) { return scalar_tensor(v, a.options()); }
Tensor zero_like_scalar(const Tensor& a) { return scalar_like(0.0, a); }
}  // namespace

// ---- binary
Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = kernels::binary("add", Binary::Add, a, b);
  return record("AddBackward", out, {a, b}, [](const Tensor& g) { return TensorList{g, g}; });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = kernels::binary("sub", Binary::Sub, a, b);
  return record("SubBackward", out, {a, b}, [](const Tensor& g) { return TensorList{g, neg(g)}; });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = kernels::binary("mul", Binary::Mul, a, b);
  if (!any_requires_grad({a, b})) return out;
  bool need_a = a.requires_grad(), need_b = b.requires_grad();
  // d(a*b) = g*b, g*a: save only the factor each needed gradient uses.
  SavedTensor sa(need_b ? a : Tensor(), "MulBackward"), sb(need_a ? b : Tensor(), "MulBackward");
  return record("MulBackward", out, {a, b}, [sa, sb, need_a, need_b](const Tensor& g) {
    return TensorList{need_a ? mul(g, sb.get()) : Tensor(), need_b ? mul(g, sa.get()) : Tensor()};
  });
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = kernels::binary("div", Binary::Div, a, b);
  if (!any_requires_grad({a, b})) return out;
  bool need_b = b.requires_grad();
  SavedTensor sa(need_b ? a : Tensor(), "DivBackward"), sb(b, "DivBackward");
  // d(a/b) = g/b, -g*a/b^2
  return record("DivBackward", out, {a, b}, [sa, sb, need_b](const Tensor& g) {
    Tensor bv = sb.get();
    Tensor ga = div(g, bv);
    return TensorList{ga, need_b ? neg(mul(ga, div(sa.get(), bv))) : Tensor()};
  });
}

namespace {
// maximum/minimum: the gradient goes to the larger (smaller) input; ties split it evenly.
Tensor extremum(const char* op, const char* node, Binary kind, const Tensor& a, const Tensor& b) {
  Tensor out = kernels::binary(op, kind, a, b);
  if (!any_requires_grad({a, b})) return out;
  SavedTensor sa(a, node), sb(b, node);
  bool is_max = kind == Binary::Maximum;
  return record(node, out, {a, b}, [sa, sb, is_max](const Tensor& g) {
    Tensor av = sa.get(), bv = sb.get();
    // As PyTorch: the loser gets 0, a tie half each, and where the comparison is unordered (a
    // NaN) both inputs get the whole gradient.
    Tensor a_loses = is_max ? lt(av, bv) : gt(av, bv), b_loses = is_max ? gt(av, bv) : lt(av, bv);
    Tensor tie = eq(av, bv), half = scalar_like(0.5, av), one = scalar_like(1.0, av), zero = scalar_like(0.0, av);
    Tensor wa = where(a_loses, zero, where(tie, half, one)), wb = where(b_loses, zero, where(tie, half, one));
    return TensorList{mul(g, wa), mul(g, wb)};
  });
}
}  // namespace

Tensor maximum(const Tensor& a, const Tensor& b) { return extremum("maximum", "MaximumBackward", Binary::Maximum, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return extremum("minimum", "MinimumBackward", Binary::Minimum, a, b); }

// Scalar forms: the scalar becomes a 0-dim tensor of a's dtype, which broadcasts for free.
Tensor add(const Tensor& a, double b) { return add(a, scalar_like(b, a)); }
Tensor sub(const Tensor& a, double b) { return sub(a, scalar_like(b, a)); }
Tensor mul(const Tensor& a, double b) { return mul(a, scalar_like(b, a)); }
Tensor div(const Tensor& a, double b) { return div(a, scalar_like(b, a)); }
Tensor rsub(const Tensor& a, double b) { return sub(scalar_like(b, a), a); }
Tensor rdiv(const Tensor& a, double b) { return div(scalar_like(b, a), a); }

// ---- comparisons (not differentiable)
Tensor eq(const Tensor& a, const Tensor& b) { return kernels::binary("eq", Binary::Eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return kernels::binary("ne", Binary::Ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return kernels::binary("lt", Binary::Lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return kernels::binary("le", Binary::Le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return kernels::binary("gt", Binary::Gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return kernels::binary("ge", Binary::Ge, a, b); }
Tensor eq(const Tensor& a, double b) { return eq(a, scalar_like(b, a)); }
Tensor ne(const Tensor& a, double b) { return ne(a, scalar_like(b, a)); }
Tensor lt(const Tensor& a, double b) { return lt(a, scalar_like(b, a)); }
Tensor le(const Tensor& a, double b) { return le(a, scalar_like(b, a)); }
Tensor gt(const Tensor& a, double b) { return gt(a, scalar_like(b, a)); }
Tensor ge(const Tensor& a, double b) { return ge(a, scalar_like(b, a)); }
Tensor logical_not(const Tensor& mask) {
  TP_CHECK(mask.dtype() == DType::Bool, "logical_not: expected a bool mask, got {} {}", mask.dtype(), mask.sizes());
  return kernels::binary("logical_not", Binary::Eq, mask, scalar_tensor(0.0, TensorOptions(DType::Bool, mask.device())));
}

Tensor logical_or(const Tensor& a, const Tensor& b) {
  TP_CHECK(a.dtype() == DType::Bool && b.dtype() == DType::Bool, "logical_or: expected bool masks, got {} {} and {} {}",
           a.dtype(), a.sizes(), b.dtype(), b.sizes());
  return kernels::where("logical_or", a, scalar_tensor(1.0, TensorOptions(DType::Bool, a.device())), b);
}

// ---- unary
Tensor neg(const Tensor& a) {
  Tensor out = kernels::unary("neg", Unary::Neg, a);
  return record("NegBackward", out, {a}, [](const Tensor& g) { return TensorList{neg(g)}; });
}

Tensor exp(const Tensor& a) {
  Tensor out = kernels::unary("exp", Unary::Exp, a);
  if (!any_requires_grad({a})) return out;
  SavedTensor y = SavedTensor::output(out, "ExpBackward");
  return record("ExpBackward", out, {a}, [y](const Tensor& g) { return TensorList{mul(g, y.get())}; });
}

Tensor log(const Tensor& a) {
  Tensor out = kernels::unary("log", Unary::Log, a);
  if (!any_requires_grad({a})) return out;
  SavedTensor x(a, "LogBackward");
  return record("LogBackward", out, {a}, [x](const Tensor& g) { return TensorList{div(g, x.get())}; });
}

Tensor log1p(const Tensor& a) {
  Tensor out = kernels::unary("log1p", Unary::Log1p, a);
  if (!any_requires_grad({a})) return out;
  SavedTensor x(a, "Log1pBackward");
  return record("Log1pBackward", out, {a}, [x](const Tensor& g) { return TensorList{div(g, add(x.get(), 1.0))}; });
}

Tensor expm1(const Tensor& a) {
  Tensor out = kernels::unary("expm1", Unary::Expm1, a);
  if (!any_requires_grad({a})) return out;
  SavedTensor y = SavedTensor::output(out, "Expm1Backward");
  return record("Expm1Backward", out, {a}, [y](const Tensor& g) { return TensorList{mul(g, add(y.get(), 1.0))}; });
}

Tensor sqrt(const Tensor& a) {
  Tensor out = kernels::unary("sqrt", Unary::Sqrt, a);
  if (!any_requires_grad({a})) return out;
  SavedTensor y = SavedTensor::output(out, "SqrtBackward");
  // d sqrt(x) = 1 / (2 sqrt(x))
  return record("SqrtBackward", out, {a}, [y](const Tensor& g) { return TensorList{div(mul(g, 0.5), y.get())}; });
}

Tensor rsqrt(const Tensor& a) {
  Tensor out = kernels::unary("rsqrt", Unary::Rsqrt, a);
  if (!any_requires_grad({a})) return out;
  SavedTensor y = SavedTensor::output(out, "RsqrtBackward");
  // d x^-1/2 = -1/2 x^-3/2 = -1/2 y^3
  return record("RsqrtBackward", out, {a}, [y](const Tensor& g) {
    Tensor yv = y.get();
    return TensorList{mul(g, mul(pow(yv, 3.0), -0.5))};
  });
}

Tensor pow(const Tensor& a, double p) {
  Tensor out = kernels::unary("pow", Unary::PowScalar, a, p);
  if (!any_requires_grad({a})) return out;
  SavedTensor x(a, "PowBackward");
  return record("PowBackward", out, {a}, [x, p](const Tensor& g) {
    if (p == 0.0) return TensorList{zeros_like(g)};
    return TensorList{mul(g, mul(pow(x.get(), p - 1.0), p))};
  });
}

Tensor tanh(const Tensor& a) {
  Tensor out = kernels::unary("tanh", Unary::Tanh, a);
  if (!any_requires_grad({a})) return out;
  SavedTensor y = SavedTensor::output(out, "TanhBackward");
  return record("TanhBackward", out, {a}, [y](const Tensor& g) {
    Tensor yv = y.get();
    return TensorList{mul(g, rsub(mul(yv, yv), 1.0))};
  });
}

Tensor relu(const Tensor& a) {
  Tensor out = kernels::unary("relu", Unary::Relu, a);
  if (!any_requires_grad({a})) return out;
  SavedTensor y = SavedTensor::output(out, "ReluBackward");
  return record("ReluBackward", out, {a}, [y](const Tensor& g) {
    Tensor yv = y.get();
    if (GradMode::is_enabled()) return TensorList{where(gt(yv, 0.0), g, 0.0)};  // a recording backward
    return TensorList{kernels::binary("relu_backward", Binary::ReluBackward, g, yv)};
  });
}

Tensor gelu(const Tensor& a, const std::string& approximate) {
  TP_CHECK(approximate == "none" || approximate == "tanh",
           "gelu: approximate must be 'none' or 'tanh', got '{}'", approximate);
  const bool tanh_form = approximate == "tanh";
  Tensor out = kernels::unary("gelu", tanh_form ? Unary::GeluTanh : Unary::Gelu, a);
  if (!any_requires_grad({a})) return out;
  SavedTensor x(a, "GeluBackward");
  return record("GeluBackward", out, {a}, [x, tanh_form](const Tensor& g) {
    if (GradMode::is_enabled()) return TensorList{gelu_backward(g, x.get(), tanh_form)};  // a recording backward
    return TensorList{
        kernels::binary("gelu_backward", tanh_form ? Binary::GeluTanhBackward : Binary::GeluBackward, g, x.get())};
  });
}

Tensor gelu_backward(const Tensor& g, const Tensor& x, bool tanh_form) {
  // g gelu'(x) from the fused kernel; its own derivative rule: d/dg = gelu'(x) (this op again),
  // d/dx = g gelu''(x), written with recorded ops so that it differentiates once more.
  Tensor out = kernels::binary("gelu_backward", tanh_form ? Binary::GeluTanhBackward : Binary::GeluBackward, g, x);
  if (!any_requires_grad({g, x})) return out;
  SavedTensor sg(g, "GeluBackwardBackward"), sx(x, "GeluBackwardBackward");
  return record("GeluBackwardBackward", out, {g, x}, [sg, sx, tanh_form](const Tensor& gg) {
    const Tensor xv = sx.get();
    const Tensor x2 = mul(xv, xv);
    Tensor second;
    if (tanh_form) {
      // u = k (x + c x^3), t = tanh(u): gelu'' = (1 - t^2) (u' - x t u'^2 + x u'' / 2)
      const double k = std::sqrt(2.0 / M_PI), c = 0.044715;
      const Tensor t = tanh(mul(add(xv, mul(mul(x2, xv), c)), k));
      const Tensor du = mul(add(mul(x2, 3.0 * c), 1.0), k), ddu = mul(xv, 6.0 * c * k);
      second = mul(rsub(mul(t, t), 1.0), add(sub(du, mul(mul(xv, t), mul(du, du))), mul(mul(xv, ddu), 0.5)));
    } else {
      // gelu'' = phi(x) (2 - x^2), phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
      second = mul(mul(exp(mul(x2, -0.5)), 1.0 / std::sqrt(2.0 * M_PI)), rsub(x2, 2.0));
    }
    return TensorList{gelu_backward(gg, xv, tanh_form), mul(mul(gg, sg.get()), second)};
  });
}

Tensor sigmoid(const Tensor& a) {
  Tensor out = kernels::unary("sigmoid", Unary::Sigmoid, a);
  if (!any_requires_grad({a})) return out;
  SavedTensor y = SavedTensor::output(out, "SigmoidBackward");
  return record("SigmoidBackward", out, {a}, [y](const Tensor& g) {
    Tensor yv = y.get();
    return TensorList{mul(g, mul(yv, rsub(yv, 1.0)))};
  });
}

Tensor abs(const Tensor& a) {
  Tensor out = kernels::unary("abs", Unary::Abs, a);
  if (!any_requires_grad({a})) return out;
  SavedTensor x(a, "AbsBackward");
  return record("AbsBackward", out, {a}, [x](const Tensor& g) {
    return TensorList{mul(g, kernels::unary("abs_backward", Unary::Sign, x.get()))};
  });
}

Tensor clamp_min(const Tensor& a, double lo) { return clamp(a, lo, std::numeric_limits<double>::infinity()); }

Tensor softplus(const Tensor& a, double beta, double threshold) {
  TP_CHECK(is_floating(a.dtype()), "softplus: expected a float tensor, got {} {}", a.dtype(), a.sizes());
  const Tensor bx = mul(a, beta), linear = gt(bx, threshold);
  // The smooth branch sees 0 where the linear one is taken: it never overflows, so its gradient
  // (0 there) never meets an inf. A NaN takes the smooth branch and stays NaN, its gradient too.
  const Tensor soft = div(log1p(exp(where(linear, 0.0, bx))), beta);
  return where(linear, a, soft);
}

Tensor clamp(const Tensor& a, double lo, double hi) {
  Tensor out = kernels::unary("clamp", Unary::Clamp, a, lo, hi);
  if (!any_requires_grad({a})) return out;
  SavedTensor x(a, "ClampBackward");
  // The gradient passes where lo <= x <= hi (not at NaN).
  return record("ClampBackward", out, {a}, [x, lo, hi](const Tensor& g) {
    Tensor xv = x.get(), z = zero_like_scalar(g);
    return TensorList{where(lt(xv, lo), z, where(gt(xv, hi), z, where(ne(xv, xv), z, g)))};  // NaN: 0, as torch
  });
}

// ---- selection
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  Tensor out = kernels::where("where", cond, a, b);
  if (!any_requires_grad({a, b})) return out;
  Tensor c = cond.detach();
  return record("WhereBackward", out, {cond, a, b}, [c](const Tensor& g) {
    Tensor z = zero_like_scalar(g);
    return TensorList{Tensor(), where(c, g, z), where(c, z, g)};
  });
}

Tensor where(const Tensor& cond, const Tensor& a, double b) { return where(cond, a, scalar_like(b, a)); }
Tensor where(const Tensor& cond, double a, const Tensor& b) { return where(cond, scalar_like(a, b), b); }

Tensor masked_fill(const Tensor& a, const Tensor& mask, double value) {
  Shape s = broadcast_shapes("masked_fill", a.sizes(), mask.sizes());
  TP_CHECK(s == a.sizes(), "masked_fill: mask of shape {} does not broadcast to the input shape {}", mask.sizes(),
           a.sizes());
  TP_CHECK(mask.dtype() == DType::Bool, "masked_fill: mask must be bool, got {} {}", mask.dtype(), mask.sizes());
  return where(mask, scalar_like(value, a), a);
}

// ---- operators
Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& a) { return neg(a); }
Tensor operator+(const Tensor& a, double b) { return add(a, b); }
Tensor operator-(const Tensor& a, double b) { return sub(a, b); }
Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
Tensor operator/(const Tensor& a, double b) { return div(a, b); }
Tensor operator+(double a, const Tensor& b) { return add(b, a); }
Tensor operator-(double a, const Tensor& b) { return rsub(b, a); }
Tensor operator*(double a, const Tensor& b) { return mul(b, a); }
Tensor operator/(double a, const Tensor& b) { return rdiv(b, a); }

// ---- rotary position embedding
namespace {
// Each pair (x[i], x[i + D/2]) of the last dim turned by the angle whose cosine and sine are
// cos[..., i] and sin[..., i]: [x1 c - x2 s, x2 c + x1 s], Hugging Face's rotate_half layout.
Tensor rotate_pairs(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  const int64_t h = x.size(-1) / 2;
  const Tensor x1 = x.slice(-1, 0, h), x2 = x.slice(-1, h, 2 * h);
  return cat({sub(mul(x1, cos), mul(x2, sin)), add(mul(x2, cos), mul(x1, sin))}, -1);
}
}  // namespace

Tensor rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  const char* op = "rotary_embedding";
  TP_CHECK(x.defined() && cos.defined() && sin.defined(), "{}: x, cos and sin must all be defined", op);
  TP_CHECK(is_floating(x.dtype()) && cos.dtype() == x.dtype() && sin.dtype() == x.dtype(),
           "{}: x, cos and sin must share one floating dtype, got {}, {} and {}", op, dtype_name(x.dtype()),
           dtype_name(cos.dtype()), dtype_name(sin.dtype()));
  TP_CHECK(x.dim() >= 1 && x.size(-1) % 2 == 0, "{}: the last dim of x {} must be even (pairs to rotate)", op,
           x.sizes());
  TP_CHECK(cos.sizes() == sin.sizes() && cos.dim() >= 1 && cos.size(-1) == x.size(-1) / 2,
           "{}: cos {} and sin {} must have one shape ending in half of x's last dim {} ({})", op, cos.sizes(),
           sin.sizes(), x.sizes(), x.size(-1) / 2);
  TP_CHECK(!cos.requires_grad() && !sin.requires_grad(),
           "{}: cos and sin are tables of angles and take no gradient; detach() them", op);
  Shape half = x.sizes();
  half.back() /= 2;
  TP_CHECK(broadcast_shapes(op, half, cos.sizes()) == half,
           "{}: cos and sin {} must broadcast to x's pairs {} (x {})", op, cos.sizes(), half, x.sizes());
  Tensor out;
  {
    NoGradGuard no_grad;
    out = rotate_pairs(x, cos, sin);
  }
  if (!any_requires_grad({x})) return out;
  SavedTensor sc(cos, "RotaryEmbeddingBackward"), ss(sin, "RotaryEmbeddingBackward");
  // A rotation's transpose turns the other way: the gradient is g rotated by -angle.
  return record("RotaryEmbeddingBackward", out, {x}, [sc, ss](const Tensor& g) {
    return TensorList{rotate_pairs(g, sc.get(), neg(ss.get()))};
  });
}

}  // namespace tapestry
