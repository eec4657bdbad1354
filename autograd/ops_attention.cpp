// scaled_dot_product_attention (a mask of where to attend, as PyTorch's) and
// scaled_dot_product_attention_masked_out (a mask of what to leave out, as the kernels read it):
// the fused kernel (ops/cpu/attention.cpp) forward and backward.
#include <cmath>

#include "tapestry/autograd/functions.h"
#include "tapestry/ops/detail/backend.h"
#include "tapestry/ops/detail/kernels.h"

namespace tapestry {

namespace {

// The fused kernel's semantics as recorded ops (for a backward that records): a masked score
// (by the mask, true = masked out, or by causality) becomes kAttentionMasked.
Tensor attention_composite(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& masked_out, bool is_causal,
                           double scale) {
  Tensor scores = mul(matmul(q, transpose(k, -1, -2)), scale);
  const int64_t Tq = q.size(-2), Tk = k.size(-2);
  Tensor masked = masked_out;
  if (is_causal) {
    const TensorOptions ids(DType::Int64, q.device());
    Tensor future = gt(unsqueeze(arange(Tk, ids), 0), unsqueeze(arange(Tq, ids), 1));  // key j > query i
    masked = masked.defined() ? logical_or(masked, future) : future;
  }
  if (masked.defined()) scores = masked_fill(scores, expand(masked, scores.sizes()), kernels::kAttentionMasked);
  return matmul(softmax(scores, -1), v);
}


// `mask`: true = masked out.
Tensor attention(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                 bool is_causal, double dropout_p, std::optional<double> scale, Generator* gen) {
  TP_CHECK(q.defined() && k.defined() && v.defined(), "{}: q, k and v must be defined", op);
  TP_CHECK(q.dim() >= 2 && k.dim() == q.dim() && v.dim() == q.dim(),
           "{}: expected q [..., Tq, E], k [..., Tk, E], v [..., Tk, Ev] with the same number of dims (at least 2), "
           "got {}, {}, {}", op, q.sizes(), k.sizes(), v.sizes());
  TP_CHECK(is_floating(q.dtype()) && k.dtype() == q.dtype() && v.dtype() == q.dtype(),
           "{}: q, k and v must share one floating dtype, got {}, {}, {}", op, q.dtype(), k.dtype(), v.dtype());
  bool lead_ok = k.size(-1) == q.size(-1) && v.size(-2) == k.size(-2);
  for (int64_t d = 0; lead_ok && d < q.dim() - 2; ++d) lead_ok = k.size(d) == q.size(d) && v.size(d) == q.size(d);
  TP_CHECK(lead_ok, "{}: expected q [..., Tq, E], k [..., Tk, E], v [..., Tk, Ev] with the same leading dims, got {}, "
           "{}, {}", op, q.sizes(), k.sizes(), v.sizes());
  if (mask.defined())
    TP_CHECK(mask.dtype() == DType::Bool, "{}: the mask must be Bool (true = masked out), got {} {}", op,
             mask.dtype(), mask.sizes());
  TP_CHECK(dropout_p >= 0 && dropout_p < 1, "{}: dropout_p must be in [0, 1), got {}", op, dropout_p);
  const double s = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(q.size(-1), 1)));
  const uint64_t seed = dropout_p > 0 ? (gen ? *gen : default_generator()).engine()() : 0;
  // Plain variables, not a structured binding: C++17 lambdas cannot capture those (clang refuses).
  kernels::AttentionOut result = kernels::scaled_dot_product_attention(q, k, v, mask, is_causal, s, dropout_p, seed);
  Tensor out = result.out, lse = result.lse;
  if (!any_requires_grad({q, k, v})) return out;
  SavedTensor sq(q, "ScaledDotProductAttentionBackward"), sk(k, "ScaledDotProductAttentionBackward"),
      sv(v, "ScaledDotProductAttentionBackward"), so(out, "ScaledDotProductAttentionBackward");
  Tensor m = mask.defined() ? mask.detach() : Tensor();
  return record("ScaledDotProductAttentionBackward", out, {q, k, v},
                [sq, sk, sv, so, lse, m, is_causal, s, dropout_p, seed](const Tensor& g) {
                  if (GradMode::is_enabled()) {
                    // A recording backward: through the composite softmax(masked q k^T s) v.
                    TP_CHECK(dropout_p == 0,
                             "scaled_dot_product_attention: a backward that records (create_graph) is not implemented "
                             "with dropout_p > 0 (the fused kernel's dropout mask has no composite form); use "
                             "dropout_p = 0 for higher-order gradients");
                    return composite_vjp(
                        [m, is_causal, s](const TensorList& in) { return attention_composite(in[0], in[1], in[2], m, is_causal, s); },
                        {sq.get(), sk.get(), sv.get()}, g);
                  }
                  auto r = kernels::scaled_dot_product_attention_backward(g, sq.get(), sk.get(), sv.get(), so.get(),
                                                                          lse, m, is_causal, s, dropout_p, seed);
                  return TensorList{r.dq, r.dk, r.dv};
                });
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask,
                                    bool is_causal, double dropout_p, std::optional<double> scale, Generator* gen) {
  const char* op = "scaled_dot_product_attention";
  if (!attn_mask.defined()) return attention(op, q, k, v, Tensor(), is_causal, dropout_p, scale, gen);
  TP_CHECK(attn_mask.dtype() == DType::Bool,
           "{}: attn_mask must be Bool, true where a query may attend (as torch.nn.functional."
           "scaled_dot_product_attention; additive float masks are not supported), got {} {}",
           op, attn_mask.dtype(), attn_mask.sizes());
  return attention(op, q, k, v, logical_not(attn_mask), is_causal, dropout_p, scale, gen);
}

Tensor scaled_dot_product_attention_masked_out(const Tensor& q, const Tensor& k, const Tensor& v,
                                               const Tensor& masked_out, bool is_causal, double dropout_p,
                                               std::optional<double> scale, Generator* gen) {
  return attention("scaled_dot_product_attention_masked_out", q, k, v, masked_out, is_causal, dropout_p, scale, gen);
}

}  // namespace tapestry
