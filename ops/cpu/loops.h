// The CPU loop machinery every kernel uses: parallel_for over an index range (OpenMP above a
// grain size, serial inside an existing parallel region) and strided_apply, which walks K
// strided operands of one shape in runs along their innermost (coalesced) dim.
// Work is split by index range only, so elementwise results never depend on the thread count.
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "tapestry/ops/detail/math.h"
#include "tapestry/ops/shape.h"

namespace tapestry::kernels::cpu {

// Below this many elements an op runs on one thread: spawning costs more than it saves.
constexpr int64_t kGrainSize = 32768;

template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  if (end <= begin) return;
#ifdef _OPENMP
  int64_t n = end - begin;
  if (n > grain && !omp_in_parallel() && omp_get_max_threads() > 1) {
    int64_t max_chunks = (n + grain - 1) / grain;
#pragma omp parallel num_threads(static_cast<int>(std::min<int64_t>(omp_get_max_threads(), max_chunks)))
    {
      int64_t nt = omp_get_num_threads(), tid = omp_get_thread_num();
      int64_t chunk = (n + nt - 1) / nt;
      int64_t b = begin + tid * chunk, e = std::min(end, b + chunk);
      if (b < e) f(b, e);
    }
    return;
  }
#endif
  (void)grain;
  f(begin, end);
}

// Merges adjacent dims that are contiguous with each other in every operand, so a contiguous
// tensor becomes one long run. Drops size-1 dims. strides[k] are the operand k strides.
template <size_t K>
void coalesce(Shape& shape, std::array<Shape, K>& strides) {
  Shape s;
  std::array<Shape, K> st;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !s.empty();
    for (size_t k = 0; merge && k < K; ++k) merge = st[k].back() == strides[k][d] * shape[d];
    if (merge) {
      s.back() *= shape[d];
      for (size_t k = 0; k < K; ++k) st[k].back() = strides[k][d];
    } else {
      s.push_back(shape[d]);
      for (size_t k = 0; k < K; ++k) st[k].push_back(strides[k][d]);
    }
  }
  if (s.empty()) {
    s.push_back(1);
    for (size_t k = 0; k < K; ++k) st[k].push_back(0);
  }
  shape = std::move(s);
  strides = std::move(st);
}

// Calls f(offsets, inner_strides, count) for runs of `count` elements along the innermost dim;
// offsets[k] is operand k's element offset of the run's first element.
template <size_t K, class F>
void strided_apply(Shape shape, std::array<Shape, K> strides, const F& f, int64_t grain = kGrainSize) {
  int64_t total = shape_numel(shape);
  if (total == 0) return;
  coalesce(shape, strides);
  const int64_t nd = static_cast<int64_t>(shape.size());
  const int64_t inner = shape[nd - 1];
  std::array<int64_t, K> inner_strides;
  for (size_t k = 0; k < K; ++k) inner_strides[k] = strides[k][nd - 1];

  parallel_for(0, total, grain, [&](int64_t begin, int64_t end) {
    // Multi-index of `begin`, then walk forward run by run.
    int64_t idx[16] = {0};
    int64_t rem = begin;
    for (int64_t d = nd - 1; d >= 0; --d) {
      idx[d] = rem % shape[d];
      rem /= shape[d];
    }
    while (begin < end) {
      std::array<int64_t, K> off{};
      for (size_t k = 0; k < K; ++k)
        for (int64_t d = 0; d < nd; ++d) off[k] += idx[d] * strides[k][d];
      int64_t run = std::min(inner - idx[nd - 1], end - begin);
      f(off, inner_strides, run);
      begin += run;
      idx[nd - 1] += run;
      for (int64_t d = nd - 1; d > 0 && idx[d] == shape[d]; --d) {
        idx[d] = 0;
        ++idx[d - 1];
      }
    }
  });
}

}  // namespace tapestry::kernels::cpu
