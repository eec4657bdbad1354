// Module registration, traversal, train/eval, and state save/load.
#include "tapestry/nn/module.h"

#include <set>

#include "tapestry/nn/safetensors.h"

namespace tapestry::nn {

void Module::check_name(const char* what, const std::string& name) const {
  TP_CHECK(!name.empty() && name.find('.') == std::string::npos,
           "Module::{}: name '{}' must be non-empty and contain no '.'", what, name);
  bool taken = false;
  for (auto& e : params_) taken = taken || e.name == name;
  for (auto& e : buffers_) taken = taken || e.name == name;
  for (auto& [n, m] : children_) taken = taken || n == name;
  TP_CHECK(!taken, "Module::{}: '{}' is already registered", what, name);
}

Tensor Module::register_parameter(const std::string& name, Tensor value, bool requires_grad) {
  check_name("register_parameter", name);
  if (requires_grad && !value.requires_grad()) value = value.detach().requires_grad_();
  params_.push_back({name, value, nullptr});
  return value;
}

Tensor& Module::register_parameter(const std::string& name, Tensor& member, Tensor value, bool requires_grad) {
  member = register_parameter(name, std::move(value), requires_grad);
  params_.back().member = &member;
  return member;
}

void Module::tie_parameter(const std::string& name, const Tensor& shared) {
  for (auto& e : params_) {
    if (e.name != name) continue;
    TP_CHECK(e.member, "{}: tie_parameter('{}'): the parameter was registered without its member, so the module "
             "would go on computing with its old tensor; register it with register_parameter(name, member, value)",
             describe("Module"), name);
    TP_CHECK(shared.defined() && shared.sizes() == e.value.sizes() && shared.dtype() == e.value.dtype(),
             "{}: tie_parameter('{}'): the parameter is {} {}, the shared tensor {}", describe("Module"), name,
             e.value.dtype(), e.value.sizes(),
             shared.defined() ? fmt::format("{} {}", shared.dtype(), shared.sizes()) : std::string("undefined"));
    TP_CHECK(shared.requires_grad() && shared.is_leaf(), "{}: tie_parameter('{}'): the shared tensor must be a "
             "parameter (a leaf that requires grad)", describe("Module"), name);
    e.value = shared;
    *e.member = shared;
    return;
  }
  throw Error(fmt::format("{}: tie_parameter: no parameter named '{}'", describe("Module"), name));
}

std::string Module::describe(const char* type) const {
  return path_.empty() ? std::string(type) : fmt::format("{} '{}'", type, path_);
}

// A module registered twice (a shared embedding) keeps the path of its first registration.
void Module::set_path(const std::string& path) {
  path_ = path;
  std::set<const Module*> seen;
  for (auto& [n, m] : children_)
    if (m->parent_ == this && seen.insert(m.get()).second) m->set_path(path + "." + n);
}

Module& Module::to(DType dtype) {
  TP_CHECK(is_floating(dtype), "Module::to: {} is not a floating-point dtype", dtype);
  NoGradGuard no_grad;
  for (auto& [name, t] : state_dict()) {
    if (!is_floating(t.dtype()) || t.dtype() == dtype) continue;
    TP_CHECK(t.is_leaf(), "Module::to: '{}' is not a leaf", name);
    Tensor converted = t.to(dtype).contiguous();
    TensorImpl& impl = t.impl();  // in place: every handle to this tensor (ties, members) follows
    impl.storage = converted.impl().storage;
    impl.shape = converted.sizes();
    impl.strides = converted.strides();
    impl.offset = converted.offset();
    impl.dtype = dtype;
    // The gradient follows, as PyTorch's model.double() converts .grad (a graph through the old
    // tensor is gone: the accumulator is rebuilt at the next use).
    if (impl.grad) impl.grad = Tensor(impl.grad).to(dtype).contiguous().impl_ptr();
    impl.grad_accumulator.reset();
  }
  return *this;
}

Device Module::device() const {
  std::vector<Tensor> params = parameters();
  return params.empty() ? Device::CPU : params.front().device();
}

Module& Module::to(Device device) {
  NoGradGuard no_grad;
  for (auto& [name, t] : state_dict()) {
    if (t.device() == device) continue;
    TP_CHECK(t.is_leaf(), "Module::to: '{}' is not a leaf", name);
    Tensor moved = t.to(device).contiguous();
    TensorImpl& impl = t.impl();  // in place, as to(DType)
    impl.storage = moved.impl().storage;
    impl.shape = moved.sizes();
    impl.strides = moved.strides();
    impl.offset = moved.offset();
    if (impl.grad) impl.grad = Tensor(impl.grad).to(device).contiguous().impl_ptr();  // as to(DType)
    impl.grad_accumulator.reset();
  }
  return *this;
}


Tensor Module::register_buffer(const std::string& name, Tensor value) {
  check_name("register_buffer", name);
  buffers_.push_back({name, value, nullptr});
  return value;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  check_name("register_module", name);
  TP_CHECK(module != nullptr, "Module::register_module: '{}' is null", name);
  module->train(training_);
  module->set_checkpointing(checkpointing_);
  if (!module->parent_) {
    module->parent_ = this;
    module->set_path(path_.empty() ? name : path_ + "." + name);
  }
  children_.emplace_back(name, std::move(module));
}

void Module::collect(const std::string& prefix, bool recurse, bool params, NamedTensors& out) const {
  for (auto& e : params ? params_ : buffers_) out.emplace_back(prefix + e.name, e.value);
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

std::vector<Tensor> Module::trainable_parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters())
    if (t.requires_grad()) out.push_back(t);
  return out;
}

