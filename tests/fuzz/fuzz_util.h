// Shared by the libFuzzer targets in tests/fuzz/: a scratch file per process (the readers under
// test take a path), and a loud failure that names what broke before aborting, so libFuzzer
// saves the input as a crash.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace tapestry_fuzz {

// One file under $TMPDIR (or /tmp), named after the target and this process (libFuzzer's -jobs
// runs several processes side by side), rewritten for every input and removed at exit.
class ScratchFile {
 public:
  ScratchFile(const std::string& tag, const std::string& ext) {
    const char* dir = std::getenv("TMPDIR");
    path_ = std::string(dir && *dir ? dir : "/tmp") + "/tapestry-fuzz-" + tag + "-" + std::to_string(::getpid()) + ext;
  }
  ~ScratchFile() { std::remove(path_.c_str()); }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;

  const std::string& path() const { return path_; }

  void write(const void* data, size_t size) const {
    FILE* f = std::fopen(path_.c_str(), "wb");
    if (f == nullptr) {
      std::perror(path_.c_str());
      std::abort();
    }
    if (size > 0 && std::fwrite(data, 1, size, f) != size) {
      std::perror(path_.c_str());
      std::abort();
    }
    if (std::fclose(f) != 0) {
      std::perror(path_.c_str());
      std::abort();
    }
  }
  void write(const std::string& bytes) const { write(bytes.data(), bytes.size()); }

 private:
  std::string path_;
};

// A broken invariant: print it and abort (libFuzzer then writes the input to crash-<sha1>).
[[noreturn]] inline void fail(const char* target, const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", target, what.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace tapestry_fuzz
