// The kernel entry points, declared once and included three times: by ops/detail/kernels.h in
// namespace tapestry::kernels (the dispatching entries that autograd calls) and by ops/detail/backend.h
// in tapestry::kernels::cpu and tapestry::kernels::cuda (each backend's definitions). No include
// guard, on purpose. The types they use (Binary, LayerNormOut, ...) live in ops/detail/kernels.h.
// NOLINTBEGIN(llvm-header-guard)

// out = a (op) b with broadcasting; comparisons give Bool. dtypes of a and b must match.
Tensor binary(const char* op, Binary kind, const Tensor& a, const Tensor& b);
// In place: a = a (op) b, b broadcast to a's shape.
void binary_(const char* op, Binary kind, Tensor& a, const Tensor& b);
// p0/p1: the exponent of PowScalar, the bounds of Clamp.
Tensor unary(const char* op, Unary kind, const Tensor& a, double p0 = 0, double p1 = 0);
// cond ? a : b, all three broadcast together; cond is Bool.
Tensor where(const char* op, const Tensor& cond, const Tensor& a, const Tensor& b);
// dst = src (broadcast to dst's shape, converted to dst's dtype).
void copy_(const Tensor& dst, const Tensor& src);
void fill_(const Tensor& dst, double value);

// Reduce over `dims` (wrapped, any order). Sum of Bool/Int64 gives Int64.
Tensor reduce(const char* op, Reduce kind, const Tensor& a, const std::vector<int64_t>& dims, bool keepdim);
// The sum of the squared elements of every tensor (floating, any shapes, one device), as a 0-d
// float64 tensor on that device, accumulated in double: gradient norms, in one call for a whole
// model (the CUDA backend launches once per 32 tensors, plus one; PyTorch's foreach norm does so).
Tensor sum_of_squares(const std::vector<Tensor>& tensors);
// Max or Min over one dim: values and int64 indices (first occurrence wins).
std::pair<Tensor, Tensor> reduce_with_index(const char* op, Reduce kind, const Tensor& a, int64_t dim, bool keepdim);

Tensor softmax(const Tensor& a, int64_t dim, bool log);
// Given y = softmax(x) (or log_softmax) and dy, returns dx.
Tensor softmax_backward(const Tensor& y, const Tensor& dy, int64_t dim, bool log);

// Layer norm over the last `norm_dims` dims: returns {y, mean, rstd} (mean/rstd: one per row).
LayerNormOut layer_norm(const Tensor& x, int64_t norm_dims, const Tensor& weight, const Tensor& bias, double eps);
LayerNormGrads layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                   int64_t norm_dims, const Tensor& weight, bool need_weight_grads);

// a [..., M, K] @ b [..., K, N] -> [..., M, N], batch dims broadcast; both at least 2-D.
Tensor matmul(const Tensor& a, const Tensor& b);

Tensor index_select(const char* op, const Tensor& a, int64_t dim, const Tensor& index);
// zeros(shape) with src's slices added at `index` along dim (the backward of index_select).
Tensor index_add(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src);
Tensor gather(const Tensor& a, int64_t dim, const Tensor& index);
// zeros(shape) with out[..index[i]..] += src[i] along dim (the backward of gather).
Tensor scatter_add(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src);

// Label-smoothed cross-entropy of logits [N, V] against int64 targets [N], fused with the
// log-softmax: the target distribution q puts 1 - smoothing on the gold class, 0 on ignore_index
// (when it is a class) and spreads smoothing evenly over the remaining classes; rows whose
// target is ignore_index carry no loss. Returns the loss (summed, or its mean), each row's log-sum-exp (all
// that backward needs besides the logits) and the scale of a sum (1) or a mean (see CrossEntropyOut).
CrossEntropyOut cross_entropy(const Tensor& logits, const Tensor& target, double smoothing, int64_t ignore_index,
                              bool mean);
