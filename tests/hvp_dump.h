// The zoo's second-order parity (issue 45): a Hessian-vector product of a model's loss at its
// current weights, along a seeded random direction, into a parity dump as "hvpdir.<name>" (the
// direction) and "hvp.<name>" (H v, zeros where the loss does not reach a parameter), for the
// reference scripts to recompute with torch.autograd.grad(create_graph=True)
// (tools/reference/hvp_ref.py).
#pragma once
#include <functional>
#include <string>

#include "tapestry/autograd/functional.h"
#include "tapestry/autograd/functions.h"
#include "tapestry/nn/module.h"

namespace tapestry::testing {

inline void dump_hvp(nn::NamedTensors& dump, const nn::NamedTensors& named, const std::function<Tensor()>& loss_fn,
                     uint64_t seed) {
  Generator gen(seed);
  TensorList params, dirs;
  for (const auto& [name, p] : named) {
    params.push_back(p);
    dirs.push_back(randn(p.sizes(), TensorOptions(p.dtype(), p.device()), &gen));
  }
  const Tensor loss = loss_fn();
  const TensorList g = autograd::grad({loss}, params, {}, true, /*create_graph=*/true, /*allow_unused=*/true);
  Tensor s;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!g[i].defined() || !g[i].requires_grad()) continue;
    const Tensor term = sum(mul(g[i], dirs[i]));
    s = s.defined() ? add(s, term) : term;
  }
  const TensorList hv = autograd::grad({s}, params, {}, false, false, true);
  for (size_t i = 0; i < params.size(); ++i) {
    dump.emplace_back("hvpdir." + named[i].first, dirs[i]);
    dump.emplace_back("hvp." + named[i].first,
                      hv[i].defined() ? hv[i].detach() : zeros(params[i].sizes(), TensorOptions(params[i].dtype())));
  }
}

}  // namespace tapestry::testing
