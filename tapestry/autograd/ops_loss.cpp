// Losses. cross_entropy keeps only the logits (already alive as the generator's output) and one
// log-sum-exp per row for backward: the (tokens x vocab) probabilities are never stored.
#include "tapestry/autograd/functions.h"
#include "tapestry/ops/kernels.h"

namespace tapestry {

Tensor cross_entropy(const Tensor& logits, const Tensor& target, double smoothing, int64_t ignore_index,
                     Reduction reduction) {
  auto r = kernels::cross_entropy(logits, target, smoothing, ignore_index);
  double scale = reduction == Reduction::Mean ? (r.count > 0 ? 1.0 / static_cast<double>(r.count) : 0.0) : 1.0;
  Tensor loss = kernels::binary("cross_entropy", kernels::Binary::Mul, r.loss_sum, scalar_tensor(scale, logits.options()));
  if (!any_requires_grad({logits})) return loss;
  SavedTensor sx(logits, "CrossEntropyBackward"), st(target, "CrossEntropyBackward");
  Tensor lse = r.lse;
  return record("CrossEntropyBackward", loss, {logits}, [sx, st, lse, smoothing, ignore_index, scale](const Tensor& g) {
    double gs = scale * g.item<double>();
    return TensorList{kernels::cross_entropy_backward(sx.get(), st.get(), lse, smoothing, ignore_index, gs)};
  });
}

}  // namespace tapestry
