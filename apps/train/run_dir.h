// What a training run needs from its output folder and the process around it: one run per
// folder (a lock), no silent reuse of an earlier run's files, no stale temp files, and a clean
// stop on SIGINT/SIGTERM. See Note [Run folders] and Note [Checkpoint unit] in translation.cpp.
#pragma once
#include <string>
#include <vector>

namespace tapestry::apps {

// Holds an exclusive flock on DIR/.lock for its lifetime (released by the kernel even on kill -9).
// Throws a tapestry::Error naming the folder, and the holder's pid, when another run holds it.
class RunLock {
 public:
  explicit RunLock(const std::string& dir);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  int fd_ = -1;
};

// Removes DIR's temp files (`*.tmp.PID...`) left by a writer that died mid-write; returns their
// names. Only safe under the folder's RunLock.
std::vector<std::string> remove_stale_temp_files(const std::string& dir);

// While alive, SIGINT and SIGTERM set a flag instead of killing the process: the training loop
// polls `pending()` after each step, saves a checkpoint and returns. A second signal exits at
// once (the default action). The previous handlers come back on destruction.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  // The signal received (SIGINT or SIGTERM), or 0.
  static int pending();
  static const char* name(int signal);
};

}  // namespace tapestry::apps
