// The one place where kernel entry points choose a backend. Each entry finds the device its tensors
// share (common_device; two devices in one call is an Error naming both), runs the checks that need
// no data (dtypes, shapes, in-place rules: once here, not in every backend) and forwards the call,
// unchanged, to kernels::cpu or kernels::cuda. No op switches on devices. copy_ also moves data
// between devices (a staged byte copy plus the backend's strided copy); contiguous, to_dtype and
// cat are composites of copy_, defined here for every device.
#include <algorithm>

#include "tapestry/ops/detail/backend.h"
#include "tapestry/ops/cuda.h"
#include "tapestry/ops/factory.h"
#include "tapestry/ops/profile.h"
#include "tapestry/ops/runtime.h"

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

// In-place writes into an expanded view would write one element many times (and race).
void check_writable(const char* op, const Tensor& dst) {
  if (dst.numel() == 0) return;  // nothing is written
  for (int64_t d = 0; d < dst.dim(); ++d)
    TP_CHECK(dst.stride(d) != 0 || dst.size(d) <= 1,
             "{}: the destination of shape {} (strides {}) is an expanded view whose elements share memory; "
             "clone() it first", op, dst.sizes(), dst.strides());
}

// The element range [first, last] of t in its storage, in bytes.
std::pair<int64_t, int64_t> byte_range(const Tensor& t) {
  int64_t lo = t.offset(), hi = t.offset();
  for (int64_t d = 0; d < t.dim(); ++d) (t.stride(d) < 0 ? lo : hi) += (t.size(d) - 1) * t.stride(d);
  const auto size = static_cast<int64_t>(dtype_size(t.dtype()));
  return {lo * size, hi * size + size - 1};
}

// An in-place write whose source shares some but not all of the destination's memory (a.add_(a.t()),
// a.copy_(a[0])) reads elements the kernel has already written: sequential on the CPU, a race on a
// GPU. PyTorch refuses these; so do we, on every device. The same view (a.mul_(a)) is fine.
void check_no_partial_overlap(const char* op, const Tensor& dst, const Tensor& src) {
  if (dst.storage() != src.storage() || dst.numel() == 0 || src.numel() == 0) return;
  if (dst.offset() == src.offset() && dst.sizes() == src.sizes() && dst.strides() == src.strides() &&
      dst.dtype() == src.dtype())
    return;
  auto [dlo, dhi] = byte_range(dst);
  auto [slo, shi] = byte_range(src);
  TP_CHECK(shi < dlo || dhi < slo,
           "{}: unsupported operation: some elements of the source (shape {}, strides {}) and the destination "
           "(shape {}, strides {}) refer to the same memory; clone() the source first", op, src.sizes(),
           src.strides(), dst.sizes(), dst.strides());
}

void check_binary(const char* op, Binary kind, const Tensor& a, const Tensor& b) {
  TP_CHECK(a.dtype() == b.dtype(), "{}: dtype mismatch: {} {} and {} {} (convert one with .to())", op, a.dtype(),
           a.sizes(), b.dtype(), b.sizes());
  if (a.dtype() == DType::Bool)
    TP_CHECK(kind == Binary::Eq || kind == Binary::Ne, "{}: not supported for bool tensors; convert with .to() first",
             op);
  if (a.dtype() == DType::Int64)
    TP_CHECK(kind != Binary::Div,
             "{}: not supported for int64 tensors (integer division); convert to float first", op);
}

// Shapes and dtypes; the target values are checked by each backend (on the host, or on the GPU).
void check_cross_entropy(const Tensor& logits, const Tensor& target, double eps) {
  TP_CHECK(logits.dim() == 2, "cross_entropy: logits must be [N, classes], got shape {}", logits.sizes());
  TP_CHECK(target.dtype() == DType::Int64 && target.dim() == 1 && target.size(0) == logits.size(0),
           "cross_entropy: target must be int64 [{}] to match logits {}, got {} {}", logits.size(0), logits.sizes(),
           target.dtype(), target.sizes());
  TP_CHECK(eps >= 0 && eps < 1, "cross_entropy: label smoothing must be in [0, 1), got {}", eps);
}

Device device_of_all(const char* op, const std::vector<Tensor>& tensors) {
  for (size_t i = 1; i < tensors.size(); ++i) common_device(op, {&tensors[0], &tensors[i]});
  return tensors.empty() ? Device::CPU : tensors[0].device();
}

