// The CUDA backend's runtime, as seen from any build: whether it is built and usable, the
// device's stream and its memory. In a build without -DTAPESTRY_CUDA=ON, built() is false,
// device_count() is 0 and the rest are no-ops or errors that say so (ops/no_cuda.cpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "tapestry/ops/dtype.h"
#include "tapestry/ops/error.h"

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
// Process-wide, as torch.backends.cuda.matmul.allow_tf32; `--tf32` on bench, train and translate.
void set_allow_tf32(bool on);
bool allow_tf32();

// Whether autocast to bfloat16 (ops/autocast.h) can run its matmuls on this GPU: cuBLAS's bfloat16
// gemm with float32 accumulation, compute capability 8.0 or later. When not, `why` says why.
bool bf16_supported(Device device, std::string* why = nullptr);

// The kernel scaled_dot_product_attention runs on a GPU.
//   Gemm:  cuBLAS batched gemms around a row kernel; the [B·H, Tq, Tk] scores (two such buffers
//          in the backward) live in device memory.
//   Tiled: FlashAttention-style kernels (ops/detail/attention_tiles.h) that keep one tile of keys per
//          block in shared memory: memory linear in Tq and Tk; head sizes up to 128 (wider heads
//          run Gemm).
//   Auto:  the default: Tiled where Gemm's scores would take more than auto_tiled_bytes(),
//          otherwise Gemm.
// Both give the CPU's results (tests/device_check.cpp runs both); docs/cuda.md says what has run.
enum class AttentionKernel { Auto, Gemm, Tiled };
void set_attention_kernel(AttentionKernel kernel);
AttentionKernel attention_kernel();
constexpr int64_t auto_tiled_bytes() { return int64_t(256) << 20; }
// Parses "auto", "gemm" or "tiled" (for command lines); anything else is an Error naming them.
inline AttentionKernel parse_attention_kernel(const std::string& name) {
  if (name == "auto") return AttentionKernel::Auto;
  if (name == "gemm") return AttentionKernel::Gemm;
  if (name == "tiled") return AttentionKernel::Tiled;
  throw Error("attention kernel: expected auto, gemm or tiled, got '" + name + "'");
}

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
// Waits for the device's stream without reading the error flag (the next synchronisation reports a
// device error): the end of a kernel's profile scope (`--profile`), which must not throw.
void wait_for_stream(Device device) noexcept;
}  // namespace detail

}  // namespace tapestry::cuda
