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

#include "tapestry/autograd/functions.h"

namespace tapestry::nn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Parameters require grad and are trained; buffers are state that is saved but not trained.
  Tensor register_parameter(const std::string& name, Tensor value, bool requires_grad = true);
  Tensor register_buffer(const std::string& name, Tensor value);
  // Points an already registered parameter at another tensor (weight tying); returns it.
  Tensor replace_parameter(const std::string& name, Tensor value);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }

  NamedTensors named_parameters(bool recurse = true) const;
  NamedTensors named_buffers(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const { return children_; }
  int64_t num_parameters() const;

  // train() turns dropout on (the default); eval() turns it off. Applies to every submodule.
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  void zero_grad();

  // Parameters then buffers, each under its full dotted name; a tensor shared under two names
  // (tied weights) appears once, under the first name registered.
  NamedTensors state_dict() const;
  // Copies values into this module's tensors (which keep their identity). With strict, every
  // name must match both ways; shapes and dtypes must always match. The error lists every
  // missing, unexpected and mismatched name.
  void load_state_dict(const std::map<std::string, Tensor>& state, bool strict = true);
  // Safetensors file; written to a temp file then renamed, so a crash never leaves half a file.
  void save(const std::string& path, const std::map<std::string, std::string>& metadata = {}) const;
  void load(const std::string& path, bool strict = true);

 protected:
  void add_child(const std::string& name, std::shared_ptr<Module> module);

 private:
  void collect(const std::string& prefix, bool recurse, bool params, NamedTensors& out) const;
  void check_name(const char* what, const std::string& name) const;  // valid and not yet taken
  NamedTensors params_, buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

}  // namespace tapestry::nn
