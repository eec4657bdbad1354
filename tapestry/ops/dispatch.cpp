// The one place where kernel entry points choose a backend. Each entry finds the device its tensors
// share (common_device; two devices in one call is an Error naming both) and forwards the call,
// unchanged, to kernels::cpu or kernels::cuda. One line per entry; no op switches on devices.
// copy_ is the exception that moves data between devices (a staged byte copy plus the backend's
// strided copy).
#include <algorithm>

#include "tapestry/ops/backend.h"
#include "tapestry/ops/cuda.h"
#include "tapestry/ops/factory.h"

namespace tapestry::kernels {

bool is_comparison(Binary kind) { return kind >= Binary::Eq; }

void check_device(const char* op, const Tensor& t, Device device) {
  TP_CHECK(t.device() == device, "{}: expected a tensor on {}, got one on {} (shape {})", op, device_name(device),
           device_name(t.device()), t.sizes());
}

Device common_device(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor* t : tensors) {
    if (!t->defined()) continue;
    if (!first) first = t;
    else
      TP_CHECK(t->device() == first->device(),
               "{}: expected all tensors on one device, got {} (shape {}) and {} (shape {}); move one with .to()", op,
               device_name(first->device()), first->sizes(), device_name(t->device()), t->sizes());
  }
  return first ? first->device() : Device::CPU;
}

namespace {

Device device_of_all(const char* op, const std::vector<Tensor>& tensors) {
  for (size_t i = 1; i < tensors.size(); ++i) common_device(op, {&tensors[0], &tensors[i]});
  return tensors.empty() ? Device::CPU : tensors[0].device();
}

#ifndef TAPESTRY_WITH_CUDA
[[noreturn]] void no_cuda_backend(const char* op) {
  throw Error(fmt::format("{}: tensor on cuda, but this build has only the cpu backend (configure with "
                          "-DTAPESTRY_CUDA=ON)", op));
}
#endif

}  // namespace

// TP_ROUTE(op, device, call): call the entry `call` of the backend for `device`. A CUDA call first
// makes the tensors' GPU the current one.
#ifdef TAPESTRY_WITH_CUDA
#define TP_ROUTE(op, device, call)                                          \
  do {                                                                      \
    const Device tp_device = (device);                                      \
    if (tp_device.is_cuda()) {                                              \
      ::tapestry::cuda::detail::set_device(tp_device);                      \
      return cuda::call;                                                    \
    }                                                                       \
    return cpu::call;                                                       \
  } while (0)
#else
#define TP_ROUTE(op, device, call)                        \
  do {                                                    \
    if ((device).is_cuda()) no_cuda_backend(op);          \
    return cpu::call;                                     \
  } while (0)
#endif

Tensor binary(const char* op, Binary kind, const Tensor& a, const Tensor& b) {
  TP_ROUTE(op, common_device(op, {&a, &b}), binary(op, kind, a, b));
}
void binary_(const char* op, Binary kind, Tensor& a, const Tensor& b) {
  TP_ROUTE(op, common_device(op, {&a, &b}), binary_(op, kind, a, b));
}
Tensor unary(const char* op, Unary kind, const Tensor& a, double p0, double p1) {
  TP_ROUTE(op, a.device(), unary(op, kind, a, p0, p1));
}
Tensor where(const char* op, const Tensor& cond, const Tensor& a, const Tensor& b) {
  TP_ROUTE(op, common_device(op, {&cond, &a, &b}), where(op, cond, a, b));
}

void copy_(const Tensor& dst, const Tensor& src) {
  if (dst.device() == src.device()) TP_ROUTE("copy_", dst.device(), copy_(dst, src));
  // Across devices: src made contiguous in dst's dtype on its own device, its bytes copied to a
  // contiguous buffer on dst's device (dst itself when it fits), then broadcast into dst there.
  Shape shape = broadcast_shapes("copy_", dst.sizes(), src.sizes());
  TP_CHECK(shape == dst.sizes(), "copy_: source of shape {} cannot be broadcast to the destination shape {}",
           src.sizes(), dst.sizes());
  Tensor staged = contiguous(to_dtype(src, dst.dtype()));
  const bool direct = dst.is_contiguous() && dst.sizes() == src.sizes();
  Tensor landing = direct ? dst : empty(src.sizes(), TensorOptions(dst.dtype(), dst.device()));
  ::tapestry::cuda::detail::copy_bytes(landing.raw_data(), landing.device(), staged.raw_data(), staged.device(),
                           static_cast<size_t>(staged.numel()) * dtype_size(staged.dtype()));
  if (direct) dst.impl().storage->version++;
  else copy_(dst, landing);
}

void fill_(const Tensor& dst, double value) { TP_ROUTE("fill_", dst.device(), fill_(dst, value)); }
Tensor contiguous(const Tensor& a) { TP_ROUTE("contiguous", a.device(), contiguous(a)); }
Tensor to_dtype(const Tensor& a, DType dtype) { TP_ROUTE("to", a.device(), to_dtype(a, dtype)); }

Tensor reduce(const char* op, Reduce kind, const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  TP_ROUTE(op, a.device(), reduce(op, kind, a, dims, keepdim));
}
Tensor sum_of_squares(const Tensor& a) { TP_ROUTE("sum_of_squares", a.device(), sum_of_squares(a)); }
std::pair<Tensor, Tensor> reduce_with_index(const char* op, Reduce kind, const Tensor& a, int64_t dim, bool keepdim) {
  TP_ROUTE(op, a.device(), reduce_with_index(op, kind, a, dim, keepdim));
}

