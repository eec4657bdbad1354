// What the host asks of a device, counted: synchronisations (the host waits for the device: a copy
// to the host, item(), to_vector(), cuda::synchronize) and kernel launches. The CUDA backend
// counts every kernel it launches and every cuBLAS call; the emulated device (Note [Emulated
// device], ops/dtype.h) counts each kernel entry the dispatcher routes to it, so its count is the
// launches a backend with one kernel per entry would make. `tapestry bench --json` reports both per
// train step, and tests/device_check.cpp holds the train step to a budget.
//
// The emulated device's access check lives here too: its memory may be read from the host only
// inside an EmulatedKernel scope, which the dispatcher opens around the CPU kernel it runs for the
// device (and the runtime around its copies). Anywhere else, Tensor::raw_data() and data_ptr() on
// an emulated tensor throw an Error, as a host dereference of GPU memory would crash.
#pragma once
#include <atomic>
#include <cstdint>

#include "tapestry/ops/dtype.h"

namespace tapestry::runtime {

struct Counts {
  int64_t syncs = 0;     // host synchronisations with a device
  int64_t launches = 0;  // kernel launches on a device (cuBLAS calls included)
  int64_t bytes_to_host = 0;  // bytes copied from a device to the host
};
Counts counts();  // since the start of the process or the last reset_counts()
void reset_counts();
void count_sync();
void count_launch();
void count_bytes_to_host(int64_t bytes);

namespace detail {
// Nesting depth of EmulatedKernel scopes. Not thread-local: OpenMP's worker threads run inside the
// scope their caller opened.
extern std::atomic<int> emulated_kernel_depth;
[[noreturn]] void host_access_denied(const char* what, Device device);
}  // namespace detail

// True inside an EmulatedKernel scope: the kernel's own work, whose copies are not the host's syncs.
inline bool in_emulated_kernel() { return detail::emulated_kernel_depth.load(std::memory_order_relaxed) > 0; }

// Opens the emulated device's memory to the host: the dispatcher wraps each kernel it routes to the
// emulated device in one (the outermost counts as a launch), and the runtime its copies.
class EmulatedKernel {
 public:
  explicit EmulatedKernel(bool launch = true) {
    if (detail::emulated_kernel_depth.fetch_add(1, std::memory_order_relaxed) == 0 && launch) count_launch();
  }
  ~EmulatedKernel() { detail::emulated_kernel_depth.fetch_sub(1, std::memory_order_relaxed); }
  EmulatedKernel(const EmulatedKernel&) = delete;
  EmulatedKernel& operator=(const EmulatedKernel&) = delete;
};

// Throws unless the host may read `device`'s memory here: always on the CPU, inside an
// EmulatedKernel scope on the emulated device, never on a GPU (a device pointer is not for the host:
// those callers pass it to a kernel or a library and must not call this).
inline void check_host_access(const char* what, Device device) {
  if (device.is_emulated() && !in_emulated_kernel()) detail::host_access_denied(what, device);
}

}  // namespace tapestry::runtime
