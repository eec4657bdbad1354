// swish(x) = x * sigmoid(x) as a user's own differentiable op: one tape node with a hand-written
// backward (record() + SavedTensor). examples/custom_op.cpp trains a model with it;
// tests/test_module_api.cpp gradchecks it and tests its errors.
#pragma once
#include <tapestry/tapestry.h>

// Forward without the tape (NoGradGuard), then one tape node for the whole op. The backward
// closure gets the gradient of the output and returns one gradient per input; it keeps what it
// needs as SavedTensor, which refuses to hand back data an in-place op changed since.
inline tapestry::Tensor swish(const tapestry::Tensor& x) {
  using namespace tapestry;
  Tensor s, out;
  {
    NoGradGuard no_grad;  // the parts are not recorded: swish is one node
    s = x.sigmoid();
    out = x * s;
  }
  if (!any_requires_grad({x})) return out;
  SavedTensor saved_x(x, "SwishBackward"), saved_s(s, "SwishBackward");
  return record("SwishBackward", out, {x}, [saved_x, saved_s](const Tensor& grad) {
    Tensor x = saved_x.get(), s = saved_s.get();
    return TensorList{grad * (s + x * s * (1.0 - s))};  // d/dx x s(x) = s + x s (1 - s)
  });
}
