// The differentiable ops: every op here computes its forward with ops/detail/kernels.h and, when an
// input requires grad, records its backward rule on the tape. Each op's forward and backward sit
// together in one place (autograd/ops_*.cpp). Backward rules run with grad mode off, so they
// may use these same ops freely; under create_graph they run with it on and record, so every
// rule is written with these ops (or, for a fused kernel, gives a recorded formula or composite:
// Note [Saved tensors in a recording backward] in node.h), and gradients differentiate again.
#pragma once
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tapestry/autograd/node.h"
#include "tapestry/ops/factory.h"

namespace tapestry {

// ---- elementwise, with NumPy broadcasting (ops_elementwise.cpp)
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);
Tensor rsub(const Tensor& a, double b);  // b - a
Tensor rdiv(const Tensor& a, double b);  // b / a
Tensor neg(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor log1p(const Tensor& a);  // log(1 + x), accurate near 0
Tensor expm1(const Tensor& a);  // exp(x) - 1, accurate near 0
Tensor sqrt(const Tensor& a);
Tensor rsqrt(const Tensor& a);
Tensor pow(const Tensor& a, double exponent);
Tensor tanh(const Tensor& a);
Tensor relu(const Tensor& a);
// The exact erf form by default; approximate = "tanh" gives GPT-2's tanh form (as torch).
Tensor gelu(const Tensor& a, const std::string& approximate = "none");
// g * gelu'(x): gelu's backward as an op of its own, differentiable again (create_graph).
Tensor gelu_backward(const Tensor& g, const Tensor& x, bool tanh_form = false);
Tensor sigmoid(const Tensor& a);
Tensor abs(const Tensor& a);
Tensor clamp(const Tensor& a, double lo, double hi);
Tensor clamp_min(const Tensor& a, double lo);  // clamp(a, lo, inf)
// log(1 + exp(beta x)) / beta, and x itself where beta x > threshold (torch.nn.functional.softplus).
Tensor softplus(const Tensor& a, double beta = 1.0, double threshold = 20.0);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);

// Comparisons give Bool masks and are not differentiable.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, double b);
Tensor ne(const Tensor& a, double b);
Tensor lt(const Tensor& a, double b);
Tensor le(const Tensor& a, double b);
Tensor gt(const Tensor& a, double b);
Tensor ge(const Tensor& a, double b);
Tensor logical_not(const Tensor& mask);
Tensor logical_or(const Tensor& a, const Tensor& b);  // bool masks, broadcast

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, double b);
Tensor where(const Tensor& cond, double a, const Tensor& b);
Tensor masked_fill(const Tensor& a, const Tensor& mask, double value);