int64_t Module::num_trainable_parameters() const {
  int64_t n = 0;
  for (const Tensor& t : trainable_parameters()) n += t.numel();
  return n;
}

Module& Module::apply(const std::function<void(Module&)>& fn) {
  // A module registered under two names (a tied embedding) is visited once, as in PyTorch.
  std::set<const Module*> seen;
  std::function<void(Module&)> visit = [&](Module& m) {
    if (!seen.insert(&m).second) return;
    for (auto& [name, child] : m.children_) visit(*child);
    fn(m);
  };
  visit(*this);
  return *this;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, m] : children_) m->train(on);
}

void Module::set_checkpointing(bool on) {
  checkpointing_ = on;
  for (auto& [n, m] : children_) m->set_checkpointing(on);
}

bool Module::checkpoint_blocks() const { return checkpointing_ && training_ && GradMode::is_enabled(); }

void Module::zero_grad() {
  for (auto& [n, t] : named_parameters()) t.zero_grad();
}

NamedTensors Module::state_dict() const {
  NamedTensors out = named_parameters();
  for (auto& kv : named_buffers()) out.push_back(kv);
  return out;
}

std::map<std::string, Tensor> state_map(const char* op, const NamedTensors& state) {
  std::map<std::string, Tensor> by_name;
  for (const auto& [name, t] : state)
    TP_CHECK(by_name.emplace(name, t).second, "{}: the state names '{}' twice", op, name);
  return by_name;
}

LoadResult Module::load_state_dict(const NamedTensors& state, bool strict) {
  return load_state_dict(state_map("load_state_dict", state), strict);
}

LoadResult Module::load_state_dict(std::initializer_list<std::pair<const std::string, Tensor>> state, bool strict) {
  return load_state_dict(NamedTensors(state.begin(), state.end()), strict);
}

LoadResult Module::load_state_dict(const std::map<std::string, Tensor>& state, bool strict) {
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
  return {missing, unexpected};
}

void Module::save(const std::string& path, const std::map<std::string, std::string>& metadata) const {
  save_safetensors(path, state_dict(), metadata);
}

LoadResult Module::load(const std::string& path, bool strict) {
  return load_state_dict(load_safetensors(path).as_map(), strict);
}

}  // namespace tapestry::nn
