// Optimizers (SGD, Adam, AdamW), gradient clipping and learning-rate schedules, with
// libtorch's names. Each optimizer updates its parameters in place under NoGradGuard, one
// fused pass over memory per parameter, and its state (step count, lr, per-group lr ratio and
// weight decay, moment buffers) saves and loads with the model so that training resumes exactly.
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tapestry/nn/module.h"

namespace tapestry::optim {

// One parameter group, as an entry of PyTorch's param_groups: its parameters and, optionally,
// its own lr and weight decay (unset: the optimizer options'). E.g. AdamW without weight decay on
// biases and norms:
//   AdamW opt(std::vector<ParamGroup>{{decayed}, {not_decayed, std::nullopt, 0.0}}, options);
// Empty groups are allowed; a parameter may appear only once in all the groups together (the
// constructor throws "optimizer: parameter N appears in more than one group" otherwise).
struct ParamGroup {
  std::vector<Tensor> params;
  std::optional<double> lr;
  std::optional<double> weight_decay;
};

// The learning rate. lr() is the base lr: the options' lr until set_lr (or a Schedule) changes it.
// Each group keeps an lr ratio, its initial lr / the options' lr, fixed at construction (and
// restored by load_state_dict), and steps with group_lr(g) = lr() * ratio. So set_lr(x) scales
// every group as torch.optim.lr_scheduler.LambdaLR scales each group's base lr: a group built
// with lr 2e-4 under options.lr 1e-3 runs at a fifth of whatever the schedule gives. A group
// without its own lr has ratio 1. If options.lr is 0 the ratio is undefined: a group's own lr
// must then be 0 too (ratio 0: the group stays at lr 0 whatever set_lr is given), else the
// constructor throws.
class Optimizer {
 public:
  // One group of all the parameters, with the given lr and weight decay.
  Optimizer(std::vector<Tensor> params, double lr, double weight_decay = 0);
  // Groups in order; each group's unset lr / weight_decay is the given one.
  Optimizer(std::vector<ParamGroup> groups, double lr, double weight_decay = 0);
  virtual ~Optimizer() = default;
  virtual void step() = 0;  // parameters without a gradient are skipped
  void zero_grad();
  double lr() const { return lr_; }  // the base lr (see above)
  void set_lr(double lr) { lr_ = lr; }  // every group's lr becomes lr * its ratio
  int64_t step_count() const { return steps_; }
  // All the parameters, flat, in group order; a parameter's index here is its index in the state.
  const std::vector<Tensor>& params() const { return params_; }

  size_t num_groups() const { return groups_.size(); }
  double group_lr(size_t g) const;        // lr() * group_lr_ratio(g): what step() uses
  double group_lr_ratio(size_t g) const;  // the group's initial lr / the options' lr
  double group_weight_decay(size_t g) const;
  std::vector<Tensor> group_params(size_t g) const;

  // "step", "lr", per group "group.<g>.lr_ratio" and "group.<g>.weight_decay" (float64 0-d) and
  // "group.<g>.num_params" (int64 0-d), and each per-parameter buffer as "<buffer>.<param index>"
  // (the flat index of params()).
  nn::NamedTensors state_dict() const;
  // Checks that the state fits this optimizer (the number of groups and of parameters in each,
  // each buffer's shape and dtype against its parameter's), naming every misfit in one error, then
  // restores the step count, base lr, buffers and each group's lr ratio and weight decay (as
  // PyTorch's load_state_dict restores the groups' hyperparameters). A state saved before groups
  // existed (no "group." entries) loads into a one-group optimizer, whose ratio and weight decay
  // stay as constructed.
  void load_state_dict(const std::map<std::string, Tensor>& state);
  void load_state_dict(const nn::NamedTensors& state);  // state_dict()'s own form; a name given twice is refused
  void load_state_dict(std::initializer_list<std::pair<const std::string, Tensor>> state);
  // The state as a safetensors file beside the model's (atomic write, as Module::save).
  void save(const std::string& path) const;
  void load(const std::string& path);

 protected:
  // A group: params_[begin, end), its lr ratio and weight decay.
  struct Group {
    size_t begin = 0, end = 0;
    double lr_ratio = 1, weight_decay = 0;
  };
  // Named per-parameter buffers (e.g. exp_avg), zero-initialized on first use.
  std::vector<Tensor>& buffer(const std::string& name);
  const Group& group(size_t g) const;
  std::vector<Tensor> params_;
  std::vector<Group> groups_;
  double lr_;
  int64_t steps_ = 0;
  std::map<std::string, std::vector<Tensor>> buffers_;
};

struct SGDOptions {
  double lr = 0.01, momentum = 0.0, weight_decay = 0.0;
  bool nesterov = false;
};

// PyTorch's SGD: d = g + wd p; buf = momentum buf + d (buf = d on the first step); p -= lr buf
// (nesterov: p -= lr (d + momentum buf)), with each group's lr and wd. momentum and nesterov
// are the options', for all groups; options.lr and options.weight_decay are read only by the
// constructor (the groups' defaults).
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options);
  SGD(std::vector<ParamGroup> groups, SGDOptions options);
  void step() override;
  SGDOptions options;
};

