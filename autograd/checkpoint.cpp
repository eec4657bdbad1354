// Activation checkpointing (see checkpoint.h).
#include "tapestry/autograd/checkpoint.h"

#include "tapestry/autograd/node.h"
#include "tapestry/ops/factory.h"

namespace tapestry {

namespace {

// Puts a generator back in the state it had, on every exit.
class GeneratorStateGuard {
 public:
  explicit GeneratorStateGuard(Generator& gen) : gen_(gen), state_(gen.state()) {}
  ~GeneratorStateGuard() { gen_.set_state(state_); }
  GeneratorStateGuard(const GeneratorStateGuard&) = delete;
  GeneratorStateGuard& operator=(const GeneratorStateGuard&) = delete;

 private:
  Generator& gen_;
  std::string state_;
};

}  // namespace

Tensor checkpoint(const std::function<Tensor(const TensorList&)>& fn, const TensorList& inputs) {
  if (!any_requires_grad(inputs)) return fn(inputs);
  // The inputs are saved before fn runs: one it changes in place is then refused in backward
  // (Note [Version counter]) instead of recomputed from the changed values.
  std::vector<SavedTensor> saved;
  std::vector<bool> needs;
  for (const Tensor& t : inputs) {
    saved.emplace_back(t, "CheckpointBackward");
    needs.push_back(t.defined() && t.requires_grad());
  }
  const std::string rng = default_generator().state();
  Tensor out;
  {
    NoGradGuard no_grad;
    out = fn(inputs);
    TP_CHECK(out.defined(), "checkpoint: the function returned an undefined tensor");
    out = out.detach();  // a tensor of its own, even when fn returned an input
  }
  return record("CheckpointBackward", out, inputs, [fn, rng, saved, needs](const Tensor& grad) {
    // The forward again, from the first run's random state; the generator then goes on from
    // where it was, as it would without checkpointing (backward draws nothing).
    GeneratorStateGuard put_back(default_generator());
    default_generator().set_state(rng);
    if (GradMode::is_enabled()) {
      // A recording backward (create_graph): the recomputation runs on the inputs with their
      // history, and its gradient is taken as a recorded function of them.
      TensorList with_history, wanted;
      for (const SavedTensor& s : saved) with_history.push_back(s.get());
      for (size_t i = 0; i < saved.size(); ++i)
        if (needs[i]) wanted.push_back(with_history[i]);
      Tensor y = fn(with_history);
      TP_CHECK(y.defined() && y.sizes() == grad.sizes(), "checkpoint: the recomputation returned shape {}, the first "
               "run {}: the function must be deterministic", y.defined() ? y.sizes() : Shape{}, grad.sizes());
      TensorList grads(saved.size());
      if (!y.requires_grad()) return grads;
      TensorList got = run_grad({y}, wanted, {grad}, true, true, true);
      for (size_t i = 0, w = 0; i < saved.size(); ++i)
        if (needs[i]) grads[i] = got[w++];
      return grads;
    }
    TensorList detached;
    for (size_t i = 0; i < saved.size(); ++i) {
      Tensor d = saved[i].get();
      if (d.defined()) d = d.detach();
      if (needs[i]) d.requires_grad_();
      detached.push_back(d);
    }
    Tensor y;
    {
      EnableGradGuard grad_on;
      y = fn(detached);
    }
    TP_CHECK(y.defined() && y.sizes() == grad.sizes(), "checkpoint: the recomputation returned shape {}, the first "
             "run {}: the function must be deterministic", y.defined() ? y.sizes() : Shape{}, grad.sizes());
    if (y.requires_grad()) run_backward(y, grad, false);
    TensorList grads(saved.size());
    for (size_t i = 0; i < saved.size(); ++i)
      if (needs[i]) grads[i] = detached[i].grad();
    return grads;
  });
}

}  // namespace tapestry
