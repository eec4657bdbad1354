// Grad mode: whether ops record themselves on the tape. NoGradGuard turns recording off for a
// scope (inference, optimizer updates, and backward itself), restoring the previous mode after.
#pragma once

namespace tapestry {

class GradMode {
 public:
  static bool is_enabled();
  static void set_enabled(bool on);
};

// Sets grad mode for a scope and restores the previous mode after.
class GradModeGuard {
 public:
  explicit GradModeGuard(bool on) : prev_(GradMode::is_enabled()) { GradMode::set_enabled(on); }
  ~GradModeGuard() { GradMode::set_enabled(prev_); }
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool prev_;
};

// torch.no_grad() and torch.enable_grad() (the second for code that runs inside backward, as a
// checkpoint's recomputation).
class NoGradGuard : public GradModeGuard {
 public:
  NoGradGuard() : GradModeGuard(false) {}
};
class EnableGradGuard : public GradModeGuard {
 public:
  EnableGradGuard() : GradModeGuard(true) {}
};

}  // namespace tapestry
