// Counters of synchronisations and launches, and the emulated device's access check (ops/runtime.h).
#include "tapestry/ops/runtime.h"

#include "tapestry/ops/error.h"

namespace tapestry::runtime {

namespace {
// Relaxed atomics: counts only, read between steps; kernels may run on several host threads.
std::atomic<int64_t> sync_count{0};
std::atomic<int64_t> launch_count{0};
std::atomic<int64_t> host_bytes{0};
}  // namespace

namespace detail {
std::atomic<int> emulated_kernel_depth{0};

void host_access_denied(const char* what, Device device) {
  throw Error(fmt::format("{}: the host read the memory of a tensor on {} outside a kernel (on a GPU this "
                          "dereferences a device pointer); copy it with .to(cpu), item() or to_vector() first",
                          what, device_name(device)));
}
}  // namespace detail

Counts counts() {
  return {sync_count.load(std::memory_order_relaxed), launch_count.load(std::memory_order_relaxed),
          host_bytes.load(std::memory_order_relaxed)};
}
void reset_counts() {
  sync_count.store(0, std::memory_order_relaxed);
  launch_count.store(0, std::memory_order_relaxed);
  host_bytes.store(0, std::memory_order_relaxed);
}
void count_sync() { sync_count.fetch_add(1, std::memory_order_relaxed); }
void count_launch() { launch_count.fetch_add(1, std::memory_order_relaxed); }
void count_bytes_to_host(int64_t bytes) { host_bytes.fetch_add(bytes, std::memory_order_relaxed); }

}  // namespace tapestry::runtime
