// Reductions across a group of threads, shared by the row kernels (reduce.cu, loss.cu,
// attention.cu): G = blockDim.x threads (a multiple of 32, at most kThreads) per row and
// blockDim.y rows per block. Warps combine with shuffles, then a group's warps combine in order
// through shared memory, so the result does not depend on timing.
#pragma once
#include "tapestry/ops/cuda/common.cuh"

namespace tapestry::kernels::cuda {

__device__ inline float shfl_xor(float v, int lane_mask) { return __shfl_xor_sync(0xffffffffu, v, lane_mask); }
__device__ inline double shfl_xor(double v, int lane_mask) { return __shfl_xor_sync(0xffffffffu, v, lane_mask); }
__device__ inline int64_t shfl_xor(int64_t v, int lane_mask) {
  return static_cast<int64_t>(__shfl_xor_sync(0xffffffffu, static_cast<long long>(v), lane_mask));
}

// Every thread of the block must call this, the same number of times (it synchronises the block
// when G > 32); every thread of a group gets its group's result. Other value types need a
// shfl_xor overload beside them (found by argument-dependent lookup).
template <class A, class Op>
__device__ A group_reduce(A v, Op combine) {
  __shared__ A warp_results[kThreads / 32];
  for (int lane_mask = 16; lane_mask > 0; lane_mask >>= 1) v = combine(v, shfl_xor(v, lane_mask));
  if (blockDim.x == 32) return v;
  const int warps = static_cast<int>(blockDim.x / 32), first_warp = static_cast<int>(threadIdx.y) * warps;
  __syncthreads();  // the previous call's readers are done with warp_results
  if (threadIdx.x % 32 == 0) warp_results[first_warp + threadIdx.x / 32] = v;
  __syncthreads();
  A acc = warp_results[first_warp];
  for (int w = 1; w < warps; ++w) acc = combine(acc, warp_results[first_warp + w]);
  return acc;
}

// Enough threads per row for about 8 elements each, from a warp up to a block.
inline int group_size(int64_t row_len) {
  int group = 32;
  while (group < kThreads && group * 8 < row_len) group *= 2;
  return group;
}

}  // namespace tapestry::kernels::cuda
