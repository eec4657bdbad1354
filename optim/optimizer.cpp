// Optimizer implementations (see optimizer.h).
#include "tapestry/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <optional>
#include <set>
#include <utility>

#include "tapestry/nn/safetensors.h"
#include "tapestry/ops/detail/kernels.h"
#include "tapestry/ops/profile.h"

namespace tapestry::optim {

Optimizer::Optimizer(std::vector<Tensor> params, double lr, double weight_decay)
    : Optimizer(std::vector<ParamGroup>{ParamGroup{std::move(params), std::nullopt, std::nullopt}}, lr,
                weight_decay) {}

Optimizer::Optimizer(std::vector<ParamGroup> groups, double lr, double weight_decay) : lr_(lr) {
  TP_CHECK(lr >= 0, "optimizer: learning rate must be non-negative, got {}", lr);
  TP_CHECK(weight_decay >= 0, "optimizer: weight_decay must be non-negative, got {}", weight_decay);
  // Each parameter's tensor -> (its flat index, its group), to refuse one listed twice: it would be
  // updated twice per step.
  std::map<const TensorImpl*, std::pair<size_t, size_t>> seen;
  for (size_t g = 0; g < groups.size(); ++g) {
    ParamGroup& pg = groups[g];
    Group gr;
    gr.begin = params_.size();
    if (pg.lr) {
      const double glr = *pg.lr;
      TP_CHECK(glr >= 0, "optimizer: group {} has lr {}; it must be non-negative", g, glr);
      if (lr != 0) {
        gr.lr_ratio = glr / lr;
      } else {
        TP_CHECK(glr == 0, "optimizer: group {} has lr {} but the optimizer's lr is 0, so the group's lr ratio "
                 "(its lr / the optimizer's, which set_lr and schedules scale) is undefined; give the optimizer a "
                 "non-zero lr, or leave the group's lr unset", g, glr);
        gr.lr_ratio = 0;  // stays at 0 whatever set_lr is given
      }
    }
    gr.weight_decay = pg.weight_decay.value_or(weight_decay);
    TP_CHECK(gr.weight_decay >= 0, "optimizer: group {} has weight_decay {}; it must be non-negative", g,
             gr.weight_decay);
    for (Tensor& p : pg.params) {
      const size_t i = params_.size();
      // A frozen parameter (requires_grad off) is allowed: it never has a gradient, so step skips it.
      TP_CHECK(p.defined() && p.is_leaf(), "optimizer: parameter {} must be a leaf tensor", i);
      TP_CHECK(p.is_contiguous(), "optimizer: parameter {} (shape {}) must be contiguous", i, p.sizes());
      auto [it, fresh] = seen.emplace(p.impl_ptr().get(), std::make_pair(i, g));
      TP_CHECK(fresh, "optimizer: parameter {} appears in more than one group: it is the same tensor as parameter {} "
               "(group {} lists it, and group {} already did)", i, it->second.first, g, it->second.second);
      params_.push_back(std::move(p));
    }
    gr.end = params_.size();
    groups_.push_back(gr);
  }
  // As PyTorch's "optimizer got an empty parameter list": usually a model whose parameters were
  // never registered, or a filter that kept none. Empty groups among others are fine.
  TP_CHECK(!params_.empty(), "optimizer: got an empty parameter list ({} group{}, no parameters); did the model "
           "register its parameters (register_parameter / register_module)?", groups.size(),
           groups.size() == 1 ? "" : "s");
}

const Optimizer::Group& Optimizer::group(size_t g) const {
  TP_CHECK(g < groups_.size(), "optimizer: no parameter group {}; there are {}", g, groups_.size());
  return groups_[g];
}

double Optimizer::group_lr(size_t g) const { return lr_ * group(g).lr_ratio; }

double Optimizer::group_lr_ratio(size_t g) const { return group(g).lr_ratio; }

double Optimizer::group_weight_decay(size_t g) const { return group(g).weight_decay; }

std::vector<Tensor> Optimizer::group_params(size_t g) const {
  const Group& gr = group(g);
  return std::vector<Tensor>(params_.begin() + static_cast<std::ptrdiff_t>(gr.begin),
                             params_.begin() + static_cast<std::ptrdiff_t>(gr.end));
}

void Optimizer::zero_grad() {
  for (Tensor& p : params_) p.zero_grad();
}

std::vector<Tensor>& Optimizer::buffer(const std::string& name) {
  auto& buf = buffers_[name];
  if (buf.empty())
    for (const Tensor& p : params_) buf.push_back(zeros(p.sizes(), p.options()));
  return buf;
}

nn::NamedTensors Optimizer::state_dict() const {
  nn::NamedTensors out;
  out.emplace_back("step", scalar_tensor(static_cast<double>(steps_), DType::Int64));
  out.emplace_back("lr", scalar_tensor(lr_, DType::Float64));
  for (size_t g = 0; g < groups_.size(); ++g) {
    out.emplace_back(fmt::format("group.{}.lr_ratio", g), scalar_tensor(groups_[g].lr_ratio, DType::Float64));
    out.emplace_back(fmt::format("group.{}.weight_decay", g), scalar_tensor(groups_[g].weight_decay, DType::Float64));
    out.emplace_back(fmt::format("group.{}.num_params", g),
                     scalar_tensor(static_cast<double>(groups_[g].end - groups_[g].begin), DType::Int64));
  }
  for (auto& [name, buf] : buffers_)
    for (size_t i = 0; i < buf.size(); ++i) out.emplace_back(fmt::format("{}.{}", name, i), buf[i]);
  return out;
}

namespace {

// A non-negative decimal index ("12"), or nullopt.
std::optional<size_t> parse_index(const std::string& s) {
  if (s.empty() || s.size() > 18) return std::nullopt;
  size_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<size_t>(c - '0');
  }
  return v;
}

// The one value of a one-element entry, or nullopt (and a misfit named) if it has more or none.
std::optional<double> scalar_entry(const std::string& key, const Tensor& t, std::vector<std::string>& misfits) {
  if (!t.defined() || t.numel() != 1) {
    misfits.push_back(fmt::format("'{}' should hold one value but has shape {}", key,
                                  t.defined() ? t.sizes() : Shape{}));
    return std::nullopt;
  }
  return t.item<double>();
}

}  // namespace

