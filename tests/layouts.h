// Test helpers without doctest (the OpInfo table, which opinfo_dump also links, uses them):
// non-contiguous layouts of a tensor's values and per-process temp paths.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tapestry/tapestry.h"

namespace tapestry::testing {

// Layouts: the same values as `v` in a non-contiguous view, so that every op also meets inputs
// it cannot read as one flat run. transposed: the dims stored in reverse order (a permuted view;
// 0-d and 1-D tensors get strided's layout). strided: every other element of a larger buffer
// along the last dim, at offset 1. expanded: a stride-0 view (size-1 and new leading dims).
inline Tensor strided(const Tensor& v) {
  if (v.dim() == 0) {
    Tensor x = empty({3}, v.dtype()).select(0, 1);
    x.copy_(v);
    return x;
  }
  Shape big = v.sizes();
  const int64_t last = v.dim() - 1;
  big[last] = 2 * v.size(last) + 1;
  Tensor x = empty(big, v.dtype()).slice(last, 1, big[last], 2);
  x.copy_(v);
  return x;
}

inline Tensor transposed(const Tensor& v) {
  if (v.dim() < 2) return strided(v);
  Shape rev(v.sizes().rbegin(), v.sizes().rend());
  std::vector<int64_t> perm;
  for (int64_t d = v.dim() - 1; d >= 0; --d) perm.push_back(d);
  Tensor x = empty(rev, v.dtype()).permute(perm);
  x.copy_(v);
  return x;
}

inline Tensor expanded(const Tensor& small, const Shape& to) { return small.expand(to); }

// A path under /tmp that no other test process uses: /tmp/tapestry_test_PID_name.
inline std::string temp_path(const std::string& name) {
  return fmt::format("/tmp/tapestry_test_{}_{}", ::getpid(), name);
}

// temp_path(name) as an empty folder (whatever an earlier run left in it is removed).
inline std::string fresh_temp_dir(const std::string& name) {
  const std::string dir = temp_path(name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace tapestry::testing
