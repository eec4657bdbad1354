// CUDA kernels of the fused log-softmax + label-smoothed cross-entropy, the kernels::cuda half of
// ops/cpu/loss.cpp: the target distribution q, ignore_index, the per-row log-sum-exp and the
// loss are defined there (and in ops/detail/kernels.h); checks and messages are the CPU's.
//
// Design. Forward: one group of threads per row of logits [N, V] (a warp up to a block, chosen
// from V, as in ops/cuda/reduce.cu) finds the row's max, its sum of exp (vexp, as the CPU) and,
// with smoothing, its sum of x - max, all accumulated in double; it writes the row's lse (max and
// log sum: Note [Row statistics] in ops/cpu/loss.cpp), loss and
// whether it counts. One block then adds the rows' losses and counts in a fixed order, so the
// loss is the same from run to run. Backward is elementwise over [N, V]: it needs only the
// logits and each row's lse. Targets are checked on the device, never copied to the host: a
// target that is neither ignore_index nor a class is reported through the device error flag
// (raised by the next synchronize() or copy to the host) and its row is skipped, never indexed.
#include <cfloat>
#include <cstdint>
#include <limits>

#include "tapestry/ops/cuda/group_reduce.cuh"

namespace tapestry::kernels::cuda {

namespace {

template <class A> struct SumOp {
  __device__ A operator()(A x, A y) const { return x + y; }
};
// NaN wins (a NaN logit makes its row NaN either way); commutative, so every lane agrees.
template <class A> struct MaxOp {
  __device__ A operator()(A x, A y) const { return op::Maximum{}(x, y); }
};

__device__ inline bool is_finite(double v) { return fabs(v) <= DBL_MAX; }  // false for inf and NaN

// Per row: lse, the loss (0 when not counted) and whether it counts.
template <class T>
__global__ void cross_entropy_kernel(const T* logits, const int64_t* target, T* lse_out, double* row_loss,
                                     int64_t* row_counted, int64_t N, int64_t V, Smoothing q, int64_t ignore_index,
                                     DeviceError* flag, int opid) {
  // `first` stays uniform across the block: group_reduce synchronises it.
  for (int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.y); first < N;
       first += static_cast<int64_t>(gridDim.x) * blockDim.y) {
    const int64_t row = first + threadIdx.y;
    const bool valid = row < N;
    const T* x = logits + (valid ? row : 0) * V;
    T mx = -std::numeric_limits<T>::infinity();
    if (valid)
      for (int64_t j = threadIdx.x; j < V; j += blockDim.x) mx = MaxOp<T>{}(mx, x[j]);
    mx = group_reduce(mx, MaxOp<T>{});
    double sum_exp = 0, sum_x = 0;  // sum_x (of x - max) is only needed with smoothing
    if (valid)
      for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
        sum_exp += vexp(x[j] - mx);
        if (q.other > 0) sum_x += static_cast<double>(x[j]) - static_cast<double>(mx);
      }
    sum_exp = group_reduce(sum_exp, SumOp<double>{});
    sum_x = group_reduce(sum_x, SumOp<double>{});
    // log p_j = (x_j - max) - log_se, never x_j - (max + log_se) (Note [Row statistics] in ops/cpu/loss.cpp).
    const double log_se = math::log(sum_exp);
    auto log_p = [&](int64_t j) { return (static_cast<double>(x[j]) - static_cast<double>(mx)) - log_se; };

    const int64_t t = valid ? target[row] : ignore_index;
    const bool counted = valid && t != ignore_index && t >= 0 && t < V;
    // -sum_j q_j log p_j with q = other everywhere, then corrected at gold and skip.
    double gold_lp = 0, other_lp = 0;
    if (counted) {
      gold_lp = log_p(t);
      if (q.other > 0) {
        const double skip_lp = q.skip >= 0 ? log_p(q.skip) : 0.0;
        other_lp = sum_x - static_cast<double>(V) * log_se - gold_lp - skip_lp;
      }
    }
    // Classes with q_j = 0 contribute nothing even at x_j = -inf (0 log 0 = 0): when a masked
    // logit makes the shortcut non-finite, the row is summed again class by class. Every thread
    // takes part in that reduction (it synchronises the block); only such rows loop.
    const bool resum = counted && q.other > 0 && !is_finite(other_lp);
    double resummed = 0;
    if (resum)
      for (int64_t j = threadIdx.x; j < V; j += blockDim.x)
        if (j != t && j != q.skip) resummed += log_p(j);
    resummed = group_reduce(resummed, SumOp<double>{});
    if (resum) other_lp = resummed;

    if (!valid || threadIdx.x != 0) continue;
    lse_out[2 * row] = mx;
    lse_out[2 * row + 1] = static_cast<T>(log_se);
    if (t != ignore_index && !counted) report_error(flag, kTargetOutOfRange, opid, t, V);
    row_loss[row] = counted ? -(q.gold * gold_lp + (q.other > 0 ? q.other * other_lp : 0.0)) : 0.0;
    row_counted[row] = counted ? 1 : 0;
  }
}