void Optimizer::load_state_dict(const nn::NamedTensors& state) {
  load_state_dict(nn::state_map("optimizer load_state_dict", state));
}

void Optimizer::load_state_dict(std::initializer_list<std::pair<const std::string, Tensor>> state) {
  load_state_dict(nn::NamedTensors(state.begin(), state.end()));
}

void Optimizer::load_state_dict(const std::map<std::string, Tensor>& state) {
  std::vector<std::string> misfits;
  auto scalar = [&](const std::string& key) -> std::optional<double> {
    auto it = state.find(key);
    if (it == state.end()) {
      misfits.push_back(fmt::format("'{}' is missing from the state", key));
      return std::nullopt;
    }
    return scalar_entry(key, it->second, misfits);
  };
  std::optional<double> steps = scalar("step"), base_lr = scalar("lr");

  // Per-group entries: "group.<g>.<field>".
  struct SavedGroup {
    std::optional<double> lr_ratio, weight_decay, num_params;
  };
  std::map<size_t, SavedGroup> saved_groups;
  std::map<std::string, std::vector<Tensor>> buffers;
  std::set<std::string> misfit_buffers;  // present but not fitting: named once, not also as missing
  for (auto& [key, t] : state) {
    if (key == "step" || key == "lr") continue;
    if (key.rfind("group.", 0) == 0) {
      const size_t dot = key.find('.', 6);
      std::optional<size_t> g = dot == std::string::npos ? std::nullopt : parse_index(key.substr(6, dot - 6));
      const std::string field = dot == std::string::npos ? "" : key.substr(dot + 1);
      if (!g || (field != "lr_ratio" && field != "weight_decay" && field != "num_params")) {
        misfits.push_back(fmt::format("unexpected entry '{}'", key));
        continue;
      }
      std::optional<double> v = scalar_entry(key, t, misfits);
      SavedGroup& sg = saved_groups[*g];
      if (field == "lr_ratio") sg.lr_ratio = v;
      else if (field == "weight_decay") sg.weight_decay = v;
      else sg.num_params = v;
      if (v && (!std::isfinite(*v) || *v < 0))
        misfits.push_back(fmt::format("'{}' is {}; it must be finite and non-negative", key, *v));
      continue;
    }
    const size_t dot = key.rfind('.');
    std::optional<size_t> idx = dot == std::string::npos ? std::nullopt : parse_index(key.substr(dot + 1));
    if (!idx) {
      misfits.push_back(fmt::format("unexpected entry '{}'", key));
      continue;
    }
    if (*idx >= params_.size()) {
      misfits.push_back(fmt::format("'{}' refers to parameter {} but there are {}", key, *idx, params_.size()));
      continue;
    }
    const Tensor& p = params_[*idx];
    if (!t.defined() || t.sizes() != p.sizes() || t.dtype() != p.dtype()) {
      misfit_buffers.insert(key);
      if (t.defined())
        misfits.push_back(fmt::format("'{}' is {} {} but parameter {} is {} {}", key, t.dtype(), t.sizes(), *idx,
                                      p.dtype(), p.sizes()));
      else
        misfits.push_back(fmt::format("'{}' is undefined", key));
      continue;
    }
    auto& buf = buffers[key.substr(0, dot)];
    buf.resize(params_.size());
    buf[*idx] = t.detach().to(p.device()).clone();  // the state lives on its parameter's device
  }
  for (auto& [name, buf] : buffers)
    for (size_t i = 0; i < buf.size(); ++i)
      if (!buf[i].defined() && !misfit_buffers.count(fmt::format("{}.{}", name, i)))
        misfits.push_back(fmt::format("'{}.{}' is missing from the state", name, i));

  // The groups: as many as this optimizer's, each complete and of the same size; or none (a state
  // saved before groups existed), which fits a one-group optimizer.
  if (saved_groups.empty()) {
    if (groups_.size() != 1)
      misfits.push_back(fmt::format("the state has no parameter groups (saved before optimizers had them), which "
                                    "fits only a one-group optimizer, but this one has {} groups", groups_.size()));
  } else {
    const size_t saved_count = saved_groups.rbegin()->first + 1;
    if (saved_count != groups_.size())
      misfits.push_back(fmt::format("the state has {} parameter groups but this optimizer has {}", saved_count,
                                    groups_.size()));
    for (size_t g = 0; g < std::min(saved_count, groups_.size()); ++g) {
      // (An entry present but not one value was named above.)
      for (const char* field : {"lr_ratio", "weight_decay"})
        if (!state.count(fmt::format("group.{}.{}", g, field)))
          misfits.push_back(fmt::format("'group.{}.{}' is missing from the state", g, field));
      // num_params is checked when present (and when this optimizer has the group).
      auto it = saved_groups.find(g);
      if (it != saved_groups.end() && it->second.num_params && g < groups_.size()) {
        const double n = *it->second.num_params;
        const size_t mine = groups_[g].end - groups_[g].begin;
        if (n != static_cast<double>(mine))
          misfits.push_back(fmt::format("group {} has {} parameters in the state but {} in this optimizer", g,
                                        static_cast<int64_t>(n), mine));
      }
    }
  }
  if (base_lr && (!std::isfinite(*base_lr) || *base_lr < 0))
    misfits.push_back(fmt::format("'lr' is {}; it must be finite and non-negative", *base_lr));
  if (steps && (!std::isfinite(*steps) || *steps < 0))
    misfits.push_back(fmt::format("'step' is {}; it must be non-negative", *steps));

  if (!misfits.empty()) {
    constexpr size_t kShown = 20;
    std::string text;
    for (size_t i = 0; i < misfits.size() && i < kShown; ++i) text += (i ? "; " : "") + misfits[i];
    if (misfits.size() > kShown) text += fmt::format("; and {} more", misfits.size() - kShown);
    throw Error(fmt::format("optimizer load_state_dict: the state does not fit this optimizer: {}", text));
  }
  steps_ = static_cast<int64_t>(*steps);
  lr_ = *base_lr;
  buffers_ = std::move(buffers);
  for (auto& [g, sg] : saved_groups) {
    groups_[g].lr_ratio = *sg.lr_ratio;
    groups_[g].weight_decay = *sg.weight_decay;
  }
}