struct AdamOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
};

// PyTorch's Adam (weight decay as L2 added to the gradient), bias-corrected moments, with each
// group's lr and weight decay (betas and eps are the options', for all groups).
class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions options);
  Adam(std::vector<ParamGroup> groups, AdamOptions options);
  void step() override;
  AdamOptions options;

 protected:
  bool decoupled_ = false;
};

// AdamW's options: Adam's, with PyTorch's and libtorch's AdamW default weight decay of 0.01 (Adam's
// is 0). A separate type so that AdamW never takes AdamOptions' 0 by accident: passing AdamOptions
// to AdamW does not compile; AdamWOptions(adam_options) says "these values, weight decay included".
struct AdamWOptions : AdamOptions {
  AdamWOptions() { weight_decay = 0.01; }
  explicit AdamWOptions(const AdamOptions& o) : AdamOptions(o) {}
};

// Adam with decoupled weight decay: p *= 1 - lr wd before the Adam update (PyTorch's AdamW),
// with each group's lr and wd.
class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions options);
  AdamW(std::vector<ParamGroup> groups, AdamWOptions options);
};

// Scales all gradients together so that their global L2 norm is at most max_norm; returns the
// norm before clipping (as torch.nn.utils.clip_grad_norm_).
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);
// The L2 norm of all the tensors together (accumulated in float64); NaN or inf if any element is.
double global_norm(const std::vector<Tensor>& tensors);
// global_norm of the parameters' gradients (parameters without one are skipped).
double grad_norm(const std::vector<Tensor>& params);
// The two halves of clip_grad_norm, for a caller that reads the norm together with other values in
// one copy (the Trainer: one synchronisation per step on a GPU):
// the squared norm of the gradients as a 0-d float64 tensor on `device` (nothing read on the host);
Tensor grad_sum_of_squares(const std::vector<Tensor>& params, Device device);
// and the gradients scaled by max_norm / (norm + 1e-6) when that is below 1, given their norm.
void scale_grads_to_norm(const std::vector<Tensor>& params, double max_norm, double norm);

// Learning rate as a function of the step (counting from 1).
class Schedule {
 public:
  virtual ~Schedule() = default;
  virtual double lr(int64_t step) const = 0;
  // Sets the optimizer's base lr; each group runs at lr(step) times its ratio (see Optimizer).
  void apply(Optimizer& opt, int64_t step) const { opt.set_lr(lr(step)); }
};

// The paper's: factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5).
class NoamSchedule : public Schedule {
 public:
  NoamSchedule(int64_t d_model, int64_t warmup, double factor = 1.0);
  double lr(int64_t step) const override;
  int64_t d_model, warmup;
  double factor;
};

// Linear warmup to peak_lr over `warmup` steps, then peak_lr * sqrt(warmup / step).
class InverseSqrtSchedule : public Schedule {
 public:
  InverseSqrtSchedule(double peak_lr, int64_t warmup);
  double lr(int64_t step) const override;
  double peak_lr;
  int64_t warmup;
};

// nanoGPT's get_lr, step counting from 1: linear warmup peak_lr * step / warmup for
// step <= warmup (warmup 0: none), then a decay from peak_lr at step = warmup down to min_lr at
// step = total, and min_lr after total. Needs peak_lr > 0, 0 <= min_lr <= peak_lr,
// 0 <= warmup <= total and total > 0. The decay's shape is the subclass's.
class WarmupDecaySchedule : public Schedule {
 public:
  double lr(int64_t step) const override;
  double peak_lr;
  int64_t warmup, total;
  double min_lr;

 protected:
  WarmupDecaySchedule(const char* name, double peak_lr, int64_t warmup, int64_t total, double min_lr);
  // The share of (peak_lr - min_lr) left once `frac` (in [0, 1]) of the decay is done.
  virtual double remaining(double frac) const = 0;
};

// A half cosine: min_lr + (peak_lr - min_lr) * (1 + cos(pi * (step - warmup) / (total - warmup))) / 2.
class CosineSchedule : public WarmupDecaySchedule {
 public:
  CosineSchedule(double peak_lr, int64_t warmup, int64_t total, double min_lr = 0);

 protected:
  double remaining(double frac) const override;
};

// A straight line: min_lr + (peak_lr - min_lr) * (1 - (step - warmup) / (total - warmup)).
class LinearSchedule : public WarmupDecaySchedule {
 public:
  LinearSchedule(double peak_lr, int64_t warmup, int64_t total, double min_lr = 0);

 protected:
  double remaining(double frac) const override;
};

}  // namespace tapestry::optim