// ---- reductions (ops_reduce.cpp); empty dims = all dims
Tensor sum(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Variance with Bessel's correction by default (correction = 1), as torch.var.
Tensor var(const Tensor& a, const std::vector<int64_t>& dims = {}, int64_t correction = 1, bool keepdim = false);
Tensor max(const Tensor& a);  // over all elements
Tensor min(const Tensor& a);
struct ValuesIndices {
  Tensor values, indices;
};
ValuesIndices max(const Tensor& a, int64_t dim, bool keepdim = false);
ValuesIndices min(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor argmin(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor softmax(const Tensor& a, int64_t dim);
Tensor log_softmax(const Tensor& a, int64_t dim);
// log(sum(exp(a), dim)), shifted by the dim's max so large values do not overflow; -inf over an
// empty dim, as torch.logsumexp. Floating inputs only (PyTorch promotes integers; tapestry does not).
Tensor logsumexp(const Tensor& a, int64_t dim, bool keepdim = false);
// Normalizes over the trailing dims given by normalized_shape; weight and bias may be undefined.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
// Rotary position embedding (RoFormer; Llama), in Hugging Face's layout: the pairs (x[i],
// x[i + D/2]) of x's last dim D are turned by angles given as cos and sin of shape [..., D/2]
// (one angle per position and pair, broadcast over x's leading dims, e.g. [T, D/2] for x
// [B, H, T, D]). Equals x * cat(cos, cos) + rotate_half(x) * cat(sin, sin). cos and sin take no
// gradient (a model builds them once, as Hugging Face does, from positions and rope_theta).
Tensor rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin);
// x / sqrt(mean(x^2) + eps) * weight over the trailing dims, as torch.nn.functional.rms_norm
// (PyTorch 2.4; Llama's RMSNorm). eps defaults, as there, to the dtype's machine epsilon; Llama
// checkpoints give theirs (rms_norm_eps, often 1e-5 or 1e-6). weight may be undefined.
Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                std::optional<double> eps = std::nullopt);

// ---- linear algebra (ops_matmul.cpp): 1-D, 2-D and batched with broadcast batch dims, as torch.matmul
Tensor matmul(const Tensor& a, const Tensor& b);
// y = x W^T + b, as torch.nn.functional.linear: x [..., in], weight [out, in], bias [out] or
// undefined. One gemm forward; backward computes dW = g^T x straight into W's layout.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// ---- views and copies (ops_view.cpp)
Tensor view(const Tensor& a, const Shape& shape);     // -1 infers one dim; throws if no view exists
Tensor reshape(const Tensor& a, const Shape& shape);  // a view when possible, else a copy
Tensor transpose(const Tensor& a, int64_t d0, int64_t d1);
Tensor permute(const Tensor& a, const std::vector<int64_t>& dims);
Tensor slice(const Tensor& a, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor select(const Tensor& a, int64_t dim, int64_t index);
Tensor expand(const Tensor& a, const Shape& shape);  // -1 keeps a dim
// Every window of `size` elements along dim, `step` apart, as a new last dim of that size (a
// view, as Tensor.unfold): [.., n, ..] -> [.., (n - size) / step + 1, .., size]. Windows may
// overlap (step < size); the backward sums each element's gradient over its windows.
Tensor unfold(const Tensor& a, int64_t dim, int64_t size, int64_t step);
Tensor squeeze(const Tensor& a);
Tensor squeeze(const Tensor& a, int64_t dim);
Tensor unsqueeze(const Tensor& a, int64_t dim);
Tensor contiguous(const Tensor& a);
Tensor clone(const Tensor& a);
Tensor to(const Tensor& a, DType dtype);
Tensor to(const Tensor& a, Device device);  // a copy on device (a itself when already there)

// ---- indexing and joining (ops_index.cpp)
Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index);
// weight [V, D], ids int64 of any shape -> [*ids.shape, D]. The padding_idx row gets no gradient,
// as in PyTorch: none by default (PyTorch's None), a negative index counts from the end (-1 is the
// last row), anything outside [-V, V) is refused.
Tensor embedding(const Tensor& weight, const Tensor& ids, std::optional<int64_t> padding_idx = std::nullopt);
// padding_idx in [0, rows): a negative one counted from the end; refused (naming `op`) outside [-rows, rows).
int64_t normalize_padding_idx(const char* op, int64_t padding_idx, int64_t rows);
Tensor gather(const Tensor& a, int64_t dim, const Tensor& index);
// A copy of a with src's elements written (scatter) or added (scatter_add) at the indices along
// dim, as torch.scatter / torch.scatter_add: out[..index[i][j]..][j] = src[i][j] for dim 0.
// index has a's rank and is no larger than src in any dim, nor than a outside dim. Repeated
// indices: scatter_add sums them; scatter keeps one (the last, on the CPU).
Tensor scatter(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src);
Tensor scatter(const Tensor& a, int64_t dim, const Tensor& index, double value);
Tensor scatter_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src);
Tensor cat(const TensorList& tensors, int64_t dim = 0);
Tensor stack(const TensorList& tensors, int64_t dim = 0);
TensorList split(const Tensor& a, int64_t split_size, int64_t dim = 0);  // views; the last may be smaller
TensorList chunk(const Tensor& a, int64_t chunks, int64_t dim = 0);      // views
// Zeroes each element with probability p and scales the rest by 1/(1-p); identity when !training.
Tensor dropout(const Tensor& a, double p, bool training = true, Generator* gen = nullptr);

// ---- losses (ops_loss.cpp)
enum class Reduction { Mean, Sum };
// Cross-entropy of logits [N, C] against int64 targets [N], fused with log-softmax, with label
// smoothing as the paper uses it (see kernels::cross_entropy) and rows whose target is
// ignore_index skipped. Mean divides by the number of counted rows (0 rows give a loss of 0).
Tensor cross_entropy(const Tensor& logits, const Tensor& target, double label_smoothing = 0.0,
                     int64_t ignore_index = -100, Reduction reduction = Reduction::Mean);