void Optimizer::save(const std::string& path) const { nn::save_safetensors(path, state_dict()); }

void Optimizer::load(const std::string& path) { load_state_dict(nn::load_safetensors(path).as_map()); }

namespace {

const SGDOptions& checked(const SGDOptions& o) {
  TP_CHECK(o.momentum >= 0 && o.weight_decay >= 0, "SGD: momentum and weight_decay must be non-negative");
  TP_CHECK(!o.nesterov || o.momentum > 0, "SGD: nesterov needs a positive momentum");
  return o;
}

const AdamOptions& checked(const AdamOptions& o) {
  TP_CHECK(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, "Adam: betas must be in [0, 1), got ({}, {})",
           o.beta1, o.beta2);
  TP_CHECK(o.eps >= 0 && o.weight_decay >= 0, "Adam: eps and weight_decay must be non-negative");
  return o;
}

}  // namespace

SGD::SGD(std::vector<Tensor> params, SGDOptions o)
    : Optimizer(std::move(params), checked(o).lr, o.weight_decay), options(o) {}

SGD::SGD(std::vector<ParamGroup> groups, SGDOptions o)
    : Optimizer(std::move(groups), checked(o).lr, o.weight_decay), options(o) {}

void SGD::step() {
  NoGradGuard no_grad;
  ++steps_;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const double glr = group_lr(g), wd = groups_[g].weight_decay;
    for (size_t i = groups_[g].begin; i < groups_[g].end; ++i) {
      Tensor p = params_[i], grad = p.grad();
      if (!grad.defined()) continue;
      Tensor d = wd != 0 ? grad + p * wd : grad;
      if (options.momentum != 0) {
        Tensor& buf = buffer("momentum_buffer")[i];
        if (steps_ == 1) buf.copy_(d);
        else buf.mul_(options.momentum).add_(d);
        d = options.nesterov ? d + buf * options.momentum : buf;
      }
      p.add_(d, -glr);
    }
  }
}

