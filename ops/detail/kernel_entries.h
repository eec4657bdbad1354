// The kernel entry points: one row each, the only place an entry is written down. A row is
//   TP_KERNEL(return type, name, (parameters), (arguments), check)
// and this file is included (no guard, on purpose) with TP_KERNEL defined to what the includer
// needs: ops/detail/kernels.h declares the dispatching entries that autograd calls, in namespace
// tapestry::kernels; ops/detail/backend.h declares each backend's definitions, in kernels::cpu
// (ops/cpu/) and kernels::cuda (ops/cuda/; ops/no_cuda.cpp in a build without it); and
// ops/dispatch.cpp defines the dispatching entries: run `check` (the checks that need no data:
// dtypes, shapes, in-place rules; {} when there are none), find the one device of the tensor
// arguments, and route the call to that device's backend (kernels::route in ops/dispatch.cpp).
// Parameters take no default values (the dispatcher's definition repeats them): kernels.h adds
// the short forms. The types the rows use (Binary, LayerNormOut, ...) live in ops/detail/kernels.h.
// NOLINTBEGIN(llvm-header-guard)

// out = a (op) b with broadcasting; comparisons give Bool. dtypes of a and b must match.
TP_KERNEL(Tensor, binary, (const char* op, Binary kind, const Tensor& a, const Tensor& b), (op, kind, a, b),
          check_binary(op, kind, a, b))
// In place: a = a (op) b, b broadcast to a's shape.
TP_KERNEL(void, binary_, (const char* op, Binary kind, Tensor& a, const Tensor& b), (op, kind, a, b),
          check_binary_in_place(op, kind, a, b))
// p0/p1: the exponent of PowScalar, the bounds of Clamp.
TP_KERNEL(Tensor, unary, (const char* op, Unary kind, const Tensor& a, double p0, double p1), (op, kind, a, p0, p1),
          check_unary(op, kind, p0, p1))
// cond ? a : b, all three broadcast together; cond is Bool.
TP_KERNEL(Tensor, where, (const char* op, const Tensor& cond, const Tensor& a, const Tensor& b), (op, cond, a, b),
          check_where(op, cond, a, b))
// dst = src (broadcast to dst's shape, converted to dst's dtype). Across devices the dispatcher
// stages the bytes itself (copy_between_devices); a backend copies within its own device.
TP_KERNEL(void, copy_, (const Tensor& dst, const Tensor& src), (dst, src), {
  check_copy(dst, src);
  if (dst.device() != src.device()) return copy_between_devices(dst, src);
})
TP_KERNEL(void, fill_, (const Tensor& dst, double value), (dst, value), {})

// Reduce over `dims` (wrapped, any order). Sum of Bool/Int64 gives Int64.
TP_KERNEL(Tensor, reduce, (const char* op, Reduce kind, const Tensor& a, const std::vector<int64_t>& dims,
                           bool keepdim), (op, kind, a, dims, keepdim), {})
// The sum of the squared elements of every tensor (floating, any shapes, one device), as a 0-d
// float64 tensor on that device, accumulated in double: gradient norms, in one call for a whole
// model (the CUDA backend launches once per 32 tensors, plus one; PyTorch's foreach norm does so).
TP_KERNEL(Tensor, sum_of_squares, (const std::vector<Tensor>& tensors), (tensors), {})
// Max or Min over one dim: values and int64 indices (first occurrence wins).
TP_KERNEL(TensorPair, reduce_with_index, (const char* op, Reduce kind, const Tensor& a, int64_t dim, bool keepdim),
          (op, kind, a, dim, keepdim), {})

TP_KERNEL(Tensor, softmax, (const Tensor& a, int64_t dim, bool log), (a, dim, log), {})
// Given y = softmax(x) (or log_softmax) and dy, returns dx.
TP_KERNEL(Tensor, softmax_backward, (const Tensor& y, const Tensor& dy, int64_t dim, bool log), (y, dy, dim, log), {})

