// Optimizers (SGD, Adam, AdamW), gradient clipping and learning-rate schedules, with
// libtorch's names. Each optimizer updates its parameters in place under NoGradGuard, one
// fused pass over memory per parameter, and its state (step count, lr, moment buffers) saves
// and loads with the model so that training resumes exactly.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tapestry/nn/module.h"

namespace tapestry::optim {

class Optimizer {
 public:
  Optimizer(std::vector<Tensor> params, double lr);
  virtual ~Optimizer() = default;
  virtual void step() = 0;  // parameters without a gradient are skipped
  void zero_grad();
  double lr() const { return lr_; }
  void set_lr(double lr) { lr_ = lr; }
  int64_t step_count() const { return steps_; }
  const std::vector<Tensor>& params() const { return params_; }

  // "step", "lr" and each per-parameter buffer as "<buffer>.<param index>".
  nn::NamedTensors state_dict() const;
  // Checks that the state fits these parameters (count, shapes) and names what does not.
  void load_state_dict(const std::map<std::string, Tensor>& state);
  // The state as a safetensors file beside the model's (atomic write, as Module::save).
  void save(const std::string& path) const;
  void load(const std::string& path);

 protected:
  // Named per-parameter buffers (e.g. exp_avg), zero-initialized on first use.
  std::vector<Tensor>& buffer(const std::string& name);
  std::vector<Tensor> params_;
  double lr_;
  int64_t steps_ = 0;
  std::map<std::string, std::vector<Tensor>> buffers_;
};

struct SGDOptions {
  double lr = 0.01, momentum = 0.0, weight_decay = 0.0;
  bool nesterov = false;
};

// PyTorch's SGD: d = g + wd p; buf = momentum buf + d (buf = d on the first step); p -= lr buf
// (nesterov: p -= lr (d + momentum buf)).
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options);
  void step() override;
  SGDOptions options;
};

struct AdamOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
};

// PyTorch's Adam (weight decay as L2 added to the gradient), bias-corrected moments.
class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions options);
  void step() override;
  AdamOptions options;

 protected:
  bool decoupled_ = false;
};

// Adam with decoupled weight decay: p *= 1 - lr wd before the Adam update (PyTorch's AdamW).
class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, AdamOptions options);
};

// Scales all gradients together so that their global L2 norm is at most max_norm; returns the
// norm before clipping (as torch.nn.utils.clip_grad_norm_).
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);
// The L2 norm of all the tensors together (accumulated in float64); NaN or inf if any element is.
double global_norm(const std::vector<Tensor>& tensors);
// global_norm of the parameters' gradients (parameters without one are skipped).
double grad_norm(const std::vector<Tensor>& params);

// Learning rate as a function of the step (counting from 1).
class Schedule {
 public:
  virtual ~Schedule() = default;
  virtual double lr(int64_t step) const = 0;
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

}  // namespace tapestry::optim
