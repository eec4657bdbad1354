// A minimal op profiler for `tapestry bench --profile`: kernels and backward nodes open a
// TP_PROFILE(name) scope; when profiling is on, the outermost scope on the thread adds its wall
// time under its name (nested kernels count toward their caller). Off, a scope costs one branch.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tapestry::profile {

struct Entry {
  double ms = 0;
  int64_t calls = 0;
};

void set_enabled(bool on);
bool enabled();
void reset();
std::vector<std::pair<std::string, Entry>> report();  // sorted by time, largest first

class Scope {
 public:
  explicit Scope(const char* name);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  const char* name_;
  double start_ = -1;
};

}  // namespace tapestry::profile

#define TP_PROFILE_CAT2(a, b) a##b
#define TP_PROFILE_CAT(a, b) TP_PROFILE_CAT2(a, b)
#define TP_PROFILE(name) ::tapestry::profile::Scope TP_PROFILE_CAT(tp_profile_scope_, __LINE__)(name)
