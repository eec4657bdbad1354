// Optimizer implementations (see optimizer.h).
#include "tapestry/optim/optimizer.h"

#include <cmath>

#include "tapestry/nn/safetensors.h"
#include "tapestry/ops/cpu/loops.h"
#include "tapestry/ops/profile.h"

namespace tapestry::optim {

Optimizer::Optimizer(std::vector<Tensor> params, double lr) : params_(std::move(params)), lr_(lr) {
  TP_CHECK(lr >= 0, "optimizer: learning rate must be non-negative, got {}", lr);
  for (size_t i = 0; i < params_.size(); ++i) {
    // A frozen parameter (requires_grad off) is allowed: it never has a gradient, so step skips it.
    TP_CHECK(params_[i].defined() && params_[i].is_leaf(), "optimizer: parameter {} must be a leaf tensor", i);
    TP_CHECK(params_[i].is_contiguous(), "optimizer: parameter {} (shape {}) must be contiguous", i,
             params_[i].sizes());
  }
}

void Optimizer::zero_grad() {
  for (Tensor& p : params_) p.zero_grad();
}

std::vector<Tensor>& Optimizer::buffer(const std::string& name) {
  auto& buf = buffers_[name];
  if (buf.empty())
    for (const Tensor& p : params_) buf.push_back(zeros(p.sizes(), p.dtype()));
  return buf;
}

nn::NamedTensors Optimizer::state_dict() const {
  nn::NamedTensors out;
  out.emplace_back("step", scalar_tensor(static_cast<double>(steps_), DType::Int64));
  out.emplace_back("lr", scalar_tensor(lr_, DType::Float64));
  for (auto& [name, buf] : buffers_)
    for (size_t i = 0; i < buf.size(); ++i) out.emplace_back(fmt::format("{}.{}", name, i), buf[i]);
  return out;
}

void Optimizer::load_state_dict(const std::map<std::string, Tensor>& state) {
  auto get = [&](const std::string& name) {
    auto it = state.find(name);
    TP_CHECK(it != state.end(), "optimizer load_state_dict: '{}' is missing from the state", name);
    return it->second;
  };
  int64_t steps = get("step").item<int64_t>();
  double lr = get("lr").item<double>();
  std::map<std::string, std::vector<Tensor>> buffers;
  for (auto& [key, t] : state) {
    if (key == "step" || key == "lr") continue;
    auto dot = key.rfind('.');
    TP_CHECK(dot != std::string::npos, "optimizer load_state_dict: unexpected entry '{}'", key);
    size_t idx = 0;
    try {
      idx = std::stoul(key.substr(dot + 1));
    } catch (const std::exception&) {
      throw Error(fmt::format("optimizer load_state_dict: unexpected entry '{}'", key));
    }
    TP_CHECK(idx < params_.size(), "optimizer load_state_dict: '{}' refers to parameter {} but there are {}", key, idx,
             params_.size());
    TP_CHECK(t.sizes() == params_[idx].sizes() && t.dtype() == params_[idx].dtype(),
             "optimizer load_state_dict: '{}' is {} {} but parameter {} is {} {}", key, t.dtype(), t.sizes(), idx,
             params_[idx].dtype(), params_[idx].sizes());
    auto& buf = buffers[key.substr(0, dot)];
    buf.resize(params_.size());
    buf[idx] = t.clone().detach();
  }
  for (auto& [name, buf] : buffers)
    for (size_t i = 0; i < buf.size(); ++i)
      TP_CHECK(buf[i].defined(), "optimizer load_state_dict: '{}.{}' is missing from the state", name, i);
  steps_ = steps;
  lr_ = lr;
  buffers_ = std::move(buffers);
}

void Optimizer::save(const std::string& path) const { nn::save_safetensors(path, state_dict()); }

void Optimizer::load(const std::string& path) { load_state_dict(nn::load_safetensors(path).as_map()); }

SGD::SGD(std::vector<Tensor> params, SGDOptions o) : Optimizer(std::move(params), o.lr), options(o) {
  TP_CHECK(o.momentum >= 0 && o.weight_decay >= 0, "SGD: momentum and weight_decay must be non-negative");
  TP_CHECK(!o.nesterov || o.momentum > 0, "SGD: nesterov needs a positive momentum");
}

void SGD::step() {
  NoGradGuard no_grad;
  ++steps_;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor p = params_[i], g = p.grad();
    if (!g.defined()) continue;
    Tensor d = options.weight_decay != 0 ? g + p * options.weight_decay : g;
    if (options.momentum != 0) {
      Tensor& buf = buffer("momentum_buffer")[i];
      if (steps_ == 1) buf.copy_(d);
      else buf.mul_(options.momentum).add_(d);
      d = options.nesterov ? d + buf * options.momentum : buf;
    }
    p.add_(d, -lr_);
  }
}

