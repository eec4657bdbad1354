// Module: the base of every layer and model, in libtorch's shape. A module owns named
// parameters, buffers and submodules, registered in order; names nest with dots
// ("encoder.0.self_attn.w_q.weight") and match the PyTorch reference model exactly, so
// loading a checkpoint is a name lookup. State is saved as safetensors (nn/safetensors.h).
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tapestry/autograd/checkpoint.h"
#include "tapestry/autograd/functions.h"

namespace tapestry::nn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
// The same as a map by name, for load_state_dict; a name given twice is refused, naming `op`.
std::map<std::string, Tensor> state_map(const char* op, const NamedTensors& state);

// What load_state_dict(strict = false) skipped: the model's names the state lacked, and the
// state's names the model does not have.
struct LoadResult {
  std::vector<std::string> missing, unexpected;
};

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Parameters require grad and are trained; buffers are state that is saved but not trained.
  // The first form also binds `member`, the field the module computes with, so that
  // tie_parameter can rebind it; layers register their parameters this way.
  Tensor& register_parameter(const std::string& name, Tensor& member, Tensor value, bool requires_grad = true);
  Tensor register_parameter(const std::string& name, Tensor value, bool requires_grad = true);
  Tensor register_buffer(const std::string& name, Tensor value);
  // Weight tying: parameter `name` of this module becomes `shared` (same shape and dtype), both
  // in the registry and in the member the module computes with, so there is one tensor: it gets
  // the gradients of every use and the optimizer moves it once. state_dict() and parameters()
  // list it once, under the name registered first. Refuses a parameter registered without its
  // member (the module would go on computing with its old weight).
  void tie_parameter(const std::string& name, const Tensor& shared);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }

  NamedTensors named_parameters(bool recurse = true) const;
  NamedTensors named_buffers(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  // The parameters that require grad: what an optimizer gets when part of a model is frozen (a
  // LoRA base, nn/lora.h), as PyTorch's filter(lambda p: p.requires_grad, model.parameters()).
  std::vector<Tensor> trainable_parameters() const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const { return children_; }
  int64_t num_parameters() const;  // a tied parameter once (named_parameters lists it once)
  int64_t num_trainable_parameters() const;  // of trainable_parameters()

  // Converts every floating-point parameter and buffer to `dtype` in place: the tensors keep
  // their identity (ties, optimizer handles and members stay valid), their gradients are
  // dropped. Module::to(DType::Float64) makes a whole model gradcheckable. Create optimizers
  // after converting: their moment buffers keep the dtype they were made with.
  Module& to(DType dtype);
  // Moves every parameter and buffer to `device` in place, the same way (identity kept,
  // gradients dropped). Create optimizers after moving: their state lives where the parameters
  // were when they first stepped (loading an optimizer state puts it on the parameters' device).
  Module& to(Device device);
  // Where the parameters are (the first one's device; the CPU for a module without any).
  Device device() const;

  // The dotted path under which this module is registered in its root ("decoder.0.src_attn"),
  // empty for a root; errors name a layer by it (describe()).
  const std::string& path() const { return path_; }
  std::string describe(const char* type) const;

  // Calls fn on every submodule (depth first, children before their parent) and then on this
  // module, as PyTorch's Module.apply: model.apply(init_weights). Returns this module.
  Module& apply(const std::function<void(Module&)>& fn);

  // train() turns dropout on (the default); eval() turns it off. Applies to every submodule.
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Activation checkpointing (autograd/checkpoint.h): the zoo's models then run each block of
  // their stacks through checkpoint() while training, keeping one block's activations at a time
  // during backward, for one more forward of compute. Applies to every submodule, as train().
  void set_checkpointing(bool on = true);
  bool checkpointing() const { return checkpointing_; }
  // Whether a stack's blocks go through checkpoint() now: checkpointing, training, grad mode on.
  bool checkpoint_blocks() const;
  void zero_grad();

  // Parameters then buffers, each under its full dotted name; a tensor shared under two names
  // (tied weights) appears once, under the first name registered.
  NamedTensors state_dict() const;
  // Copies values into this module's tensors (which keep their identity). With strict, every
  // name must match both ways; shapes and dtypes must always match. The error lists every
  // missing, unexpected and mismatched name. Without strict, returns the names it skipped.
  LoadResult load_state_dict(const std::map<std::string, Tensor>& state, bool strict = true);
  // The same from state_dict()'s own form (load_state_dict(other.state_dict()) as in PyTorch) or a
  // braced list; a name given twice is refused.
  LoadResult load_state_dict(const NamedTensors& state, bool strict = true);
  LoadResult load_state_dict(std::initializer_list<std::pair<const std::string, Tensor>> state, bool strict = true);
  // Safetensors file; written to a temp file then renamed, so a crash never leaves half a file.
  void save(const std::string& path, const std::map<std::string, std::string>& metadata = {}) const;
  LoadResult load(const std::string& path, bool strict = true);

 protected:
  void add_child(const std::string& name, std::shared_ptr<Module> module);

 private:
  struct Entry {
    std::string name;
    Tensor value;
    Tensor* member = nullptr;  // the field the module computes with, when registered with it
  };
  void collect(const std::string& prefix, bool recurse, bool params, NamedTensors& out) const;
  void check_name(const char* what, const std::string& name) const;  // valid and not yet taken
  void set_path(const std::string& path);
  std::vector<Entry> params_, buffers_;
  std::string path_;
  const Module* parent_ = nullptr;  // the module it was first registered in
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
  bool checkpointing_ = false;
};

}  // namespace tapestry::nn