Tensor softmax(const Tensor& a, int64_t dim, bool log) {
  TP_ROUTE("softmax", a.device(), softmax(a, dim, log));
}
Tensor softmax_backward(const Tensor& y, const Tensor& dy, int64_t dim, bool log) {
  TP_ROUTE("softmax_backward", common_device("softmax_backward", {&y, &dy}), softmax_backward(y, dy, dim, log));
}
LayerNormOut layer_norm(const Tensor& x, int64_t norm_dims, const Tensor& weight, const Tensor& bias, double eps) {
  TP_ROUTE("layer_norm", common_device("layer_norm", {&x, &weight, &bias}), layer_norm(x, norm_dims, weight, bias, eps));
}
LayerNormGrads layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                   int64_t norm_dims, const Tensor& weight, bool need_weight_grads) {
  TP_ROUTE("layer_norm_backward", common_device("layer_norm_backward", {&dy, &x, &mean, &rstd, &weight}),
           layer_norm_backward(dy, x, mean, rstd, norm_dims, weight, need_weight_grads));
}

Tensor matmul(const Tensor& a, const Tensor& b) { TP_ROUTE("matmul", common_device("matmul", {&a, &b}), matmul(a, b)); }

Tensor index_select(const char* op, const Tensor& a, int64_t dim, const Tensor& index) {
  TP_ROUTE(op, common_device(op, {&a, &index}), index_select(op, a, dim, index));
}
Tensor index_add(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src) {
  TP_ROUTE("index_add", common_device("index_add", {&index, &src}), index_add(shape, dim, index, src));
}
Tensor gather(const Tensor& a, int64_t dim, const Tensor& index) {
  TP_ROUTE("gather", common_device("gather", {&a, &index}), gather(a, dim, index));
}
Tensor scatter_add(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src) {
  TP_ROUTE("scatter_add", common_device("scatter_add", {&index, &src}), scatter_add(shape, dim, index, src));
}
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  TP_ROUTE("cat", device_of_all("cat", tensors), cat(tensors, dim));
}

CrossEntropyOut cross_entropy(const Tensor& logits, const Tensor& target, double smoothing, int64_t ignore_index) {
  TP_ROUTE("cross_entropy", common_device("cross_entropy", {&logits, &target}),
           cross_entropy(logits, target, smoothing, ignore_index));
}
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& target, const Tensor& lse, double smoothing,
                              int64_t ignore_index, double scale) {
  TP_ROUTE("cross_entropy_backward", common_device("cross_entropy_backward", {&logits, &target, &lse}),
           cross_entropy_backward(logits, target, lse, smoothing, ignore_index, scale));
}

AttentionOut scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                          bool is_causal, double scale, double dropout_p, uint64_t seed) {
  TP_ROUTE("scaled_dot_product_attention", common_device("scaled_dot_product_attention", {&q, &k, &v, &mask}),
           scaled_dot_product_attention(q, k, v, mask, is_causal, scale, dropout_p, seed));
}
AttentionGrads scaled_dot_product_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                                     const Tensor& v, const Tensor& out, const Tensor& lse,
                                                     const Tensor& mask, bool is_causal, double scale,
                                                     double dropout_p, uint64_t seed) {
  TP_ROUTE("scaled_dot_product_attention_backward",
           common_device("scaled_dot_product_attention_backward", {&dout, &q, &k, &v, &out, &lse, &mask}),
           scaled_dot_product_attention_backward(dout, q, k, v, out, lse, mask, is_causal, scale, dropout_p, seed));
}

Tensor dropout(const Tensor& x, double p, uint64_t seed) { TP_ROUTE("dropout", x.device(), dropout(x, p, seed)); }
void uniform_(const Tensor& dst, double lo, double hi, std::mt19937_64& engine) {
  TP_ROUTE("uniform_", dst.device(), uniform_(dst, lo, hi, engine));
}
void normal_(const Tensor& dst, double mean, double std, std::mt19937_64& engine) {
  TP_ROUTE("normal_", dst.device(), normal_(dst, mean, std, engine));
}
void randint_(const Tensor& dst, int64_t low, int64_t high, std::mt19937_64& engine) {
  TP_ROUTE("randint_", dst.device(), randint_(dst, low, high, engine));
}

Tensor triangle(const char* op, const Tensor& a, int64_t diagonal, bool upper) {
  TP_ROUTE(op, a.device(), triangle(op, a, diagonal, upper));
}
Tensor cumsum(const Tensor& a, int64_t dim, bool reverse) { TP_ROUTE("cumsum", a.device(), cumsum(a, dim, reverse)); }
std::pair<Tensor, Tensor> sort(const Tensor& a, int64_t dim, bool descending, bool stable) {
  TP_ROUTE("sort", a.device(), sort(a, dim, descending, stable));
}
std::pair<Tensor, Tensor> topk(const Tensor& a, int64_t k, int64_t dim, bool largest, bool sorted) {
  TP_ROUTE("topk", a.device(), topk(a, k, dim, largest, sorted));
}
Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement, std::mt19937_64& engine) {
  TP_ROUTE("multinomial", probs.device(), multinomial(probs, num_samples, replacement, engine));
}

void adam_step_(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                const AdamStep& step) {
  TP_ROUTE("adam_step_", common_device("adam_step_", {&param, &grad, &exp_avg, &exp_avg_sq}),
           adam_step_(param, grad, exp_avg, exp_avg_sq, step));
}

}  // namespace tapestry::kernels