Adam::Adam(std::vector<Tensor> params, AdamOptions o) : Optimizer(std::move(params), o.lr), options(o) {
  TP_CHECK(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, "Adam: betas must be in [0, 1), got ({}, {})",
           o.beta1, o.beta2);
  TP_CHECK(o.eps >= 0 && o.weight_decay >= 0, "Adam: eps and weight_decay must be non-negative");
}

AdamW::AdamW(std::vector<Tensor> params, AdamOptions o) : Adam(std::move(params), o) { decoupled_ = true; }

void Adam::step() {
  TP_PROFILE("Adam.step");
  NoGradGuard no_grad;
  ++steps_;
  const double b1 = options.beta1, b2 = options.beta2, wd = options.weight_decay;
  const double step_size = lr_ / (1.0 - std::pow(b1, static_cast<double>(steps_)));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(b2, static_cast<double>(steps_)));
  auto& m_all = buffer("exp_avg");
  auto& v_all = buffer("exp_avg_sq");
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor p = params_[i], g = p.grad();
    if (!g.defined()) continue;
    g = g.contiguous();
    Tensor m = m_all[i], v = v_all[i];
    dispatch_floating(p.dtype(), "Adam", [&](auto tag) {
      using T = typename decltype(tag)::type;
      T* pp = p.data_ptr<T>();
      const T* pg = g.data_ptr<T>();
      T* pm = m.data_ptr<T>();
      T* pv = v.data_ptr<T>();
      const T tb1 = static_cast<T>(b1), tb2 = static_cast<T>(b2), twd = static_cast<T>(wd);
      const T decay = static_cast<T>(1.0 - lr_ * wd), ss = static_cast<T>(step_size), bc = static_cast<T>(bc2_sqrt);
      const T teps = static_cast<T>(options.eps);
      const bool decoupled = decoupled_;
      // One pass: the same operations, in the same order, as PyTorch's single-tensor Adam.
      cpu::parallel_for(0, p.numel(), cpu::kGrainSize, [&](int64_t b, int64_t e) {
        for (int64_t j = b; j < e; ++j) {
          T grad = pg[j];
          if (decoupled) pp[j] *= decay;
          else if (wd != 0) grad += twd * pp[j];
          pm[j] = pm[j] * tb1 + grad * (T(1) - tb1);
          pv[j] = pv[j] * tb2 + grad * grad * (T(1) - tb2);
          pp[j] -= ss * pm[j] / (std::sqrt(pv[j]) / bc + teps);
        }
      });
    });
    p.impl().storage->version++;
  }
}

double global_norm(const std::vector<Tensor>& tensors) {
  NoGradGuard no_grad;
  double total = 0;
  for (const Tensor& t : tensors) {
    Tensor t64 = t.to(DType::Float64);
    total += sum(t64 * t64).item<double>();
  }
  return std::sqrt(total);
}

double grad_norm(const std::vector<Tensor>& params) {
  std::vector<Tensor> grads;
  for (const Tensor& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  return global_norm(grads);
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  NoGradGuard no_grad;
  double norm = grad_norm(params);
  double coef = max_norm / (norm + 1e-6);
  if (coef < 1)
    for (const Tensor& p : params) {
      Tensor g = p.grad();
      if (g.defined()) g.mul_(coef);
    }
  return norm;
}

NoamSchedule::NoamSchedule(int64_t d, int64_t w, double f) : d_model(d), warmup(w), factor(f) {
  TP_CHECK(d > 0 && w > 0, "NoamSchedule: d_model and warmup must be positive, got {} and {}", d, w);
}

double NoamSchedule::lr(int64_t step) const {
  double s = static_cast<double>(std::max<int64_t>(step, 1));
  return factor * std::pow(static_cast<double>(d_model), -0.5) *
         std::min(std::pow(s, -0.5), s * std::pow(static_cast<double>(warmup), -1.5));
}

InverseSqrtSchedule::InverseSqrtSchedule(double peak, int64_t w) : peak_lr(peak), warmup(w) {
  TP_CHECK(peak > 0 && w > 0, "InverseSqrtSchedule: peak_lr and warmup must be positive");
}

double InverseSqrtSchedule::lr(int64_t step) const {
  double s = static_cast<double>(std::max<int64_t>(step, 1)), w = static_cast<double>(warmup);
  return s < w ? peak_lr * s / w : peak_lr * std::sqrt(w / s);
}

}  // namespace tapestry::optim