// One block of kThreads: the rows' losses and counts added in a fixed order, then the loss and the
// scale (1 for a sum, 1 / count for a mean, 0 when no row counts) written in T, as the CPU does.
template <class T>
__global__ void cross_entropy_total_kernel(const double* row_loss, const int64_t* row_counted, int64_t N, bool mean,
                                           T* loss_out, T* scale_out) {
  double loss = 0;
  int64_t counted = 0;
  for (int64_t r = threadIdx.x; r < N; r += blockDim.x) {
    loss += row_loss[r];
    counted += row_counted[r];
  }
  loss = group_reduce(loss, SumOp<double>{});
  counted = group_reduce(counted, SumOp<int64_t>{});
  if (threadIdx.x == 0) {
    const T scale = static_cast<T>(mean ? (counted > 0 ? 1.0 / static_cast<double>(counted) : 0.0) : 1.0);
    *loss_out = static_cast<T>(loss) * scale;
    *scale_out = scale;
  }
}

// d/dx_j of -sum_k q_k (x_k - lse) is total(q) * softmax_j - q_j; rows not counted get 0.
template <class T>
__global__ void cross_entropy_backward_kernel(const T* logits, const int64_t* target, const T* lse, T* grad,
                                              int64_t N, int64_t V, Smoothing q, int64_t ignore_index, const T* scale,
                                              DeviceError* flag, int opid) {
  const T s = *scale, q_other = static_cast<T>(q.other), q_total = static_cast<T>(q.total);
  const T gold_extra = static_cast<T>(q.gold - q.other);
  TP_GRID_STRIDE(i, N * V) {
    const int64_t r = i / V, j = i - r * V;
    const int64_t t = target[r];
    if (t == ignore_index) {
      grad[i] = T(0);
      continue;
    }
    if (t < 0 || t >= V) {  // forward reported it too; one report per row is plenty
      if (j == 0) report_error(flag, kTargetOutOfRange, opid, t, V);
      grad[i] = T(0);
      continue;
    }
    T g = (q_total * vexp((logits[i] - lse[2 * r]) - lse[2 * r + 1]) - q_other) * s;
    if (j == t) g -= gold_extra * s;
    if (j == q.skip) g += q_other * s;
    grad[i] = g;
  }
}

}  // namespace

CrossEntropyOut cross_entropy(const Tensor& logits_in, const Tensor& target_in, double eps, int64_t ignore_index,
                              bool mean) {
  TP_CHECK(eps >= 0 && eps < 1, "cross_entropy: label smoothing must be in [0, 1), got {}", eps);
  const int64_t N = logits_in.size(0), V = logits_in.size(1);
  const Device device = logits_in.device();
  const Smoothing q = smoothing_for(eps, V, ignore_index);
  CrossEntropyOut out{empty_on({}, logits_in.dtype(), device), empty_on({N, 2}, logits_in.dtype(), device),
                      empty_on({}, logits_in.dtype(), device)};
  dispatch_floating(logits_in.dtype(), "cross_entropy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (N == 0) {  // no rows: nothing to count
      fill_(out.loss, 0.0);
      fill_(out.scale, mean ? 0.0 : 1.0);
      return;
    }
    Tensor logits = contiguous(logits_in), target = contiguous(target_in);
    Tensor row_loss = empty_on({N}, DType::Float64, device);  // [N]
    Tensor row_counted = empty_on({N}, DType::Int64, device);  // [N], 0 or 1
    const int group = group_size(V);
    cross_entropy_kernel<T><<<blocks_for(N, kThreads / group), dim3(group, kThreads / group), 0, stream()>>>(
        logits.data_ptr<T>(), target.data_ptr<int64_t>(), out.lse.data_ptr<T>(), row_loss.data_ptr<double>(),
        row_counted.data_ptr<int64_t>(), N, V, q, ignore_index, device_error(), op_id("cross_entropy"));
    TP_CUDA_LAUNCHED("cross_entropy");
    cross_entropy_total_kernel<T><<<1, dim3(kThreads, 1), 0, stream()>>>(
        row_loss.data_ptr<double>(), row_counted.data_ptr<int64_t>(), N, mean, out.loss.data_ptr<T>(),
        out.scale.data_ptr<T>());
    TP_CUDA_LAUNCHED("cross_entropy");
    // Nothing comes back to the host: a bad target sets the error flag, which the next
    // synchronisation (the Trainer's loss read) reports.
  });
  return out;
}

Tensor cross_entropy_backward(const Tensor& logits_in, const Tensor& target_in, const Tensor& lse_in, double eps,
                              int64_t ignore_index, const Tensor& scale) {
  // The CPU trusts its caller here; on the GPU a mismatch would read out of bounds.
  const int64_t N = logits_in.size(0), V = logits_in.size(1);
  TP_CHECK(lse_in.numel() == 2 * N && lse_in.dtype() == logits_in.dtype(),
           "cross_entropy_backward: lse must be {} [{}, 2] to match logits {}, got {} {}", logits_in.dtype(), N,
           logits_in.sizes(), lse_in.dtype(), lse_in.sizes());
  const Smoothing q = smoothing_for(eps, V, ignore_index);
  Tensor grad = empty_on({N, V}, logits_in.dtype(), logits_in.device());  // [N, V]
  dispatch_floating(logits_in.dtype(), "cross_entropy_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (grad.numel() == 0) return;
    Tensor logits = contiguous(logits_in), target = contiguous(target_in), lse = contiguous(lse_in);
    cross_entropy_backward_kernel<T><<<blocks_for(N * V), kThreads, 0, stream()>>>(
        logits.data_ptr<T>(), target.data_ptr<int64_t>(), lse.data_ptr<T>(), grad.data_ptr<T>(), N, V, q,
        ignore_index, scale.data_ptr<T>(), device_error(), op_id("cross_entropy_backward"));
    TP_CUDA_LAUNCHED("cross_entropy_backward");
  });
  return grad;
}

}  // namespace tapestry::kernels::cuda
