// matmul with torch.matmul's rules: 1-D operands are promoted to matrices (and the added dim
// removed from the result), batch dims broadcast. The kernel reads transposed and strided
// operands in place, so the backward's transposes cost no copies.
#include "autograd/functions.h"
#include "ops/kernels.h"

namespace tapestry {

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
  Tensor out = kernels::matmul(a, b);
  if (!any_requires_grad({a, b})) return out;
  bool need_a = a.requires_grad(), need_b = b.requires_grad();
  SavedTensor sa(need_b ? a : Tensor(), "MmBackward"), sb(need_a ? b : Tensor(), "MmBackward");
  // dA = g @ B^T, dB = A^T @ g (the engine sums broadcast batch dims back)
  return record("MmBackward", out, {a, b}, [sa, sb, need_a, need_b](const Tensor& g) {
    return TensorList{need_a ? kernels::matmul(g, transpose(sb.get(), -1, -2)) : Tensor(),
                      need_b ? kernels::matmul(transpose(sa.get(), -1, -2), g) : Tensor()};
  });
}

}  // namespace tapestry
