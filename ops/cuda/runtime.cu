// The CUDA backend's runtime: per-device state (a stream, a cuBLAS handle bound to it, the
// device-side error flag and a caching allocator), the public tapestry::cuda API (ops/cuda.h)
// and the hooks that Storage, the dispatcher and cross-device copies call.
//
// Note [One stream]: every kernel and copy of a device runs on its one stream, in issue order.
// So a freed block can go back to the cache at once: any later kernel that receives it is
// ordered after every kernel that used it before. (With several streams a block would need an
// event per stream before reuse; PyTorch's CUDACachingAllocator records them.)
//
// Note [Caching allocator]: a training step frees and allocates the same sizes every step, and
// cudaMalloc/cudaFree synchronise the device. Freed blocks are kept by size and reused: sizes
// round up to 512 bytes below 1 MiB and to 2 MiB above, so a step's sizes map to few classes;
// a cached block serves a request when it is at most 1/8 larger. When cudaMalloc fails, the
// cache is returned to the driver and the allocation tried once more. The per-device state is
// never destroyed: tensors freed during static destruction still find their cache, and the
// driver reclaims everything at exit.
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "tapestry/ops/cuda/common.cuh"

namespace tapestry::kernels::cuda {

void throw_cuda_error(cudaError_t err, const char* call, const char* op) {
  throw Error(fmt::format("{}: {} failed: {} ({})", op, call, cudaGetErrorString(err), cudaGetErrorName(err)));
}

void throw_cublas_error(cublasStatus_t status, const char* call, const char* op) {
  throw Error(fmt::format("{}: {} failed: {} ({})", op, call, cublasGetStatusString(status),
                          static_cast<int>(status)));
}

namespace {

constexpr int kMaxDevices = 64;

struct DeviceState {
  int index = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  DeviceError* error = nullptr;  // device memory, zero when no error is pending

  std::mutex mutex;                            // guards the allocator below
  std::multimap<size_t, void*> free_blocks;    // cached blocks by size
  std::unordered_map<void*, size_t> block_size;  // every live or cached block's size
  int64_t allocated = 0, reserved = 0, peak_allocated = 0, device_mallocs = 0;
};

std::mutex states_mutex;
// Published once, after the state is made: every kernel entry reads its device's state (stream(),
// cublas()), and a mutex there cost a lock per launch; the lock is taken only to create one.
std::atomic<DeviceState*> states[kMaxDevices] = {};
thread_local int current_device = -1;

size_t round_size(size_t nbytes) {
  constexpr size_t kSmall = 512, kLarge = size_t(2) << 20;
  if (nbytes < (size_t(1) << 20)) return std::max<size_t>(kSmall, (nbytes + kSmall - 1) / kSmall * kSmall);
  return (nbytes + kLarge - 1) / kLarge * kLarge;
}

DeviceState& state_of(int index) {
  TP_CHECK(index >= 0 && index < kMaxDevices, "cuda: device index {} is out of range", index);
  if (DeviceState* ready = states[index].load(std::memory_order_acquire)) return *ready;
  std::lock_guard<std::mutex> lock(states_mutex);
  if (!states[index].load(std::memory_order_relaxed)) {
    int count = 0;
    TP_CUDA_CHECK(cudaGetDeviceCount(&count), "cuda");
    TP_CHECK(index < count, "cuda: device cuda:{} does not exist; this machine has {} GPU(s)", index, count);
    auto* s = new DeviceState();  // never deleted (Note [Caching allocator])
    s->index = index;
    TP_CUDA_CHECK(cudaSetDevice(index), "cuda");
    TP_CUDA_CHECK(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking), "cuda");
    TP_CUBLAS_CHECK(cublasCreate(&s->cublas), "cuda");
    TP_CUBLAS_CHECK(cublasSetStream(s->cublas, s->stream), "cuda");
    TP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&s->error), sizeof(DeviceError)), "cuda");
    // On the stream: a plain cudaMemset runs on the legacy stream, unordered with ours.
    TP_CUDA_CHECK(cudaMemsetAsync(s->error, 0, sizeof(DeviceError), s->stream), "cuda");
    TP_CUDA_CHECK(cudaStreamSynchronize(s->stream), "cuda");
    states[index].store(s, std::memory_order_release);
    current_device = index;
  }
  return *states[index].load(std::memory_order_relaxed);
}

DeviceState& current_state() { return state_of(current_device < 0 ? 0 : current_device); }

std::mutex names_mutex;
std::vector<std::string>& op_names() {
  static auto* names = new std::vector<std::string>();
  return *names;
}

