// Losses. cross_entropy keeps only the logits (already alive as the generator's output) and each
// row's log-sum-exp (its max and log sum, [N, 2]) for backward: the (tokens x vocab) probabilities are never stored.
#include "tapestry/autograd/functions.h"
#include "tapestry/ops/detail/backend.h"
#include "tapestry/ops/detail/kernels.h"

namespace tapestry {

Tensor cross_entropy(const Tensor& logits, const Tensor& target, double smoothing, int64_t ignore_index,
                     Reduction reduction) {
  // The count and the scale stay on the logits' device: no synchronisation, forward or backward.
  auto r = kernels::cross_entropy(logits, target, smoothing, ignore_index, reduction == Reduction::Mean);
  if (!any_requires_grad({logits})) return r.loss;
  SavedTensor sx(logits, "CrossEntropyBackward"), st(target, "CrossEntropyBackward");
  Tensor lse = r.lse, scale = r.scale;
  return record("CrossEntropyBackward", r.loss, {logits}, [sx, st, lse, smoothing, ignore_index, scale](const Tensor& g) {
    if (GradMode::is_enabled()) {
      // A recording backward: scale g (sum(q) softmax(x) - q) on the counted rows, as recorded
      // ops of x and g (q, the smoothed target distribution, is a constant).
      const Tensor x = sx.get(), t = st.get();
      const int64_t C = x.size(1);
      const kernels::Smoothing q = kernels::smoothing_for(smoothing, C, ignore_index);
      const Tensor counted = ne(t, static_cast<double>(ignore_index));
      const Tensor gold = unsqueeze(where(counted, t, 0.0), 1);
      Tensor dist = scatter(full(x.sizes(), q.other, x.options()), 1, gold, q.gold);
      if (q.skip >= 0) dist = masked_fill(dist, unsqueeze(eq(arange(C, TensorOptions(DType::Int64, x.device())),
                                                           static_cast<double>(q.skip)), 0), 0.0);
      const Tensor per_row = where(unsqueeze(counted, 1), sub(mul(softmax(x, 1), q.total), dist), 0.0);
      return TensorList{mul(per_row, mul(g, scale))};
    }
    Tensor gs = kernels::binary("cross_entropy", kernels::Binary::Mul, scale, g);
    return TensorList{kernels::cross_entropy_backward(sx.get(), st.get(), lse, smoothing, ignore_index, gs)};
  });
}

namespace {
Tensor reduced(const Tensor& loss, Reduction reduction) { return reduction == Reduction::Sum ? sum(loss) : mean(loss); }
void check_floating(const char* op, const Tensor& a, const Tensor& b) {
  TP_CHECK(is_floating(a.dtype()) && is_floating(b.dtype()), "{}: expected float tensors, got {} {} and {} {}", op,
           a.dtype(), a.sizes(), b.dtype(), b.sizes());
}
}  // namespace

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  check_floating("mse_loss", input, target);
  const Tensor d = sub(input, target);
  return reduced(mul(d, d), reduction);
}

Tensor l1_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  check_floating("l1_loss", input, target);
  return reduced(abs(sub(input, target)), reduction);
}

Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, Reduction reduction, double beta) {
  check_floating("smooth_l1_loss", input, target);
  TP_CHECK(beta >= 0, "smooth_l1_loss: beta must be at least 0, got {}", beta);
  const Tensor diff = sub(input, target), d = abs(diff);
  if (beta == 0) return reduced(d, reduction);
  // The quadratic branch on the difference clamped to [-beta, beta]: where it is not taken its
  // gradient is 0, and never 0 * inf = NaN at an infinite difference. Signed, not |d|, so that its
  // second derivative at d = 0 is 1 / beta, as PyTorch's (|d|'s is 0 there).
  const Tensor q = clamp(diff, -beta, beta);
  return reduced(where(lt(d, beta), mul(mul(q, q), 0.5 / beta), sub(d, 0.5 * beta)), reduction);
}

Tensor huber_loss(const Tensor& input, const Tensor& target, Reduction reduction, double delta) {
  check_floating("huber_loss", input, target);
  TP_CHECK(delta > 0, "huber_loss: delta must be positive, got {}", delta);
  const Tensor diff = sub(input, target), d = abs(diff), q = clamp(diff, -delta, delta);  // q: as smooth_l1_loss's
  return reduced(where(lt(d, delta), mul(mul(q, q), 0.5), mul(sub(d, 0.5 * delta), delta)), reduction);
}

Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target, Reduction reduction) {
  check_floating("binary_cross_entropy_with_logits", logits, target);
  TP_CHECK(logits.sizes() == target.sizes(), "binary_cross_entropy_with_logits: the target's shape {} must be the "
           "logits' {}", target.sizes(), logits.sizes());
  return reduced(add(mul(rsub(target, 1.0), logits), softplus(neg(logits))), reduction);
}

}  // namespace tapestry
