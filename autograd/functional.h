// Gradients as values, and higher-order derivatives, as torch.autograd.grad and
// torch.autograd.functional. Every function here leaves .grad alone.
//
//   Tensor x = randn({3}, kFloat64).requires_grad_();
//   Tensor y = (x * x * x).sum();
//   Tensor g = autograd::grad({y}, {x}, {}, std::nullopt, /*create_graph=*/true)[0];  // 3 x^2, recorded
//   Tensor h = autograd::grad({g.sum()}, {x})[0];                                      // 6 x
#pragma once
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "tapestry/ops/tensor.h"

namespace tapestry::autograd {

// The gradients of `outputs` (each weighted by its entry of grad_outputs; none given: ones for
// one-element outputs) with respect to `inputs`, as torch.autograd.grad. retain_graph defaults to
// create_graph; with create_graph the results have a history of their own. An input that was not
// used is an Error unless allow_unused (its gradient is then undefined).
TensorList grad(const TensorList& outputs, const TensorList& inputs, const TensorList& grad_outputs = {},
                std::optional<bool> retain_graph = std::nullopt, bool create_graph = false, bool allow_unused = false);

namespace functional {

// A function of several tensors with one tensor as its result.
using Function = std::function<Tensor(const TensorList&)>;

// As torch.autograd.functional: each evaluates func at `inputs` (taken as fresh leaves, so the
// caller's tensors and their .grad are untouched; with create_graph the results stay connected
// to the inputs' history instead) and returns func's output with the derivative asked for.
//   vjp: v^T J, one tensor per input (v: like the output; may be omitted for one-element outputs).
//   jvp: J v (v: one tensor per input), by the double-vjp trick.
//   jacobian: per input, d output / d input, shaped output.shape + input.shape.
//   hessian: for a one-element output, H[i][j] shaped input_i.shape + input_j.shape.
//   hvp: H v, vhp: v^T H (equal for a twice-differentiable func), one tensor per input.
std::pair<Tensor, TensorList> vjp(const Function& func, const TensorList& inputs, const Tensor& v = Tensor(),
                                  bool create_graph = false);
std::pair<Tensor, Tensor> jvp(const Function& func, const TensorList& inputs, const TensorList& v,
                              bool create_graph = false);
TensorList jacobian(const Function& func, const TensorList& inputs, bool create_graph = false);
std::vector<TensorList> hessian(const Function& func, const TensorList& inputs, bool create_graph = false);
std::pair<Tensor, TensorList> hvp(const Function& func, const TensorList& inputs, const TensorList& v,
                                  bool create_graph = false);
std::pair<Tensor, TensorList> vhp(const Function& func, const TensorList& inputs, const TensorList& v,
                                  bool create_graph = false);

}  // namespace functional
}  // namespace tapestry::autograd