Adam::Adam(std::vector<Tensor> params, AdamOptions o)
    : Optimizer(std::move(params), checked(o).lr, o.weight_decay), options(o) {}

Adam::Adam(std::vector<ParamGroup> groups, AdamOptions o)
    : Optimizer(std::move(groups), checked(o).lr, o.weight_decay), options(o) {}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions o) : Adam(std::move(params), o) { decoupled_ = true; }

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions o) : Adam(std::move(groups), o) { decoupled_ = true; }

void Adam::step() {
  TP_PROFILE("Adam.step");
  NoGradGuard no_grad;
  ++steps_;
  const double b1 = options.beta1, b2 = options.beta2;
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(steps_));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(b2, static_cast<double>(steps_)));
  auto& m_all = buffer("exp_avg");
  auto& v_all = buffer("exp_avg_sq");
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const double glr = group_lr(gi), wd = groups_[gi].weight_decay;
    kernels::AdamStep adam;
    adam.beta1 = b1;
    adam.beta2 = b2;
    adam.eps = options.eps;
    adam.weight_decay = wd;
    adam.step_size = glr / bc1;
    adam.bias_correction2_sqrt = bc2_sqrt;
    adam.decay = 1.0 - glr * wd;
    adam.decoupled = decoupled_;
    // The group's parameters with a gradient, in one call (one launch per 48 tensors on a GPU).
    std::vector<Tensor> ps, gs, ms, vs;
    for (size_t i = groups_[gi].begin; i < groups_[gi].end; ++i) {
      Tensor p = params_[i], g = p.grad();
      if (!g.defined()) continue;
      ps.push_back(p), gs.push_back(g.contiguous()), ms.push_back(m_all[i]), vs.push_back(v_all[i]);
    }
    kernels::adam_step_(ps, gs, ms, vs, adam);
  }
}