// The CUDA backend runs a few entries on the host (ops/cuda/host_fallback.cu: a copy down and one
// back, two synchronisations). The emulated device counts them alike, so that its counts are a GPU's.
void count_host_round_trip(const Tensor& a) {
  if (a.device().is_emulated() && !runtime::in_emulated_kernel()) {
    runtime::count_sync();
    runtime::count_sync();
    runtime::count_bytes_to_host(a.numel() * static_cast<int64_t>(dtype_size(a.dtype())));
  }
}

#ifndef TAPESTRY_WITH_CUDA
[[noreturn]] void no_cuda_backend(const char* op) {
  throw Error(fmt::format("{}: tensor on cuda, but this build has only the cpu backend (configure with "
                          "-DTAPESTRY_CUDA=ON)", op));
}
#endif

}  // namespace

#ifdef TAPESTRY_WITH_CUDA
// A CUDA entry's profile scope (`tapestry bench --profile`, ops/profile.h), which the CPU kernels
// open themselves. Kernels run asynchronously, so with profiling on the scope waits for the stream
// before it closes and the time is the kernel's (a synchronisation per entry, counted: profile
// steps are timed apart from the measured ones). Off, it costs a branch.
struct DeviceProfileScope {
  DeviceProfileScope(const char* op, Device device) : device(device), scope(op) {}
  ~DeviceProfileScope() {
    if (profile::enabled()) ::tapestry::cuda::detail::wait_for_stream(device);
  }
  Device device;
  profile::Scope scope;  // destroyed after the wait above
};
#endif

// TP_ROUTE(op, device, call): call the entry `call` of the backend for `device`. A CUDA call first
// makes the tensors' GPU the current one; an emulated call runs the CPU kernel inside an
// EmulatedKernel scope (the one place the host may read that device's memory; a launch).
#ifdef TAPESTRY_WITH_CUDA
#define TP_ROUTE_CUDA(op, call)                                             \
  do {                                                                      \
    ::tapestry::cuda::detail::set_device(tp_device);                        \
    DeviceProfileScope tp_scope(op, tp_device);                             \
    return cuda::call;                                                      \
  } while (0)
#else
#define TP_ROUTE_CUDA(op, call) no_cuda_backend(op)
#endif
#define TP_ROUTE(op, device, call)                                          \
  do {                                                                      \
    const Device tp_device = (device);                                      \
    if (tp_device.is_cuda()) TP_ROUTE_CUDA(op, call);                       \
    if (tp_device.is_emulated()) {                                          \
      ::tapestry::runtime::EmulatedKernel tp_kernel;                        \
      return cpu::call;                                                     \
    }                                                                       \
    return cpu::call;                                                       \
  } while (0)

Tensor binary(const char* op, Binary kind, const Tensor& a, const Tensor& b) {
  const Device device = common_device(op, {&a, &b});
  check_binary(op, kind, a, b);
  TP_ROUTE(op, device, binary(op, kind, a, b));
}
void binary_(const char* op, Binary kind, Tensor& a, const Tensor& b) {
  const Device device = common_device(op, {&a, &b});
  check_binary(op, kind, a, b);
  TP_CHECK(!is_comparison(kind), "{}: comparisons have no in-place form", op);
  check_writable(op, a);
  Shape shape = broadcast_shapes(op, a.sizes(), b.sizes());
  TP_CHECK(shape == a.sizes(), "{}: in-place result of shape {} does not fit the destination of shape {}", op, shape,
           a.sizes());
  check_no_partial_overlap(op, a, b);
  TP_ROUTE(op, device, binary_(op, kind, a, b));
}
Tensor unary(const char* op, Unary kind, const Tensor& a, double p0, double p1) {
  if (kind == Unary::Clamp) TP_CHECK(p0 <= p1, "{}: min {} is greater than max {}", op, p0, p1);
  TP_ROUTE(op, a.device(), unary(op, kind, a, p0, p1));
}
Tensor where(const char* op, const Tensor& cond, const Tensor& a, const Tensor& b) {
  const Device device = common_device(op, {&cond, &a, &b});
  TP_CHECK(cond.dtype() == DType::Bool, "{}: condition must be a bool mask, got {} {}", op, cond.dtype(),
           cond.sizes());
  TP_CHECK(a.dtype() == b.dtype(), "{}: dtype mismatch: {} {} and {} {}", op, a.dtype(), a.sizes(), b.dtype(),
           b.sizes());
  TP_ROUTE(op, device, where(op, cond, a, b));
}

