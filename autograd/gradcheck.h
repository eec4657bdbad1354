// gradcheck: compares the analytic gradient of f (one backward pass with a random upstream
// gradient v) against central finite differences of <f(x), v>, element by element, in float64.
// Throws a tapestry::Error naming the input, the element and both values on any mismatch.
#pragma once
#include <functional>

#include "tapestry/ops/tensor.h"

namespace tapestry {

struct GradcheckOptions {
  double eps = 1e-6;   // finite-difference step
  double atol = 1e-5;  // pass when |analytic - numeric| <= atol + rtol * |numeric|
  double rtol = 1e-3;
  uint64_t seed = 0;   // for the random upstream gradient
};

// inputs: float64 leaves with requires_grad; they may be non-contiguous views, but no element may
// be shared (no expanded dims). Returns true on success.
bool gradcheck(const std::function<Tensor(const TensorList&)>& f, const TensorList& inputs,
               const GradcheckOptions& options = {});

// As torch.autograd.gradgradcheck: gradcheck of the gradient itself. With a random upstream v
// (float64, a leaf that requires grad), the function (inputs, v) -> d<f(inputs), v>/d inputs,
// computed by a backward that records (create_graph), is gradcheck'ed against finite
// differences: every second derivative of f, and the first one's linearity in v.
bool gradgradcheck(const std::function<Tensor(const TensorList&)>& f, const TensorList& inputs,
                   const GradcheckOptions& options = {});

}  // namespace tapestry
