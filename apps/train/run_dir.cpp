// Run folders and stop signals (see run_dir.h).
#include "apps/train/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "tapestry/dist/dist.h"
#include "tapestry/ops/error.h"

namespace tapestry::apps {

namespace {
// The files the Trainer writes into a run folder; epoch copies are matched by prefix.
const char* const kTrainerFiles[] = {"checkpoint.safetensors", "model.safetensors", "optimizer.safetensors",
                                     "model.best.safetensors", "model.avg.safetensors", "curves.svg",
                                     "adapter.safetensors", "adapter.best.safetensors", "adapter.avg.safetensors"};
}  // namespace

bool file_exists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

RunFolder::RunFolder(const std::string& dir, bool resume, bool overwrite, const std::vector<std::string>& task_files)
    : dir_(dir) {
  TP_CHECK(!(resume && overwrite), "train: --resume and --overwrite contradict each other; choose one");
  // Under mpirun rank 0 alone prepares (and locks) the folder; the others wait until it has.
  if (!dist::is_main()) {
    dist::barrier();
    return;
  }
  prepare(resume, overwrite, task_files);
  dist::barrier();
}

void RunFolder::prepare(bool resume, bool overwrite, const std::vector<std::string>& task_files) {
  const std::string& dir = dir_;
  std::error_code mkdir_error;
  std::filesystem::create_directories(dir, mkdir_error);  // with its parents, as `mkdir -p`
  TP_CHECK(std::filesystem::is_directory(dir), "train: cannot create the output directory {}{}", dir,
           mkdir_error ? ": " + mkdir_error.message() : "");
  lock_ = std::make_unique<RunLock>(dir);
  for (const std::string& f : remove_stale_temp_files(dir))
    std::printf("train: removed %s/%s, left by an interrupted write\n", dir.c_str(), f.c_str());
  std::vector<std::string> files(std::begin(kTrainerFiles), std::end(kTrainerFiles));
  files.insert(files.end(), task_files.begin(), task_files.end());
  bool holds_run = false;
  for (const auto& f : files) holds_run = holds_run || file_exists(dir + "/" + f);
  if (!holds_run || resume) return;
  TP_CHECK(overwrite, "train: {} already holds a run; pass --resume to continue it, or --overwrite to start over "
           "(which deletes its checkpoints)", dir);
  std::error_code ec;
  for (const auto& f : files) std::filesystem::remove_all(dir + "/" + f, ec);  // a task's folders too (gpt2/, hf/)
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("model.epoch", 0) == 0 || name.rfind("adapter.epoch", 0) == 0) std::filesystem::remove(entry.path(), ec);
  }
  std::printf("train: --overwrite: removed the run in %s\n", dir.c_str());
}

RunLock::RunLock(const std::string& dir) {
  const std::string path = dir + "/.lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  TP_CHECK(fd_ >= 0, "train: cannot create {}: {}", path, std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    char pid[32] = {0};
    ssize_t n = ::pread(fd_, pid, sizeof pid - 1, 0);
    ::close(fd_);
    fd_ = -1;
    throw Error(fmt::format("train: {} is in use by another run (pid {}); wait for it, or use another --out", dir,
                            n > 0 ? std::string(pid, static_cast<size_t>(n)) : "unknown"));
  }
  std::string me = std::to_string(::getpid());
  if (::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, me.data(), me.size(), 0) < 0) {
    // The pid is only a courtesy for the message above; the lock is what counts.
  }
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the flock
}

std::vector<std::string> remove_stale_temp_files(const std::string& dir) {
  std::vector<std::string> removed;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.find(".tmp.") == std::string::npos || !entry.is_regular_file(ec)) continue;
    if (std::filesystem::remove(entry.path(), ec)) removed.push_back(name);
  }
  return removed;
}

namespace {
volatile std::sig_atomic_t g_stop_signal = 0;
struct sigaction g_old_int, g_old_term;

void on_stop_signal(int sig) {
  if (g_stop_signal != 0) {  // the second signal: the default action, now
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  g_stop_signal = sig;
  const char msg[] = "\ntrain: stopping after this step to save a checkpoint (signal again to exit at once)\n";
  ssize_t ignored = ::write(2, msg, sizeof msg - 1);
  (void)ignored;
}
}  // namespace

StopSignals::StopSignals() {
  g_stop_signal = 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  // SA_ONSTACK: on the thread's alternate stack where it has one, as every thread running oneDNN's
  // gemm kernels does (Note [oneDNN and signals], ops/cpu/gemm.cpp).
  sa.sa_flags = SA_RESTART | SA_ONSTACK;
  ::sigaction(SIGINT, &sa, &g_old_int);
  ::sigaction(SIGTERM, &sa, &g_old_term);
}

StopSignals::~StopSignals() {
  ::sigaction(SIGINT, &g_old_int, nullptr);
  ::sigaction(SIGTERM, &g_old_term, nullptr);
  g_stop_signal = 0;
}

int StopSignals::pending() { return g_stop_signal; }

const char* StopSignals::name(int signal) { return signal == SIGINT ? "SIGINT" : signal == SIGTERM ? "SIGTERM" : "a signal"; }

}  // namespace tapestry::apps