// Reads and clears the device's error flag (after the stream is synchronised) and throws the
// error it holds, if any.
void raise_pending_error(DeviceState& s) {
  DeviceError found{};
  TP_CUDA_CHECK(cudaMemcpyAsync(&found, s.error, sizeof found, cudaMemcpyDeviceToHost, s.stream), "synchronize");
  TP_CUDA_CHECK(cudaStreamSynchronize(s.stream), "synchronize");
  if (found.code == kNoError) return;
  TP_CUDA_CHECK(cudaMemsetAsync(s.error, 0, sizeof(DeviceError), s.stream), "synchronize");
  TP_CUDA_CHECK(cudaStreamSynchronize(s.stream), "synchronize");
  std::string op;
  {
    std::lock_guard<std::mutex> lock(names_mutex);
    op = found.op >= 0 && static_cast<size_t>(found.op) < op_names().size() ? op_names()[found.op] : "a kernel";
  }
  const char* what = found.code == kTargetOutOfRange ? "target" : "index";
  throw Error(fmt::format("{}: {} {} is out of range for a dimension of size {} (found on cuda:{}, reported at the "
                          "next synchronisation)", op, what, found.value, found.bound, s.index));
}

void sync_and_check(DeviceState& s, const char* op) {
  TP_CUDA_CHECK(cudaStreamSynchronize(s.stream), op);
  raise_pending_error(s);
}

}  // namespace

cudaStream_t stream() { return current_state().stream; }
cublasHandle_t cublas() { return current_state().cublas; }
DeviceError* device_error() { return current_state().error; }
void check_device_errors() { raise_pending_error(current_state()); }

int op_id(const char* op) {
  std::lock_guard<std::mutex> lock(names_mutex);
  auto& names = op_names();
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == op) return static_cast<int>(i);
  names.emplace_back(op);
  return static_cast<int>(names.size() - 1);
}

}  // namespace tapestry::kernels::cuda

namespace tapestry::cuda {

using kernels::cuda::DeviceState;
using kernels::cuda::state_of;

bool built() { return true; }

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error so later calls start clean
    return 0;
  }
  return count;
}

bool is_available() { return device_count() > 0; }

std::string unavailable_reason() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return fmt::format("no usable CUDA device: cudaGetDeviceCount: {}", cudaGetErrorString(err));
  }
  return count > 0 ? std::string() : std::string("no CUDA device on this machine");
}

void synchronize(Device device) {
  if (!device.is_cuda()) return;
  runtime::count_sync();
  detail::set_device(device);
  kernels::cuda::sync_and_check(state_of(device.index), "synchronize");
}

MemoryStats memory_stats(Device device) {
  if (!device.is_cuda() || !is_available()) return {};
  DeviceState& s = state_of(device.index);
  std::lock_guard<std::mutex> lock(s.mutex);
  return {s.allocated, s.reserved, s.peak_allocated, s.device_mallocs};
}

void reset_peak_memory(Device device) {
  if (!device.is_cuda() || !is_available()) return;
  DeviceState& s = state_of(device.index);
  std::lock_guard<std::mutex> lock(s.mutex);
  s.peak_allocated = s.allocated;
}

void empty_cache(Device device) {
  if (!device.is_cuda() || !is_available()) return;
  DeviceState& s = state_of(device.index);
  detail::set_device(device);
  TP_CUDA_CHECK(cudaStreamSynchronize(s.stream), "empty_cache");
  std::lock_guard<std::mutex> lock(s.mutex);
  for (auto& [size, ptr] : s.free_blocks) {
    cudaFree(ptr);
    s.block_size.erase(ptr);
    s.reserved -= static_cast<int64_t>(size);
  }
  s.free_blocks.clear();
}


bool bf16_supported(Device device, std::string* why) {
  auto no = [&](const std::string& reason) {
    if (why) *why = reason;
    return false;
  };
  if (!device.is_cuda()) return no(device_name(device) + " is not a CUDA device");
  const int count = device_count();
  if (device.index >= count) return no(device_name(device) + ": " + (count ? "no such GPU" : unavailable_reason()));
  // Cached per device: autocast asks at every matmul.
  static std::atomic<int> major[kernels::cuda::kMaxDevices] = {};
  int m = major[device.index].load(std::memory_order_relaxed);
  if (m == 0) {
    TP_CUDA_CHECK(cudaDeviceGetAttribute(&m, cudaDevAttrComputeCapabilityMajor, device.index), "bf16_supported");
    major[device.index].store(m, std::memory_order_relaxed);
  }
  // cuBLAS's bfloat16 gemms with float32 accumulation need compute capability 8.0 (Ampere) or later.
  if (m < 8) return no(fmt::format("{} has compute capability {}.x; bfloat16 gemms need 8.0 or later",
                                   device_name(device), m));
  return true;
}

