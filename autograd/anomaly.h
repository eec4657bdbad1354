// Anomaly detection, as PyTorch's torch.autograd.detect_anomaly: while on, every recorded op's
// forward output is checked for NaN, and every backward node's gradients for NaN and inf; the
// first offender throws a tapestry::Error naming the op. Forward infinities are allowed (masks
// fill logits with -inf on purpose). It costs one pass over each tensor: a debugging aid.
#pragma once

namespace tapestry {

struct AnomalyMode {
  static bool is_enabled();
  static void set_enabled(bool on);
};

// Sets anomaly mode for a scope and restores the previous setting.
class AnomalyGuard {
 public:
  explicit AnomalyGuard(bool on = true) : previous_(AnomalyMode::is_enabled()) { AnomalyMode::set_enabled(on); }
  ~AnomalyGuard() { AnomalyMode::set_enabled(previous_); }
  AnomalyGuard(const AnomalyGuard&) = delete;
  AnomalyGuard& operator=(const AnomalyGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace tapestry
