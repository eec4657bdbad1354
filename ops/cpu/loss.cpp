// CPU kernel of the fused log-softmax + label-smoothed cross-entropy (see kernels.h). Rows are
// independent; the loss is summed in a fixed order afterwards (Note [Deterministic reductions]).
//
// Note [Row statistics]: each row's log-sum-exp is kept as two numbers, its max and the log of
// sum(exp(x - max)), [N, 2] (the fused attention keeps its rows' the same way), and every log
// probability is formed as (x - max) - log_sum. Adding them first, x - (max + log_sum), rounds
// the log-sum away at large magnitudes: float64 [1e300, 1e300] would give log p = 0, not -log 2,
// and float32 logits near 1e4 lose 2.4e-4. The CUDA kernels (ops/cuda/loss.cu) do the same.
#include <cmath>

#include "tapestry/ops/cpu/loops.h"
#include "tapestry/ops/factory.h"
#include "tapestry/ops/detail/backend.h"
#include "tapestry/ops/profile.h"

namespace tapestry::kernels::cpu {

namespace {

// The target values (the dispatcher checked shapes, dtypes and eps).
void check_targets(const Tensor& logits, const Tensor& target, int64_t ignore_index) {
  std::vector<int64_t> t = target.to_vector<int64_t>();
  for (size_t i = 0; i < t.size(); ++i)
    TP_CHECK(t[i] == ignore_index || (t[i] >= 0 && t[i] < logits.size(1)),
             "cross_entropy: target {} in row {} is out of range for {} classes", t[i], i, logits.size(1));
}

}  // namespace

CrossEntropyOut cross_entropy(const Tensor& logits_in, const Tensor& target_in, double eps, int64_t ignore_index,
                              bool mean) {
  TP_PROFILE("cross_entropy");
  check_targets(logits_in, target_in, ignore_index);
  Tensor logits = contiguous(logits_in), target = contiguous(target_in);
  const int64_t N = logits.size(0), V = logits.size(1);
  Smoothing q = smoothing_for(eps, V, ignore_index);
  CrossEntropyOut out{Tensor(), empty({N, 2}, logits.options()), Tensor()};  // lse: Note [Row statistics]
  std::vector<double> row_loss(static_cast<size_t>(N), 0.0);
  const int64_t* pt = target.data_ptr<int64_t>();
  dispatch_floating(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = logits.data_ptr<T>();
    T* plse = out.lse.data_ptr<T>();
    cpu::parallel_for(0, N, std::max<int64_t>(1, cpu::kGrainSize / std::max<int64_t>(1, V)), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const T* x = px + r * V;
        T mx = x[0];
#pragma omp simd reduction(max : mx)
        for (int64_t j = 1; j < V; ++j) mx = std::max(mx, x[j]);
        // Sums in T over chunks (vectorized lanes), chunks added in double: a float lane then
        // adds at most 1024 / width terms. sum_x (of x - max) is only needed with smoothing, and
        // is summed in double throughout: a -1e9 logit (a masked class) beside logits near 0
        // would swallow them in float32 (its spacing there is 64), and the -1e9 cancels later
        // against the skipped class's own term.
        double se = 0, sum_x = 0;
        const double mx_d = static_cast<double>(mx);
        constexpr int64_t kChunk = 1024;
        for (int64_t j0 = 0; j0 < V; j0 += kChunk) {
          const int64_t j1 = std::min(V, j0 + kChunk);
          T chunk_se = 0;
          double chunk_x = 0;
#pragma omp simd reduction(+ : chunk_se)
          for (int64_t j = j0; j < j1; ++j) chunk_se += vexp(x[j] - mx);
          if (q.other > 0) {
#pragma omp simd reduction(+ : chunk_x)
            for (int64_t j = j0; j < j1; ++j) chunk_x += static_cast<double>(x[j]) - mx_d;
          }
          se += chunk_se, sum_x += chunk_x;
        }
        const double log_se = std::log(se);
        plse[2 * r] = mx;
        plse[2 * r + 1] = static_cast<T>(log_se);
        if (pt[r] == ignore_index) continue;
        // log p_j = (x_j - max) - log_se. -sum_j q_j log p_j with q = other everywhere, then
        // corrected at gold and skip. Classes with q_j = 0 contribute nothing even at x_j = -inf
        // (0 log 0 = 0): when eps is 0 they are never summed, and when a masked (-inf) logit
        // makes the shortcut's sum non-finite, the row is summed again class by class.
        auto log_p = [&](int64_t j) { return (static_cast<double>(x[j]) - static_cast<double>(mx)) - log_se; };
        double gold_lp = log_p(pt[r]);
        double other_lp = 0;
        if (q.other > 0) {
          double skip_lp = q.skip >= 0 ? log_p(q.skip) : 0.0;
          other_lp = sum_x - static_cast<double>(V) * log_se - gold_lp - skip_lp;
          if (!std::isfinite(other_lp)) {
            other_lp = 0;
            for (int64_t j = 0; j < V; ++j)
              if (j != pt[r] && j != q.skip) other_lp += log_p(j);
          }
        }
        row_loss[static_cast<size_t>(r)] = -(q.gold * gold_lp + (q.other > 0 ? q.other * other_lp : 0.0));
      }
    });
  });
  double total = 0;
  int64_t count = 0;
  for (int64_t r = 0; r < N; ++r) {
    total += row_loss[static_cast<size_t>(r)];
    count += pt[r] != ignore_index;
  }
  // In the logits' dtype, as the loss and its scale are kept: loss = T(total) * T(scale).
  const double scale = mean ? (count > 0 ? 1.0 / static_cast<double>(count) : 0.0) : 1.0;
  dispatch_floating(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    out.scale = scalar_tensor(static_cast<T>(scale), logits.options());
    out.loss = scalar_tensor(static_cast<T>(total) * static_cast<T>(scale), logits.options());
  });
  return out;
}

Tensor cross_entropy_backward(const Tensor& logits_in, const Tensor& target_in, const Tensor& lse, double eps,
                              int64_t ignore_index, const Tensor& scale) {
  TP_PROFILE("cross_entropy_backward");
  Tensor logits = contiguous(logits_in), target = contiguous(target_in);
  const int64_t N = logits.size(0), V = logits.size(1);
  Smoothing q = smoothing_for(eps, V, ignore_index);
  Tensor grad = empty({N, V}, logits.options());
  const int64_t* pt = target.data_ptr<int64_t>();
  dispatch_floating(logits.dtype(), "cross_entropy_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = logits.data_ptr<T>();
    const T* plse = lse.data_ptr<T>();
    T* pg = grad.data_ptr<T>();
    // d/dx_j of -sum_k q_k (x_k - lse) is total(q) * softmax_j - q_j.
    const T s = *scale.data_ptr<T>(), q_other = static_cast<T>(q.other), q_total = static_cast<T>(q.total);
    cpu::parallel_for(0, N, std::max<int64_t>(1, cpu::kGrainSize / std::max<int64_t>(1, V)), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        T* g = pg + r * V;
        if (pt[r] == ignore_index) {
          std::fill(g, g + V, T(0));
          continue;
        }
        const T* x = px + r * V;
        const T mx = plse[2 * r], log_se = plse[2 * r + 1];
#pragma omp simd
        for (int64_t j = 0; j < V; ++j) g[j] = (q_total * vexp((x[j] - mx) - log_se) - q_other) * s;
        g[pt[r]] -= static_cast<T>(q.gold - q.other) * s;
        if (q.skip >= 0) g[q.skip] += q_other * s;
      }
    });
  });
  return grad;
}

}  // namespace tapestry::kernels::cpu
