// Losses. cross_entropy keeps only the logits (already alive as the generator's output) and each
// row's log-sum-exp (its max and log sum, [N, 2]) for backward: the (tokens x vocab) probabilities are never stored.
#include "tapestry/autograd/functions.h"
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
    Tensor gs = kernels::binary("cross_entropy", kernels::Binary::Mul, scale, g);
    return TensorList{kernels::cross_entropy_backward(sx.get(), st.get(), lse, smoothing, ignore_index, gs)};
  });
}

}  // namespace tapestry
