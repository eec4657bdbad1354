// The op profiler (see profile.h).
#include "tapestry/ops/profile.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>

namespace tapestry::profile {

namespace {
bool on = false;
thread_local int depth = 0;
std::mutex mu;
std::map<std::string, Entry>& table() {
  static std::map<std::string, Entry> t;
  return t;
}
double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

void set_enabled(bool enable) { on = enable; }
bool enabled() { return on; }

void reset() {
  std::lock_guard<std::mutex> lock(mu);
  table().clear();
}

std::vector<std::pair<std::string, Entry>> report() {
  std::lock_guard<std::mutex> lock(mu);
  std::vector<std::pair<std::string, Entry>> out(table().begin(), table().end());
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.second.ms > b.second.ms; });
  return out;
}

Scope::Scope(const char* name) : name_(name) {
  if (!on) return;
  if (depth++ == 0) start_ = now_ms();
  else start_ = -2;  // nested: counted by the outer scope
}

Scope::~Scope() {
  if (start_ == -1) return;  // profiling was off when the scope opened
  --depth;
  if (start_ < 0) return;
  double ms = now_ms() - start_;
  std::lock_guard<std::mutex> lock(mu);
  Entry& e = table()[name_];
  e.ms += ms;
  ++e.calls;
}

}  // namespace tapestry::profile
