// matmul with torch.matmul's rules: 1-D operands are promoted to matrices (and the added dim
// removed from the result), batch dims broadcast. The kernel reads transposed and strided
// operands in place, so the backward's transposes cost no copies. Under an AutocastGuard
// (ops/autocast.h) the backward multiplies at the forward's precision, as PyTorch's bf16 autocast
// does (its saved operands are bfloat16), wherever the backward runs.
#include "tapestry/autograd/functions.h"
#include "tapestry/ops/autocast.h"
#include "tapestry/ops/detail/kernels.h"

namespace tapestry {

namespace {
// The matmul precision for this op's inputs: autocast's, for float32 tensors on a device that
// can multiply bfloat16 (the guard checked the device it was opened for; this one may differ).
Precision matmul_precision(const char* op, const Tensor& a) {
  Precision p = autocast_precision();
  if (p == Precision::Float32 || a.dtype() != DType::Float32) return Precision::Float32;
  std::string why;
  TP_CHECK(bf16_supported(a.device(), &why), "{}: autocast to bfloat16 on {}: {}", op, a.device(), why);
  return p;
}
// Under bfloat16, a weight's rounded copy is kept for the guard's life (Note [Autocast weight cache]).
void cache_weights(Precision p, std::initializer_list<const Tensor*> operands) {
  if (p != Precision::BFloat16) return;
  for (const Tensor* t : operands)
    if (t->defined() && t->requires_grad() && t->is_leaf()) autocast_cache_weight(*t);
}
}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  TP_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: both operands need at least 1 dim, got shapes {} and {}",
           a.sizes(), b.sizes());
  if (a.dim() == 1 || b.dim() == 1) {
    Tensor a2 = a.dim() == 1 ? unsqueeze(a, 0) : a;   // [K] -> [1, K]
    Tensor b2 = b.dim() == 1 ? unsqueeze(b, -1) : b;  // [K] -> [K, 1]
    Tensor out = matmul(a2, b2);
    if (b.dim() == 1) out = squeeze(out, -1);
    if (a.dim() == 1) out = squeeze(out, a.dim() == 1 && b.dim() == 1 ? -1 : -2);
    return out;
  }
  const Precision prec = matmul_precision("matmul", a);
  cache_weights(prec, {&a, &b});
  Tensor out = kernels::matmul(a, b);
  if (!any_requires_grad({a, b})) return out;
  bool need_a = a.requires_grad(), need_b = b.requires_grad();
  SavedTensor sa(need_b ? a : Tensor(), "MmBackward"), sb(need_a ? b : Tensor(), "MmBackward");
  // dA = g @ B^T, dB = A^T @ g (the engine sums broadcast batch dims back)
  const Device device = a.device();
  return record("MmBackward", out, {a, b}, [sa, sb, need_a, need_b, prec, device](const Tensor& g) {
    AutocastGuard at(prec, device);
    if (GradMode::is_enabled())  // a recording backward: the products as recorded ops
      return TensorList{need_a ? matmul(g, transpose(sb.get(), -1, -2)) : Tensor(),
                        need_b ? matmul(transpose(sa.get(), -1, -2), g) : Tensor()};
    return TensorList{need_a ? kernels::matmul(g, transpose(sb.get(), -1, -2)) : Tensor(),
                      need_b ? kernels::matmul(transpose(sa.get(), -1, -2), g) : Tensor()};
  });
}

namespace {
// A raw header over t's storage (no autograd): the kernels below work on these.
Tensor raw_view(const Tensor& t, Shape shape, Shape strides) {
  return make_tensor(t.impl().storage, std::move(shape), std::move(strides), t.offset(), t.dtype());
}
Tensor rows_of(const Tensor& t, int64_t cols) {  // [..., cols] -> [N, cols], contiguous
  Tensor c = kernels::contiguous(t);
  return raw_view(c, {c.numel() / std::max<int64_t>(cols, 1), cols}, {cols, 1});
}
}  // namespace

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  TP_CHECK(w.dim() == 2, "linear: weight must be [out, in], got shape {}", w.sizes());
  const int64_t out_f = w.size(0), in_f = w.size(1);
  TP_CHECK(x.dim() >= 1 && x.size(-1) == in_f, "linear: input of shape {} does not end in in_features={} (weight {})",
           x.sizes(), in_f, w.sizes());
  if (b.defined()) TP_CHECK(b.sizes() == Shape{out_f}, "linear: bias {} must be [{}]", b.sizes(), out_f);
  if (x.numel() == 0 || w.numel() == 0) {
    // Empty operands (in_features 0 gives the bias, as in PyTorch): composed from recorded ops,
    // so every gradient, empty or not, has its input's shape. BLAS is not called on empty matrices.
    Tensor y = sum(mul(unsqueeze(x, -2), w), {-1});
    return b.defined() ? add(y, b) : y;
  }
  const Precision prec = matmul_precision("linear", x);
  cache_weights(prec, {&x, &w});
  Tensor x2 = rows_of(x, in_f);                                   // (N, in)
  Tensor wt = raw_view(w, {in_f, out_f}, {w.stride(1), w.stride(0)});  // (in, out), read transposed
  Tensor y = kernels::matmul(x2, wt);                            // (N, out), fresh
  if (b.defined()) kernels::binary_("linear", kernels::Binary::Add, y, b);
  Shape out_shape = x.sizes();
  out_shape.back() = out_f;
  y = raw_view(y, out_shape, contiguous_strides(out_shape));
  if (!any_requires_grad({x, w, b})) return y;
  bool need_x = x.requires_grad(), need_w = w.requires_grad(), need_b = b.defined() && b.requires_grad();
  SavedTensor sx(need_w ? x2 : Tensor(), "LinearBackward"), sw(need_x ? w : Tensor(), "LinearBackward");
  // x itself, with its history, for a recording backward (x2 is a raw view without one).
  SavedTensor sxh(need_w && need_x ? x : Tensor(), "LinearBackward");
  Shape x_shape = x.sizes();
  const Device device = x.device();
  return record("LinearBackward", y, {x, w, b}, [=](const Tensor& g) {
    AutocastGuard at(prec, device);
    if (GradMode::is_enabled()) {  // a recording backward: the same products as recorded ops
      TensorList grads(3);
      const Tensor xv = need_x ? sxh.get() : sx.get();
      if (need_x) grads[0] = matmul(g, sw.get());
      if (need_w) grads[1] = matmul(transpose(reshape(g, {-1, out_f}), 0, 1), reshape(xv, {-1, in_f}));
      if (need_b) grads[2] = reshape(sum(reshape(g, {-1, out_f}), {0}), {out_f});
      return grads;
    }
    Tensor g2 = rows_of(g, out_f);  // (N, out)
    TensorList grads(3);
    if (need_x) grads[0] = raw_view(kernels::matmul(g2, sw.get()), x_shape, contiguous_strides(x_shape));
    if (need_w) grads[1] = kernels::matmul(raw_view(g2, {out_f, g2.size(0)}, {1, out_f}), sx.get());  // g^T x
    if (need_b) grads[2] = kernels::reduce("linear_backward", kernels::Reduce::Sum, g2, {0}, false);
    return grads;
  });
}

}  // namespace tapestry