// d loss_sum * scale / d logits = (sum(q) * softmax(logits) - q) * scale on counted rows, 0 elsewhere;
// scale is a 0-d tensor of the logits' dtype on their device, read by the kernel.
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& target, const Tensor& lse, double smoothing,
                              int64_t ignore_index, const Tensor& scale);

// Fused attention softmax(scale q k^T + masking) v over leading dims [...] (batch, heads):
// q [..., Tq, E], k [..., Tk, E], v [..., Tk, Ev] -> out [..., Tq, Ev] and the softmax statistics per
// query row, as [..., Tq, 2]: the row's maximum score and log sum exp(score - maximum). mask: Bool, true = masked out, broadcast to [..., Tq, Tk], or undefined;
// is_causal masks key j > query i. Masked scores become -1e9, as MultiHeadAttention's were.
// Dropout (p > 0) drops probabilities with kernels::dropout's hash of (seed, flat index).
// No more than one block of scores is held at a time (ops/cpu/attention.cpp).
AttentionOut scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                          bool is_causal, double scale, double dropout_p, uint64_t seed);
AttentionGrads scaled_dot_product_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                                     const Tensor& v, const Tensor& out, const Tensor& lse,
                                                     const Tensor& mask, bool is_causal, double scale,
                                                     double dropout_p, uint64_t seed);

// x * mask / (1 - p), the mask drawn per element from a counter-based hash of (seed, index):
// the same seed gives the same mask (so backward recomputes it instead of storing it), and
// the result does not depend on the thread count.
Tensor dropout(const Tensor& x, double p, uint64_t seed);

void uniform_(const Tensor& dst, double lo, double hi, std::mt19937_64& engine);
void normal_(const Tensor& dst, double mean, double std, std::mt19937_64& engine);
void randint_(const Tensor& dst, int64_t low, int64_t high, std::mt19937_64& engine);

// ---- sorting, scans and triangles (ops/cpu/sort.cpp)
// Order: NaN ranks above +inf (last ascending, first descending), as in PyTorch; equal values
// keep their input order. One thread handles each row, so nothing depends on the thread count.

// The lower (upper = false: j - i <= diagonal) or upper (j - i >= diagonal) triangle of the last
// two dims, zeros elsewhere, batched over the leading dims; any dtype; at least 2-D. `op` names
// the caller in errors ("tril", "triu").
Tensor triangle(const char* op, const Tensor& a, int64_t diagonal, bool upper);
// Cumulative sum along dim, added in order (from the end when reverse: the backward of cumsum).
// Int64 and Bool give Int64; float32 accumulates in double, as PyTorch's CPU kernel does.
Tensor cumsum(const Tensor& a, int64_t dim, bool reverse = false);
// Values and int64 indices along dim, ascending or descending; any dtype. Always stable (stable
// = false is accepted: a stable order is one valid order). A 0-d tensor is its own sort.
std::pair<Tensor, Tensor> sort(const Tensor& a, int64_t dim, bool descending, bool stable);
// The k largest (or smallest) along dim, 0 <= k <= size of dim; not for Bool. Equal values: the
// lowest index first. sorted: in rank order; else the selected elements in input (index) order.
std::pair<Tensor, Tensor> topk(const Tensor& a, int64_t k, int64_t dim, bool largest, bool sorted);
// num_samples int64 category indices per row of probs [V] or [B, V] (float32/float64 weights,
// finite, non-negative, each row with a positive sum; they need not sum to 1). Without
// replacement, num_samples may not exceed a row's nonzero weights. One engine() draw per
// sample, rows in order then samples in order: the same engine state gives the same samples.
Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement, std::mt19937_64& engine);

// See AdamStep (ops/detail/kernels.h): one update of every params[i] from grads[i], exp_avgs[i] and
// exp_avg_sqs[i] (one group's tensors, in one call: the CUDA backend launches once per 48 tensors,
// as PyTorch's multi-tensor Adam does).
void adam_step_(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                const std::vector<Tensor>& exp_avgs, const std::vector<Tensor>& exp_avg_sqs, const AdamStep& step);

// NOLINTEND(llvm-header-guard)