// Layer norm over the last `norm_dims` dims: returns {y, mean, rstd} (mean/rstd: one per row).
// center false is RMSNorm: no mean subtracted (the mean returned is 0), rstd = 1 / sqrt(mean(x^2) + eps).
TP_KERNEL(LayerNormOut, layer_norm,
          (const Tensor& x, int64_t norm_dims, const Tensor& weight, const Tensor& bias, double eps, bool center),
          (x, norm_dims, weight, bias, eps, center), {})
TP_KERNEL(LayerNormGrads, layer_norm_backward,
          (const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd, int64_t norm_dims,
           const Tensor& weight, bool need_weight_grads, bool center),
          (dy, x, mean, rstd, norm_dims, weight, need_weight_grads, center), {})

// a [..., M, K] @ b [..., K, N] -> [..., M, N], batch dims broadcast; both at least 2-D.
TP_KERNEL(Tensor, matmul, (const Tensor& a, const Tensor& b), (a, b), {})

TP_KERNEL(Tensor, index_select, (const char* op, const Tensor& a, int64_t dim, const Tensor& index),
          (op, a, dim, index), {})
// zeros(shape) with src's slices added at `index` along dim (the backward of index_select).
TP_KERNEL(Tensor, index_add, (const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src),
          (shape, dim, index, src), {})
TP_KERNEL(Tensor, gather, (const Tensor& a, int64_t dim, const Tensor& index), (a, dim, index), {})
// zeros(shape) with src[i] added (accumulate: the backward of gather) or stored at out[..index[i]..]
// along dim. Stored duplicates: one of them wins (the last, on the CPU), as in PyTorch.
TP_KERNEL(Tensor, scatter, (const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src, bool accumulate),
          (shape, dim, index, src, accumulate), {})

// Label-smoothed cross-entropy of logits [N, V] against int64 targets [N], fused with the
// log-softmax: the target distribution q puts 1 - smoothing on the gold class, 0 on ignore_index
// (when it is a class) and spreads smoothing evenly over the remaining classes; rows whose
// target is ignore_index carry no loss. Returns the loss (summed, or its mean), each row's log-sum-exp as [max, log sum] (all
// that backward needs besides the logits) and the scale of a sum (1) or a mean (see CrossEntropyOut).
TP_KERNEL(CrossEntropyOut, cross_entropy,
          (const Tensor& logits, const Tensor& target, double smoothing, int64_t ignore_index, bool mean),
          (logits, target, smoothing, ignore_index, mean), check_cross_entropy(logits, target, smoothing))
// d loss_sum * scale / d logits = (sum(q) * softmax(logits) - q) * scale on counted rows, 0 elsewhere;
// scale is a 0-d tensor of the logits' dtype on their device, read by the kernel.
TP_KERNEL(Tensor, cross_entropy_backward,
          (const Tensor& logits, const Tensor& target, const Tensor& lse, double smoothing, int64_t ignore_index,
           const Tensor& scale),
          (logits, target, lse, smoothing, ignore_index, scale),
          check_cross_entropy_backward(logits, target, smoothing, scale))

// Fused attention softmax(scale q k^T + masking) v over leading dims [...] (batch, heads):
// q [..., Tq, E], k [..., Tk, E], v [..., Tk, Ev] -> out [..., Tq, Ev] and the softmax statistics per
// query row, as [..., Tq, 2]: the row's maximum score and log sum exp(score - maximum). mask: Bool, true = masked out, broadcast to [..., Tq, Tk], or undefined;
// is_causal masks key j > query i. Masked scores become -1e9, as MultiHeadAttention's were.
// Dropout (p > 0) drops probabilities with kernels::dropout's hash of (seed, flat index).
// No more than one block of scores is held at a time (ops/cpu/attention.cpp).
TP_KERNEL(AttentionOut, scaled_dot_product_attention,
          (const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool is_causal, double scale,
           double dropout_p, uint64_t seed),
          (q, k, v, mask, is_causal, scale, dropout_p, seed), {})
TP_KERNEL(AttentionGrads, scaled_dot_product_attention_backward,
          (const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
           const Tensor& lse, const Tensor& mask, bool is_causal, double scale, double dropout_p, uint64_t seed),
          (dout, q, k, v, out, lse, mask, is_causal, scale, dropout_p, seed), {})

