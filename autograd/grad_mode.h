// Grad mode: whether ops record themselves on the tape. NoGradGuard turns recording off for a
// scope (inference, optimizer updates, and backward itself), restoring the previous mode after.
#pragma once

namespace tapestry {

class GradMode {
 public:
  static bool is_enabled();
  static void set_enabled(bool on);
};

class NoGradGuard {
 public:
  NoGradGuard() : prev_(GradMode::is_enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace tapestry
