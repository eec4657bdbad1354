// The CUDA runtime and kernel backend of a build without -DTAPESTRY_CUDA=ON: nothing to use, and
// errors that say how to get it. (ops/cuda/ replaces this file in a CUDA build.)
#include <cstring>
#include <tuple>

#include "tapestry/ops/cuda.h"
#include "tapestry/ops/detail/backend.h"

namespace tapestry::cuda {

namespace {
[[noreturn]] void not_built(const char* what, Device device) {
  throw Error(fmt::format("{}: device {} is not built in: this build has only the cpu backend (configure with "
                          "-DTAPESTRY_CUDA=ON)", what, device_name(device)));
}
}  // namespace

bool built() { return false; }
int device_count() { return 0; }
bool is_available() { return false; }
std::string unavailable_reason() { return "this build has no CUDA backend (configure with -DTAPESTRY_CUDA=ON)"; }
void synchronize(Device device) {
  if (device.is_cuda()) not_built("synchronize", device);
}
MemoryStats memory_stats(Device) { return {}; }
void reset_peak_memory(Device) {}
void empty_cache(Device) {}
bool bf16_supported(Device device, std::string* why) {
  if (why) *why = device_name(device) + ": " + unavailable_reason();
  return false;
}
// Kept, though nothing reads it without a GPU: a program that sets it runs on any build.
namespace {
AttentionKernel attention_choice = AttentionKernel::Auto;
}  // namespace
void set_attention_kernel(AttentionKernel kernel) { attention_choice = kernel; }
AttentionKernel attention_kernel() { return attention_choice; }

namespace detail {
void* allocate(size_t, Device device) { not_built("Storage", device); }
void release(void*, size_t, Device) noexcept {}
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) {
  if (dst_device.is_cuda()) not_built("copy_", dst_device);
  if (src_device.is_cuda()) not_built("copy_", src_device);
  if (nbytes > 0) std::memcpy(dst, src, nbytes);
}
void set_device(Device device) { not_built("set_device", device); }
void* stream(Device device) { not_built("stream", device); }
void wait_for_stream(Device) noexcept {}
}  // namespace detail

}  // namespace tapestry::cuda

namespace tapestry::kernels::cuda {

namespace {
[[noreturn]] void no_cuda_backend(const char* entry) {
  throw Error(fmt::format("{}: tensor on cuda, but this build has only the cpu backend (configure with "
                          "-DTAPESTRY_CUDA=ON)", entry));
}
}  // namespace

// Every kernel entry of ops/detail/kernel_entries.h: unreachable unless a tensor claims a GPU.
#define TP_KERNEL(Ret, name, params, args, check) \
  Ret name params {                               \
    (void)std::forward_as_tuple args;             \
    no_cuda_backend(#name);                       \
  }
#include "tapestry/ops/detail/kernel_entries.h"
#undef TP_KERNEL

}  // namespace tapestry::kernels::cuda
