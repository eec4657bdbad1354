// Atomic file writes (see file.h).
#include "tapestry/ops/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "tapestry/ops/error.h"

namespace tapestry {

void write_file_atomic(const std::string& path, const std::string& bytes) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  TP_CHECK(fd >= 0, "save: cannot create {}: {}", tmp, std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw Error(fmt::format("save: writing {} failed after {} of {} bytes: {}", path, done, bytes.size(),
                              std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  // close() whatever fsync() said (the descriptor must not leak); the first failure is reported.
  const int sync_err = ::fsync(fd) != 0 ? errno : 0;
  const int close_err = ::close(fd) != 0 ? errno : 0;
  if (sync_err || close_err) {
    ::unlink(tmp.c_str());
    throw Error(fmt::format("save: flushing {} failed: {}", path, std::strerror(sync_err ? sync_err : close_err)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw Error(fmt::format("save: cannot rename {} to {}: {}", tmp, path, std::strerror(err)));
  }
  // The rename itself is durable only once the directory is flushed.
  std::string dir = std::filesystem::path(path).parent_path().string();
  int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace tapestry