void copy_(const Tensor& dst, const Tensor& src) {
  Shape shape = broadcast_shapes("copy_", dst.sizes(), src.sizes());
  TP_CHECK(shape == dst.sizes(), "copy_: source of shape {} cannot be broadcast to the destination shape {}",
           src.sizes(), dst.sizes());
  check_writable("copy_", dst);
  check_no_partial_overlap("copy_", dst, src);
  if (dst.device() == src.device()) TP_ROUTE("copy_", dst.device(), copy_(dst, src));
  // Across devices: src made contiguous in dst's dtype on its own device, its bytes copied to a
  // contiguous buffer on dst's device (dst itself when it fits), then broadcast into dst there.
  Tensor staged = contiguous(to_dtype(src, dst.dtype()));
  const bool direct = dst.is_contiguous() && dst.sizes() == src.sizes();
  Tensor landing = direct ? dst : empty(src.sizes(), TensorOptions(dst.dtype(), dst.device()));
  {
    // The host waits for the copy (the CUDA runtime synchronises both ways: ops/cuda/runtime.cu),
    // unless it is part of an emulated kernel's own work.
    if (!runtime::in_emulated_kernel()) {
      runtime::count_sync();
      if (dst.device().is_cpu()) runtime::count_bytes_to_host(staged.numel() * static_cast<int64_t>(dtype_size(staged.dtype())));
    }
    runtime::EmulatedKernel copying(false);  // the runtime's own copy may touch emulated memory
    ::tapestry::cuda::detail::copy_bytes(landing.raw_data(), landing.device(), staged.raw_data(), staged.device(),
                                         static_cast<size_t>(staged.numel()) * dtype_size(staged.dtype()));
  }
  if (direct) dst.impl().storage->version++;
  else copy_(dst, landing);
}

void fill_(const Tensor& dst, double value) { TP_ROUTE("fill_", dst.device(), fill_(dst, value)); }

Tensor contiguous(const Tensor& a) {
  if (a.is_contiguous()) return a;
  Tensor out = empty(a.sizes(), a.options());
  copy_(out, a);
  return out;
}

Tensor to_dtype(const Tensor& a, DType dtype) {
  if (a.dtype() == dtype) return a;
  Tensor out = empty(a.sizes(), TensorOptions(dtype, a.device()));
  copy_(out, a);
  return out;
}

Tensor to_device(const Tensor& a, Device device) {
  if (a.device() == device) return a;
  Tensor out = empty(a.sizes(), TensorOptions(a.dtype(), device));
  copy_(out, a);
  out.impl().storage->version = 0;  // a new tensor, whatever filled it
  return out;
}

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  TP_PROFILE("cat");
  TP_CHECK(!tensors.empty(), "cat: expected a non-empty list of tensors");
  const Device device = device_of_all("cat", tensors);
  const Tensor& first = tensors[0];
  TP_CHECK(first.dim() > 0, "cat: zero-dimensional tensors cannot be concatenated (use stack)");
  dim = wrap_dim("cat", dim, first.dim());
  Shape out_shape = first.sizes();
  out_shape[dim] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    TP_CHECK(t.dtype() == first.dtype(), "cat: tensor {} is {} but tensor 0 is {}", i, t.dtype(), first.dtype());
    TP_CHECK(t.dim() == first.dim(), "cat: tensor {} has shape {} but tensor 0 has shape {} (dims differ)", i,
             t.sizes(), first.sizes());
    for (int64_t d = 0; d < t.dim(); ++d)
      TP_CHECK(d == dim || t.size(d) == first.size(d),
               "cat: tensor {} has shape {} but tensor 0 has shape {}; they must match except in dim {}", i,
               t.sizes(), first.sizes(), dim);
    out_shape[dim] += t.size(dim);
  }
  Tensor out = empty(out_shape, TensorOptions(first.dtype(), device));
  int64_t pos = 0;
  for (const Tensor& t : tensors) {  // each into its slice of out (a view: same storage)
    Shape s = out_shape;
    s[dim] = t.size(dim);
    copy_(make_tensor(out.impl().storage, s, out.strides(), pos * out.stride(dim), out.dtype()), t);
    pos += t.size(dim);
  }
  return out;
}