// The regression losses of torch.nn.functional, elementwise on broadcast operands, then reduced:
// (a - b)^2; |a - b|; smooth L1 (0.5 d^2 / beta below beta, d - 0.5 beta above; beta 0 is L1);
// Huber (0.5 d^2 below delta, delta (d - 0.5 delta) above).
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);
Tensor l1_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);
Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean,
                      double beta = 1.0);
Tensor huber_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean, double delta = 1.0);
// -(y log sigmoid(x) + (1 - y) log sigmoid(-x)) for logits x and targets y of the same shape,
// computed as (1 - y) x + softplus(-x), which neither overflows nor loses its gradient at 0.
Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target,
                                        Reduction reduction = Reduction::Mean);

// ---- attention (ops_attention.cpp)
// softmax(scale * q k^T, masked) v as one fused kernel with its own backward, which never holds
// more than one block of scores: q [..., Tq, E], k [..., Tk, E], v [..., Tk, Ev] -> [..., Tq, Ev],
// the leading dims (batch, heads) equal. attn_mask: Bool, broadcast to [..., Tq, Tk], **true where
// a query may attend**, as torch.nn.functional.scaled_dot_product_attention (float masks are not
// supported), or undefined. is_causal masks key j > query i (top-left aligned, as PyTorch). A
// masked score becomes -1e9, so a fully masked row attends evenly rather than giving NaN (PyTorch
// 2 uses -inf: NaN there). scale defaults to 1/sqrt(E). dropout_p drops probabilities (pass 0 in
// eval), seeded by one draw from gen.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& attn_mask = Tensor(), bool is_causal = false, double dropout_p = 0.0,
                                    std::optional<double> scale = std::nullopt, Generator* gen = nullptr);
// The same with the opposite mask: true = masked out, the convention of torch.nn.MultiheadAttention's
// attn_mask and key_padding_mask, which nn::MultiHeadAttention and the models use (padding and
// causal masks are built that way), without an inversion pass.
Tensor scaled_dot_product_attention_masked_out(const Tensor& q, const Tensor& k, const Tensor& v,
                                               const Tensor& masked_out = Tensor(), bool is_causal = false,
                                               double dropout_p = 0.0, std::optional<double> scale = std::nullopt,
                                               Generator* gen = nullptr);

// ---- sorting, scans and triangles (ops_sort.cpp)
// NaN ranks above +inf (last ascending, first descending, the largest for topk), as in PyTorch.
// The lower / upper triangle of the last two dims (j - i <= diagonal / j - i >= diagonal),
// zeros elsewhere, batched over leading dims; any dtype; the input must be at least 2-D.
Tensor tril(const Tensor& a, int64_t diagonal = 0);
Tensor triu(const Tensor& a, int64_t diagonal = 0);
// Cumulative sum along dim, as torch.cumsum: int64 and bool give int64; added in order along the
// dim (float32 in a double accumulator, as PyTorch's CPU kernel). Backward: the reversed cumsum.
Tensor cumsum(const Tensor& a, int64_t dim);
// Sorted values and their int64 indices along dim; any dtype. Always stable (equal values keep
// their input order); stable = false is accepted. Backward scatters the gradient to the indices.
ValuesIndices sort(const Tensor& a, int64_t dim = -1, bool descending = false, bool stable = true);
Tensor argsort(const Tensor& a, int64_t dim = -1, bool descending = false);  // stable
// The k largest (or smallest) along dim, 0 <= k <= size of dim; not for bool. Equal values give
// the lowest index first (as a stable sort; PyTorch's CPU topk may order ties differently).
// sorted = false returns the selected elements in their input (index) order.
ValuesIndices topk(const Tensor& a, int64_t k, int64_t dim = -1, bool largest = true, bool sorted = true);
// num_samples int64 category indices drawn per row of probs [V] or [B, V] (float weights:
// finite, non-negative, each row with a positive sum; they need not sum to 1). Without
// replacement, no category twice, and num_samples may not exceed a row's nonzero weights.
// Draws come sequentially from gen (default_generator() when null): the same seed gives the
// same samples, whatever the thread count. Not differentiable.
Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement = false, Generator* gen = nullptr);

// ---- operators
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(double a, const Tensor& b);

}  // namespace tapestry