// x * mask / (1 - p), the mask drawn per element from a counter-based hash of (seed, index):
// the same seed gives the same mask (so backward recomputes it instead of storing it), and
// the result does not depend on the thread count.
TP_KERNEL(Tensor, dropout, (const Tensor& x, double p, uint64_t seed), (x, p, seed), {})

TP_KERNEL(void, uniform_, (const Tensor& dst, double lo, double hi, std::mt19937_64& engine), (dst, lo, hi, engine), {})
TP_KERNEL(void, normal_, (const Tensor& dst, double mean, double std, std::mt19937_64& engine),
          (dst, mean, std, engine), {})
TP_KERNEL(void, randint_, (const Tensor& dst, int64_t low, int64_t high, std::mt19937_64& engine),
          (dst, low, high, engine), {})

// ---- sorting, scans and triangles (ops/cpu/sort.cpp)
// Order: NaN ranks above +inf (last ascending, first descending), as in PyTorch; equal values
// keep their input order. One thread handles each row, so nothing depends on the thread count.
// The CUDA backend runs cumsum, sort, multinomial and some topk calls on the host
// (ops/cuda/host_fallback.cu); count_host_round_trip makes the emulated device count them alike.

// The lower (upper = false: j - i <= diagonal) or upper (j - i >= diagonal) triangle of the last
// two dims, zeros elsewhere, batched over the leading dims; any dtype; at least 2-D. `op` names
// the caller in errors ("tril", "triu").
TP_KERNEL(Tensor, triangle, (const char* op, const Tensor& a, int64_t diagonal, bool upper), (op, a, diagonal, upper),
          check_triangle(op, a))
// Cumulative sum along dim, added in order (from the end when reverse: the backward of cumsum).
// Int64 and Bool give Int64; float32 accumulates in double, as PyTorch's CPU kernel does.
TP_KERNEL(Tensor, cumsum, (const Tensor& a, int64_t dim, bool reverse), (a, dim, reverse), count_host_round_trip(a))
// Values and int64 indices along dim, ascending or descending; any dtype. Always stable (stable
// = false is accepted: a stable order is one valid order). A 0-d tensor is its own sort.
TP_KERNEL(TensorPair, sort, (const Tensor& a, int64_t dim, bool descending, bool stable), (a, dim, descending, stable),
          count_host_round_trip(a))
// The k largest (or smallest) along dim, 0 <= k <= size of dim; not for Bool. Equal values: the
// lowest index first. sorted: in rank order; else the selected elements in input (index) order.
TP_KERNEL(TensorPair, topk, (const Tensor& a, int64_t k, int64_t dim, bool largest, bool sorted),
          (a, k, dim, largest, sorted), {
  if (!topk_on_device(k, sorted) || a.dim() == 0) count_host_round_trip(a);  // as the CUDA entry decides
})
// num_samples int64 category indices per row of probs [V] or [B, V] (float32/float64 weights,
// finite, non-negative, each row with a positive sum; they need not sum to 1). Without
// replacement, num_samples may not exceed a row's nonzero weights. One engine() draw per
// sample, rows in order then samples in order: the same engine state gives the same samples.
TP_KERNEL(Tensor, multinomial, (const Tensor& probs, int64_t num_samples, bool replacement, std::mt19937_64& engine),
          (probs, num_samples, replacement, engine), count_host_round_trip(probs))

// See AdamStep (ops/detail/kernels.h): one update of every params[i] from grads[i], exp_avgs[i] and
// exp_avg_sqs[i] (one group's tensors, in one call: the CUDA backend launches once per 48 tensors,
// as PyTorch's multi-tensor Adam does).
TP_KERNEL(void, adam_step_,
          (const std::vector<Tensor>& params, const std::vector<Tensor>& grads, const std::vector<Tensor>& exp_avgs,
           const std::vector<Tensor>& exp_avg_sqs, const AdamStep& step),
          (params, grads, exp_avgs, exp_avg_sqs, step), {
  check_adam_step(params, grads, exp_avgs, exp_avg_sqs);
  if (params.empty()) return;
})

// NOLINTEND(llvm-header-guard)
