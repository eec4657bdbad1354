// What a training run needs from its output folder and the process around it: one run per
// folder (a lock), no silent reuse of an earlier run's files, no stale temp files, and a clean
// stop on SIGINT/SIGTERM. See Note [Run folders] here and Note [Checkpoint unit] in checkpoints.cpp.
#pragma once
#include <memory>
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

// Note [Run folders]: one run per folder, held by a lock for the life of the run. A folder that
// holds a run is refused unless the run is resumed or overwrite removes it first, and temp files
// of writers that died mid-write are removed (no writer can be alive: the lock). RunFolder does
// all of it: it creates DIR (with its parents), locks it, cleans it, and on overwrite removes the
// run's files, the Trainer's (checkpoints, weights, curves) and the task's `task_files`.
class RunFolder {
 public:
  RunFolder(const std::string& dir, bool resume, bool overwrite, const std::vector<std::string>& task_files);
  const std::string& dir() const { return dir_; }

 private:
  void prepare(bool resume, bool overwrite, const std::vector<std::string>& task_files);
  std::string dir_;
  std::unique_ptr<RunLock> lock_;
};

// True when `path` exists (false on any error, as for a path under a file).
bool file_exists(const std::string& path);

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
