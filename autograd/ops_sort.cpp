// Sorting, scans and triangles: tril / triu (backward: the same triangle of the gradient),
// cumsum (backward: the cumulative sum of the gradient taken from the end), sort / argsort /
// topk (backward: each value's gradient goes back to its index) and multinomial (not
// differentiable). Forward and backward of each together.
#include "tapestry/autograd/functions.h"
#include "tapestry/ops/detail/kernels.h"

namespace tapestry {

namespace {

Tensor triangle_op(const char* op, const char* node, const Tensor& a, int64_t diagonal, bool upper) {
  Tensor out = kernels::triangle(op, a, diagonal, upper);
  if (!any_requires_grad({a})) return out;
  return record(node, out, {a}, [op, node, diagonal, upper](const Tensor& g) {
    return TensorList{triangle_op(op, node, g, diagonal, upper)};  // self-adjoint: records in a recording backward
  });
}

// values[..., j, ...] = a[..., indices[..., j, ...], ...] along dim: the backward adds each
// value's gradient at its index (zeros elsewhere), as for max with indices.
ValuesIndices selected_along(const char* node, const Tensor& a, int64_t dim, Tensor values, Tensor indices) {
  if (!any_requires_grad({a})) return {values, indices};
  Shape in = a.sizes();
  SavedTensor idx(indices, node);
  values = record(node, values, {a}, [in, dim, idx](const Tensor& g) {
    const Tensor i = idx.get();
    return TensorList{linear_in_grad("SortBackwardBackward", kernels::scatter(in, dim, i, g, true), g,
                                     [dim, i](const Tensor& gg) { return gather(gg, dim, i); })};
  });
  return {values, indices};
}

}  // namespace

Tensor tril(const Tensor& a, int64_t diagonal) { return triangle_op("tril", "TrilBackward", a, diagonal, false); }
Tensor triu(const Tensor& a, int64_t diagonal) { return triangle_op("triu", "TriuBackward", a, diagonal, true); }

Tensor cumsum(const Tensor& a, int64_t dim) {
  dim = wrap_dim("cumsum", dim, a.dim());
  Tensor out = kernels::cumsum(a, dim);
  if (!any_requires_grad({a})) return out;
  return record("CumsumBackward", out, {a}, [dim](const Tensor& g) {
    return TensorList{linear_in_grad("CumsumBackwardBackward", kernels::cumsum(g, dim, /*reverse=*/true), g,
                                     [dim](const Tensor& gg) { return cumsum(gg, dim); })};
  });
}

ValuesIndices sort(const Tensor& a, int64_t dim, bool descending, bool stable) {
  dim = wrap_dim("sort", dim, a.dim());
  std::pair<Tensor, Tensor> r = kernels::sort(a, dim, descending, stable);
  return selected_along("SortBackward", a, dim, r.first, r.second);
}

Tensor argsort(const Tensor& a, int64_t dim, bool descending) {
  dim = wrap_dim("argsort", dim, a.dim());
  return kernels::sort(a, dim, descending, true).second;
}

ValuesIndices topk(const Tensor& a, int64_t k, int64_t dim, bool largest, bool sorted) {
  dim = wrap_dim("topk", dim, a.dim());
  std::pair<Tensor, Tensor> r = kernels::topk(a, k, dim, largest, sorted);
  return selected_along("TopkBackward", a, dim, r.first, r.second);
}

Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement, Generator* gen) {
  return kernels::multinomial(probs, num_samples, replacement, (gen ? *gen : default_generator()).engine());
}

}  // namespace tapestry
