// Module registration, traversal, train/eval, and state save/load.
#include "tapestry/nn/module.h"

#include <set>

#include "tapestry/nn/safetensors.h"

namespace tapestry::nn {

void Module::check_name(const char* what, const std::string& name) const {
  TP_CHECK(!name.empty() && name.find('.') == std::string::npos,
           "Module::{}: name '{}' must be non-empty and contain no '.'", what, name);
  bool taken = false;
  for (auto& [n, t] : params_) taken = taken || n == name;
  for (auto& [n, t] : buffers_) taken = taken || n == name;
  for (auto& [n, m] : children_) taken = taken || n == name;
  TP_CHECK(!taken, "Module::{}: '{}' is already registered", what, name);
}

Tensor Module::register_parameter(const std::string& name, Tensor value, bool requires_grad) {
  check_name("register_parameter", name);
  if (requires_grad && !value.requires_grad()) value = value.detach().requires_grad_();
  params_.emplace_back(name, value);
  return value;
}

Tensor Module::replace_parameter(const std::string& name, Tensor value) {
  for (auto& [n, t] : params_)
    if (n == name) {
      t = value;
      return value;
    }
  throw Error(fmt::format("Module::replace_parameter: no parameter named '{}'", name));
}

Tensor Module::register_buffer(const std::string& name, Tensor value) {
  check_name("register_buffer", name);
  buffers_.emplace_back(name, value);
  return value;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  check_name("register_module", name);
  TP_CHECK(module != nullptr, "Module::register_module: '{}' is null", name);
  module->train(training_);
  children_.emplace_back(name, std::move(module));
}

void Module::collect(const std::string& prefix, bool recurse, bool params, NamedTensors& out) const {
  for (auto& [n, t] : params ? params_ : buffers_) out.emplace_back(prefix + n, t);
  if (!recurse) return;
  for (auto& [n, m] : children_) m->collect(prefix + n + ".", true, params, out);
}

// Tied weights are registered under two names; keep the first so each tensor appears once.
static NamedTensors dedupe(NamedTensors all) {
  NamedTensors out;
  std::set<const TensorImpl*> seen;
  for (auto& [n, t] : all)
    if (seen.insert(t.impl_ptr().get()).second) out.emplace_back(n, t);
  return out;
}

NamedTensors Module::named_parameters(bool recurse) const {
  NamedTensors out;
  collect("", recurse, true, out);
  return dedupe(std::move(out));
}

NamedTensors Module::named_buffers(bool recurse) const {
  NamedTensors out;
  collect("", recurse, false, out);
  return dedupe(std::move(out));
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& [name, t] : named_parameters()) n += t.numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, m] : children_) m->train(on);
}

void Module::zero_grad() {
  for (auto& [n, t] : named_parameters()) t.zero_grad();
}

NamedTensors Module::state_dict() const {
  NamedTensors out = named_parameters();
  for (auto& kv : named_buffers()) out.push_back(kv);
  return out;
}

void Module::load_state_dict(const std::map<std::string, Tensor>& state, bool strict) {
  NamedTensors mine = state_dict();
  std::vector<std::string> missing, unexpected, mismatched;
  std::set<std::string> names;
  for (auto& [n, t] : mine) {
    names.insert(n);
    auto it = state.find(n);
    if (it == state.end()) {
      missing.push_back(n);
    } else if (it->second.sizes() != t.sizes() || it->second.dtype() != t.dtype()) {
      mismatched.push_back(fmt::format("{}: checkpoint has {} {}, model has {} {}", n, it->second.dtype(),
                                       it->second.sizes(), t.dtype(), t.sizes()));
    }
  }
  for (auto& [n, t] : state)
    if (!names.count(n)) unexpected.push_back(n);
  bool bad = !mismatched.empty() || (strict && (!missing.empty() || !unexpected.empty()));
  if (bad) {
    std::string msg = "load_state_dict: the checkpoint does not fit this model";
    if (!mismatched.empty()) msg += fmt::format("\n  shape/dtype mismatch: {}", fmt::join(mismatched, "; "));
    if (!missing.empty()) msg += fmt::format("\n  missing in checkpoint: {}", fmt::join(missing, ", "));
    if (!unexpected.empty()) msg += fmt::format("\n  unexpected in checkpoint: {}", fmt::join(unexpected, ", "));
    throw Error(msg);
  }
  NoGradGuard no_grad;
  for (auto& [n, t] : mine) {
    auto it = state.find(n);
    if (it != state.end()) Tensor(t).copy_(it->second);
  }
}

void Module::save(const std::string& path, const std::map<std::string, std::string>& metadata) const {
  save_safetensors(path, state_dict(), metadata);
}

void Module::load(const std::string& path, bool strict) { load_state_dict(load_safetensors(path).as_map(), strict); }

}  // namespace tapestry::nn
