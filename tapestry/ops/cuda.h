// The CUDA backend's runtime, as seen from any build: whether it is built and usable, the
// device's stream and its memory. In a build without -DTAPESTRY_CUDA=ON, built() is false,
// device_count() is 0 and the rest are no-ops or errors that say so (ops/no_cuda.cpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "tapestry/ops/dtype.h"

namespace tapestry::cuda {

bool built();          // this library was built with -DTAPESTRY_CUDA=ON
int device_count();    // GPUs usable now: 0 without a CUDA build, a driver or a GPU
bool is_available();   // device_count() > 0
// One line saying why is_available() is false (for skip messages); empty when it is true.
std::string unavailable_reason();

// Waits for the device's stream (one per device; every kernel and copy runs on it) and raises
// a pending device-side error: data checks that run on the GPU (an index out of range, a target
// id out of range, a bad token) set a flag there instead of copying data to the host on every
// call, and the first synchronisation reports them (copies to the host synchronise).
void synchronize(Device device = Device::CUDA);

// The caching allocator: memory handed to tensors (allocated), held from the driver (reserved,
// cached blocks included), the peak of allocated since the last reset, and cudaMalloc calls.
struct MemoryStats {
  int64_t allocated = 0, reserved = 0, peak_allocated = 0, device_mallocs = 0;
};
MemoryStats memory_stats(Device device = Device::CUDA);
void reset_peak_memory(Device device = Device::CUDA);
void empty_cache(Device device = Device::CUDA);  // returns cached, unused blocks to the driver

// TF32 tensor cores for float32 matmuls (faster, about 10 mantissa bits): off unless asked for.
void set_allow_tf32(bool on);
bool allow_tf32();

namespace detail {
// The hooks the device-independent code needs (Storage, cross-device copy_, dispatch).
void* allocate(size_t nbytes, Device device);
void release(void* ptr, size_t nbytes, Device device) noexcept;
// Copies nbytes between two contiguous buffers on any devices, synchronously for the host side.
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes);
void set_device(Device device);
// The device's one stream (a cudaStream_t, Note [One stream] in ops/cuda/runtime.cu), for a library
// that enqueues work in order with tapestry's kernels: dist's NCCL all-reduce.
void* stream(Device device);
}  // namespace detail

}  // namespace tapestry::cuda
