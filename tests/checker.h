// The common harness of the standalone checkers. device_check, dist_check and gpt_hf_check are
// programs rather than doctest suites because of how they run: with an argument (a device, a
// downloaded file), under mpirun on several ranks, or skipped with exit code 77 where there is no
// GPU. They report alike through a Checker: "NAME: FAIL: what" on stderr for each failed check
// (all of them, not only the first), "NAME: line" for what was checked, one summary line, and the
// exit code ctest reads: 0 passed, 1 failed, 2 usage, 77 skipped.
#pragma once
#include <cstdio>
#include <exception>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace tapestry::testing {

class Checker {
 public:
  static constexpr int kPassed = 0, kFailed = 1, kUsage = 2, kSkipped = 77;

  explicit Checker(std::string name) : name_(std::move(name)) {}

  // A failure unless ok; returns ok, so that a check can guard what follows it.
  bool expect(bool ok, const std::string& what) {
    if (!ok) fail(what);
    return ok;
  }
  void fail(const std::string& what) {
    ++failures_;
    std::fprintf(stderr, "%s: FAIL: %s\n", name_.c_str(), what.c_str());
  }
  // What was checked, for the log.
  void note(const std::string& line) const {
    std::printf("%s: %s\n", name_.c_str(), line.c_str());
    std::fflush(stdout);
  }
  int failures() const { return failures_; }

  // Runs body, which expect()s what it checks and returns kPassed, or kUsage / kSkipped (passed
  // through); an exception it lets out is one more failure. Prints the summary line and returns
  // the exit code.
  template <class Body>
  int run(Body&& body) {
    int code = kPassed;
    try {
      code = body();
    } catch (const std::exception& e) {
      fail(std::string("unexpected error: ") + e.what());
    }
    if (code == kUsage || code == kSkipped) return code;
    if (code != kPassed && failures_ == 0) fail(fmt::format("finished with code {}", code));
    if (failures_) {
      std::fprintf(stderr, "%s: %d failure(s)\n", name_.c_str(), failures_);
      return kFailed;
    }
    note("all checks passed");
    return kPassed;
  }

 private:
  std::string name_;
  int failures_ = 0;
};

}  // namespace tapestry::testing