Tensor reduce(const char* op, Reduce kind, const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  TP_ROUTE(op, a.device(), reduce(op, kind, a, dims, keepdim));
}
Tensor sum_of_squares(const std::vector<Tensor>& tensors) {
  TP_ROUTE("sum_of_squares", device_of_all("sum_of_squares", tensors), sum_of_squares(tensors));
}
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

CrossEntropyOut cross_entropy(const Tensor& logits, const Tensor& target, double smoothing, int64_t ignore_index,
                              bool mean) {
  const Device device = common_device("cross_entropy", {&logits, &target});
  check_cross_entropy(logits, target, smoothing);
  TP_ROUTE("cross_entropy", device, cross_entropy(logits, target, smoothing, ignore_index, mean));
}
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& target, const Tensor& lse, double smoothing,
                              int64_t ignore_index, const Tensor& scale) {
  const Device device = common_device("cross_entropy_backward", {&logits, &target, &lse, &scale});
  check_cross_entropy(logits, target, smoothing);
  TP_CHECK(scale.dim() == 0 && scale.dtype() == logits.dtype(),
           "cross_entropy_backward: scale must be a 0-d {} tensor, got {} {}", logits.dtype(), scale.dtype(),
           scale.sizes());
  TP_ROUTE("cross_entropy_backward", device, cross_entropy_backward(logits, target, lse, smoothing, ignore_index, scale));
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
  TP_CHECK(a.dim() >= 2, "{}: expected a tensor of at least 2 dims (a matrix or a batch of them), got shape {}", op,
           a.sizes());
  TP_ROUTE(op, a.device(), triangle(op, a, diagonal, upper));
}
Tensor cumsum(const Tensor& a, int64_t dim, bool reverse) {
  count_host_round_trip(a);
  TP_ROUTE("cumsum", a.device(), cumsum(a, dim, reverse));
}
std::pair<Tensor, Tensor> sort(const Tensor& a, int64_t dim, bool descending, bool stable) {
  count_host_round_trip(a);
  TP_ROUTE("sort", a.device(), sort(a, dim, descending, stable));
}
std::pair<Tensor, Tensor> topk(const Tensor& a, int64_t k, int64_t dim, bool largest, bool sorted) {
  if (!topk_on_device(k, sorted) || a.dim() == 0) count_host_round_trip(a);  // as the CUDA entry decides
  TP_ROUTE("topk", a.device(), topk(a, k, dim, largest, sorted));
}
Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement, std::mt19937_64& engine) {
  count_host_round_trip(probs);
  TP_ROUTE("multinomial", probs.device(), multinomial(probs, num_samples, replacement, engine));
}

void adam_step_(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                const std::vector<Tensor>& exp_avgs, const std::vector<Tensor>& exp_avg_sqs, const AdamStep& step) {
  TP_CHECK(grads.size() == params.size() && exp_avgs.size() == params.size() && exp_avg_sqs.size() == params.size(),
           "adam_step_: {} params, {} grads, {} exp_avgs and {} exp_avg_sqs", params.size(), grads.size(),
           exp_avgs.size(), exp_avg_sqs.size());
  if (params.empty()) return;
  const Device device = device_of_all("adam_step_", params);
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& param = params[i];
    common_device("adam_step_", {&params[0], &grads[i], &exp_avgs[i], &exp_avg_sqs[i]});
    for (const Tensor* t : {&param, &grads[i], &exp_avgs[i], &exp_avg_sqs[i]})
      TP_CHECK(t->is_contiguous() && t->dtype() == param.dtype() && t->sizes() == param.sizes(),
               "adam_step_: param, grad and state must be contiguous {} {}, got {} {}", param.dtype(), param.sizes(),
               t->dtype(), t->sizes());
    TP_CHECK(is_floating(param.dtype()), "adam_step_: expected floating-point parameters, got {}", param.dtype());
  }
  TP_ROUTE("adam_step_", device, adam_step_(params, grads, exp_avgs, exp_avg_sqs, step));
}

}  // namespace tapestry::kernels