double global_norm(const std::vector<Tensor>& tensors) {
  NoGradGuard no_grad;
  // Summed on the tensors' device in one call (one launch per 32 tensors on a GPU), then one copy
  // to the host (one synchronisation).
  return tensors.empty() ? 0.0 : std::sqrt(kernels::sum_of_squares(tensors).item<double>());
}

namespace {
std::vector<Tensor> grads_of(const std::vector<Tensor>& params) {
  std::vector<Tensor> grads;
  for (const Tensor& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  return grads;
}
}  // namespace

double grad_norm(const std::vector<Tensor>& params) { return global_norm(grads_of(params)); }

Tensor grad_sum_of_squares(const std::vector<Tensor>& params, Device device) {
  NoGradGuard no_grad;
  const std::vector<Tensor> grads = grads_of(params);
  return grads.empty() ? zeros({}, TensorOptions(DType::Float64, device)) : kernels::sum_of_squares(grads);
}

void scale_grads_to_norm(const std::vector<Tensor>& params, double max_norm, double norm) {
  NoGradGuard no_grad;
  const double coef = max_norm / (norm + 1e-6);
  if (coef >= 1) return;
  // One coefficient tensor per dtype and device, shared by every gradient: a launch per gradient,
  // not a fill and a multiply each.
  std::vector<Tensor> coefs;
  for (const Tensor& g : grads_of(params)) {
    auto it = std::find_if(coefs.begin(), coefs.end(),
                           [&g](const Tensor& c) { return c.dtype() == g.dtype() && c.device() == g.device(); });
    if (it == coefs.end()) it = coefs.insert(coefs.end(), scalar_tensor(coef, g.options()));
    Tensor target = g;
    kernels::binary_("clip_grad_norm", kernels::Binary::Mul, target, *it);
  }
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  const double norm = grad_norm(params);
  scale_grads_to_norm(params, max_norm, norm);
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

namespace {
constexpr double kPi = 3.14159265358979323846;
}  // namespace

WarmupDecaySchedule::WarmupDecaySchedule(const char* name, double peak, int64_t w, int64_t t, double min)
    : peak_lr(peak), warmup(w), total(t), min_lr(min) {
  TP_CHECK(std::isfinite(peak) && peak > 0, "{}: peak_lr must be positive, got {}", name, peak);
  TP_CHECK(min >= 0 && min <= peak, "{}: min_lr must be in [0, peak_lr = {}], got {}", name, peak, min);
  TP_CHECK(t > 0, "{}: total must be positive, got {}", name, t);
  TP_CHECK(w >= 0 && w <= t, "{}: warmup must be in [0, total = {}], got {}", name, t, w);
}

double WarmupDecaySchedule::lr(int64_t step) const {
  const int64_t s = std::max<int64_t>(step, 1);
  if (s <= warmup) return peak_lr * static_cast<double>(s) / static_cast<double>(warmup);
  if (s > total) return min_lr;  // also covers warmup == total
  const double frac = static_cast<double>(s - warmup) / static_cast<double>(total - warmup);
  return min_lr + remaining(frac) * (peak_lr - min_lr);
}

CosineSchedule::CosineSchedule(double peak, int64_t w, int64_t t, double min)
    : WarmupDecaySchedule("CosineSchedule", peak, w, t, min) {}

double CosineSchedule::remaining(double frac) const { return 0.5 * (1.0 + std::cos(kPi * frac)); }

LinearSchedule::LinearSchedule(double peak, int64_t w, int64_t t, double min)
    : WarmupDecaySchedule("LinearSchedule", peak, w, t, min) {}

double LinearSchedule::remaining(double frac) const { return 1.0 - frac; }

}  // namespace tapestry::optim
