// What every file of the CUDA backend shares: error checks that turn CUDA and cuBLAS failures
// into tapestry::Error naming the call and the op, the device's stream and cuBLAS handle, the
// device-side error flag (data checks without host copies), launch sizes, and StridedIndexer,
// which maps a linear element index to the offsets of K strided operands (broadcasting included:
// a broadcast dim has stride 0). Kernels run on stream(); nothing here synchronises.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>

#include "tapestry/ops/detail/backend.h"
#include "tapestry/ops/cuda.h"
#include "tapestry/ops/factory.h"
#include "tapestry/ops/detail/math.h"
#include "tapestry/ops/runtime.h"

namespace tapestry::kernels::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* op);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* op);

}  // namespace tapestry::kernels::cuda

// TP_CUDA_CHECK(cudaMemcpyAsync(...), "copy_"): an Error "copy_: cudaMemcpyAsync(...) failed: <reason>".
#define TP_CUDA_CHECK(call, op)                                                         \
  do {                                                                                  \
    cudaError_t tp_cuda_err = (call);                                                   \
    if (tp_cuda_err != cudaSuccess) ::tapestry::kernels::cuda::throw_cuda_error(tp_cuda_err, #call, op); \
  } while (0)
#define TP_CUBLAS_CHECK(call, op)                                                       \
  do {                                                                                  \
    cublasStatus_t tp_cublas_status = (call);                                           \
    if (tp_cublas_status != CUBLAS_STATUS_SUCCESS)                                      \
      ::tapestry::kernels::cuda::throw_cublas_error(tp_cublas_status, #call, op);       \
  } while (0)
// After every kernel launch: a bad launch configuration is reported here, naming the op.
// Each launch is counted (ops/runtime.h: tapestry bench reports launches per step).
#define TP_CUDA_LAUNCHED(op)             \
  do {                                   \
    ::tapestry::runtime::count_launch(); \
    TP_CUDA_CHECK(cudaGetLastError(), op); \
  } while (0)

namespace tapestry::kernels::cuda {

// The current device's stream (one per device, made on first use) and its cuBLAS handle.
cudaStream_t stream();
cublasHandle_t cublas();

// ---- the device-side error flag. A kernel that finds bad data (an index out of range) records
// the first such finding here with report_error(); synchronize() (and every copy to the host)
// reads it and throws "<op>: index <value> is out of range for a dimension of size <bound>".
enum ErrorCode : int { kNoError = 0, kIndexOutOfRange = 1, kTargetOutOfRange = 2 };
struct DeviceError {
  int code;
  int op;  // op_id() of the op's name
  long long value, bound;
};
DeviceError* device_error();        // the current device's flag (device memory)
// After the stream was synchronised anyway: raises a pending device-side error now (free).
void check_device_errors();
int op_id(const char* op);          // interns an op name for DeviceError::op (host)
__device__ inline void report_error(DeviceError* flag, int code, int op, long long value, long long bound) {
  if (atomicCAS(&flag->code, 0, code) == 0) {
    flag->op = op;
    flag->value = value;
    flag->bound = bound;
  }
}

// ---- launch sizes: grid-stride loops over n elements with kThreads per block.
constexpr int kThreads = 256;
inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(b, 65535LL * 32)));
}
#define TP_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); i += static_cast<int64_t>(blockDim.x) * gridDim.x)

// ---- strided operands
constexpr int kMaxDims = 16;

// Passed to kernels by value: the shape and each operand's strides (in elements).
template <int K>
struct StridedIndexer {
  int ndim = 0;
  // Fewer than 2^31 elements: the divisions that split an index into coordinates run in 32 bits
  // (a 64-bit division is a long software sequence on a GPU); the offsets stay 64-bit.
  bool narrow = false;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[K][kMaxDims] = {};

  // offsets[k] = operand k's element offset of the element with row-major index `linear`.
  __device__ __host__ void offsets(int64_t linear, int64_t (&off)[K]) const {
    for (int k = 0; k < K; ++k) off[k] = 0;
    if (narrow) {
      uint32_t rest = static_cast<uint32_t>(linear);
      for (int d = ndim - 1; d >= 0; --d) {
        const uint32_t size = static_cast<uint32_t>(sizes[d]), i = rest % size;
        rest /= size;
        for (int k = 0; k < K; ++k) off[k] += static_cast<int64_t>(i) * strides[k][d];
      }
      return;
    }
    for (int d = ndim - 1; d >= 0; --d) {
      const int64_t i = linear % sizes[d];
      linear /= sizes[d];
      for (int k = 0; k < K; ++k) off[k] += i * strides[k][d];
    }
  }
};

// An indexer over `shape` for operands with the given strides; size-1 dims are dropped (a 0-d
// shape gives ndim 0: one element at offset 0).
template <int K>
StridedIndexer<K> make_indexer(const Shape& shape, const std::array<Shape, K>& strides) {
  StridedIndexer<K> ix;
  int64_t n = 1;
  for (int64_t size : shape) n *= size;
  ix.narrow = n < (int64_t(1) << 31);
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    ix.sizes[ix.ndim] = shape[d];
    for (int k = 0; k < K; ++k) ix.strides[k][ix.ndim] = strides[k][d];
    ++ix.ndim;
  }
  return ix;
}

// A fresh contiguous tensor on `device`.
inline Tensor empty_on(const Shape& shape, DType dtype, Device device) {
  return empty(shape, TensorOptions(dtype, device));
}

// Typed device pointer to t's first element (offset applied); T must match t's dtype.
template <class T> inline T* ptr(const Tensor& t) { return t.data_ptr<T>(); }

}  // namespace tapestry::kernels::cuda