namespace {
std::atomic<AttentionKernel> attention_choice{AttentionKernel::Auto};
}  // namespace
void set_attention_kernel(AttentionKernel kernel) { attention_choice = kernel; }
AttentionKernel attention_kernel() { return attention_choice; }

namespace detail {

void set_device(Device device) {
  TP_CHECK(device.is_cuda(), "set_device: {} is not a CUDA device", device_name(device));
  if (kernels::cuda::current_device == device.index) return;
  state_of(device.index);  // creates the stream and handle on first use
  TP_CUDA_CHECK(cudaSetDevice(device.index), "set_device");
  kernels::cuda::current_device = device.index;
}

void wait_for_stream(Device device) noexcept {
  if (!device.is_cuda()) return;
  runtime::count_sync();
  cudaStreamSynchronize(kernels::cuda::stream());  // the current device's: set_device ran before the kernel
}

void* stream(Device device) {
  set_device(device);
  return state_of(device.index).stream;
}

void* allocate(size_t nbytes, Device device) {
  set_device(device);
  DeviceState& s = state_of(device.index);
  const size_t size = kernels::cuda::round_size(nbytes);
  std::lock_guard<std::mutex> lock(s.mutex);
  void* ptr = nullptr;
  auto it = s.free_blocks.lower_bound(size);
  if (it != s.free_blocks.end() && it->first <= size + size / 8) {
    ptr = it->second;
    s.free_blocks.erase(it);
  } else {
    cudaError_t err = cudaMalloc(&ptr, size);
    if (err == cudaErrorMemoryAllocation) {  // give the cache back to the driver and try once more
      cudaGetLastError();
      TP_CUDA_CHECK(cudaStreamSynchronize(s.stream), "Storage");
      for (auto& [cached, p] : s.free_blocks) {
        cudaFree(p);
        s.block_size.erase(p);
        s.reserved -= static_cast<int64_t>(cached);
      }
      s.free_blocks.clear();
      err = cudaMalloc(&ptr, size);
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      throw Error(fmt::format("Storage: out of memory on cuda:{} allocating {} bytes ({} bytes in tensors, {} held): {}",
                              device.index, nbytes, s.allocated, s.reserved, cudaGetErrorString(err)));
    }
    s.block_size[ptr] = size;
    s.reserved += static_cast<int64_t>(size);
    ++s.device_mallocs;
  }
  s.allocated += static_cast<int64_t>(s.block_size[ptr]);
  s.peak_allocated = std::max(s.peak_allocated, s.allocated);
  return ptr;
}

void release(void* ptr, size_t, Device device) noexcept {
  if (!ptr || !device.is_cuda() || device.index < 0 || device.index >= kernels::cuda::kMaxDevices) return;
  DeviceState* s = kernels::cuda::states[device.index].load(std::memory_order_acquire);
  if (!s) return;
  std::lock_guard<std::mutex> lock(s->mutex);
  auto it = s->block_size.find(ptr);
  if (it == s->block_size.end()) return;
  s->allocated -= static_cast<int64_t>(it->second);
  s->free_blocks.emplace(it->second, ptr);  // reusable at once (Note [One stream])
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) {
  if (nbytes == 0) return;
  if (!dst_device.is_cuda() && !src_device.is_cuda()) {  // host memory both (the emulated device's is)
    std::memcpy(dst, src, nbytes);
    return;
  }
  if (src_device.is_cuda() && !dst_device.is_cuda()) {  // to the host: wait, then report device errors
    set_device(src_device);
    DeviceState& s = state_of(src_device.index);
    TP_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, s.stream), "copy_");
    kernels::cuda::sync_and_check(s, "copy_");
    return;
  }
  if (!src_device.is_cuda()) {  // from the host: synchronous, since the host buffer may go away next
    set_device(dst_device);
    DeviceState& s = state_of(dst_device.index);
    TP_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, s.stream), "copy_");
    TP_CUDA_CHECK(cudaStreamSynchronize(s.stream), "copy_");
    return;
  }
  // GPU to GPU: order after the source's work, copy on the destination's stream.
  set_device(src_device);
  TP_CUDA_CHECK(cudaStreamSynchronize(state_of(src_device.index).stream), "copy_");
  set_device(dst_device);
  DeviceState& d = state_of(dst_device.index);
  TP_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device.index, src, src_device.index, nbytes, d.stream), "copy_");
  // Wait: the source's stream must not reuse or overwrite the source while the copy reads it.
  TP_CUDA_CHECK(cudaStreamSynchronize(d.stream), "copy_");
}

}  // namespace detail

}  // namespace tapestry::cuda
