// Tensor's member functions: autograd state, and thin forwards to the free functions of
// autograd/functions.h, plus the in-place ops (which bump the version and never record).
#include <functional>

#include "tapestry/autograd/functions.h"
#include "tapestry/ops/detail/kernels.h"

namespace tapestry {

std::string Tensor::grad_fn_name() const { return grad_fn() ? grad_fn()->name : ""; }

Tensor Tensor::grad() const {
  const TensorImpl& i = impl();
  TP_CHECK(i.grad || !i.grad_fn || retains_grad(),
           "grad(): the tensor of shape {} is not a leaf (it was made by {}), and backward() keeps no gradient for "
           "non-leaf tensors; call retain_grad() on it before backward(), or read the gradient of a leaf",
           sizes(), i.grad_fn->name);
  return i.grad ? Tensor(i.grad) : Tensor();
}

void Tensor::retain_grad() const {
  TP_CHECK(requires_grad(), "retain_grad: the tensor of shape {} does not require grad", sizes());
  if (!is_leaf()) grad_fn()->retained = impl_ptr();
}

bool Tensor::retains_grad() const {
  const std::shared_ptr<Node>& fn = impl().grad_fn;
  return fn && fn->retained.lock() == impl_ptr();
}

void Tensor::backward(const Tensor& grad, bool retain_graph, bool create_graph) const {
  run_backward(*this, grad, retain_graph, create_graph);
}

HookHandle Tensor::register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook) const {
  TP_CHECK(requires_grad() && is_leaf(),
           "register_post_accumulate_grad_hook: the tensor of shape {} is not a leaf that requires grad", sizes());
  TP_CHECK(static_cast<bool>(hook), "register_post_accumulate_grad_hook: empty hook");
  static int64_t next_id = 0;
  auto& hooks = impl().post_accumulate_grad_hooks;
  hooks.emplace_back(next_id, std::move(hook));
  return HookHandle(impl_ptr(), next_id++);
}

void HookHandle::remove() {
  if (auto owner = owner_.lock()) {
    auto& hooks = owner->post_accumulate_grad_hooks;
    for (auto it = hooks.begin(); it != hooks.end(); ++it)
      if (it->first == id_) {
        hooks.erase(it);
        break;
      }
  }
  owner_.reset();
}

Tensor Tensor::view(const Shape& shape) const { return tapestry::view(*this, shape); }
Tensor Tensor::reshape(const Shape& shape) const { return tapestry::reshape(*this, shape); }
Tensor Tensor::transpose(int64_t d0, int64_t d1) const { return tapestry::transpose(*this, d0, d1); }
Tensor Tensor::t() const {
  TP_CHECK(dim() <= 2, "t: expects a tensor with at most 2 dims, got shape {}", sizes());
  return dim() < 2 ? *this : tapestry::transpose(*this, 0, 1);
}
Tensor Tensor::permute(const std::vector<int64_t>& dims) const { return tapestry::permute(*this, dims); }
Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  return tapestry::slice(*this, d, start, end, step);
}
Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  int64_t wd = wrap_dim("narrow", d, dim());
  TP_CHECK(start >= -size(wd) && start <= size(wd), "narrow: start {} is out of range for dim {} of size {} (tensor shape {})",
           start, wd, size(wd), sizes());
  if (start < 0) start += size(wd);  // as in PyTorch, a negative start counts from the end
  TP_CHECK(start >= 0 && length >= 0 && length <= size(wd) - start,
           "narrow: start {} + length {} exceeds dim {} of size {} (tensor shape {})", start, length, wd, size(wd),
           sizes());
  return tapestry::slice(*this, wd, start, start + length);
}
Tensor Tensor::select(int64_t d, int64_t index) const { return tapestry::select(*this, d, index); }
Tensor Tensor::expand(const Shape& shape) const { return tapestry::expand(*this, shape); }
Tensor Tensor::expand_as(const Tensor& other) const { return tapestry::expand(*this, other.sizes()); }
Tensor Tensor::squeeze() const { return tapestry::squeeze(*this); }
Tensor Tensor::squeeze(int64_t d) const { return tapestry::squeeze(*this, d); }
Tensor Tensor::unsqueeze(int64_t d) const { return tapestry::unsqueeze(*this, d); }
Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) {
    wrap_dim("flatten", start_dim, 0);
    wrap_dim("flatten", end_dim, 0);
    return reshape({1});
  }
  start_dim = wrap_dim("flatten", start_dim, dim());
  end_dim = wrap_dim("flatten", end_dim, dim());
  TP_CHECK(start_dim <= end_dim, "flatten: start_dim {} comes after end_dim {}", start_dim, end_dim);
  Shape s(sizes().begin(), sizes().begin() + start_dim);
  s.push_back(shape_numel(Shape(sizes().begin() + start_dim, sizes().begin() + end_dim + 1)));
  s.insert(s.end(), sizes().begin() + end_dim + 1, sizes().end());
  return reshape(s);
}
Tensor Tensor::contiguous() const { return tapestry::contiguous(*this); }
Tensor Tensor::clone() const { return tapestry::clone(*this); }
Tensor Tensor::to(DType dtype) const { return tapestry::to(*this, dtype); }
Tensor Tensor::to(Device device) const { return tapestry::to(*this, device); }

Tensor Tensor::exp() const { return tapestry::exp(*this); }
Tensor Tensor::log() const { return tapestry::log(*this); }
Tensor Tensor::sqrt() const { return tapestry::sqrt(*this); }
Tensor Tensor::rsqrt() const { return tapestry::rsqrt(*this); }
Tensor Tensor::tanh() const { return tapestry::tanh(*this); }
Tensor Tensor::relu() const { return tapestry::relu(*this); }
Tensor Tensor::gelu() const { return tapestry::gelu(*this); }
Tensor Tensor::sigmoid() const { return tapestry::sigmoid(*this); }
Tensor Tensor::abs() const { return tapestry::abs(*this); }
Tensor Tensor::neg() const { return tapestry::neg(*this); }
Tensor Tensor::pow(double e) const { return tapestry::pow(*this, e); }
Tensor Tensor::clamp(double lo, double hi) const { return tapestry::clamp(*this, lo, hi); }
Tensor Tensor::clamp_min(double lo) const { return tapestry::clamp_min(*this, lo); }
Tensor Tensor::log1p() const { return tapestry::log1p(*this); }
Tensor Tensor::expm1() const { return tapestry::expm1(*this); }
Tensor Tensor::softplus(double beta, double threshold) const { return tapestry::softplus(*this, beta, threshold); }
Tensor Tensor::logsumexp(int64_t dim, bool keepdim) const { return tapestry::logsumexp(*this, dim, keepdim); }
Tensor Tensor::sum() const { return tapestry::sum(*this); }
Tensor Tensor::sum(const std::vector<int64_t>& dims, bool keepdim) const { return tapestry::sum(*this, dims, keepdim); }
Tensor Tensor::mean() const { return tapestry::mean(*this); }
Tensor Tensor::mean(const std::vector<int64_t>& dims, bool keepdim) const {
  return tapestry::mean(*this, dims, keepdim);
}
Tensor Tensor::softmax(int64_t d) const { return tapestry::softmax(*this, d); }
Tensor Tensor::log_softmax(int64_t d) const { return tapestry::log_softmax(*this, d); }
Tensor Tensor::matmul(const Tensor& other) const { return tapestry::matmul(*this, other); }
Tensor Tensor::masked_fill(const Tensor& mask, double value) const { return tapestry::masked_fill(*this, mask, value); }
Tensor Tensor::add(const Tensor& other) const { return tapestry::add(*this, other); }
Tensor Tensor::add(double other) const { return tapestry::add(*this, other); }
Tensor Tensor::sub(const Tensor& other) const { return tapestry::sub(*this, other); }
Tensor Tensor::sub(double other) const { return tapestry::sub(*this, other); }
Tensor Tensor::mul(const Tensor& other) const { return tapestry::mul(*this, other); }
Tensor Tensor::mul(double other) const { return tapestry::mul(*this, other); }
Tensor Tensor::div(const Tensor& other) const { return tapestry::div(*this, other); }
Tensor Tensor::div(double other) const { return tapestry::div(*this, other); }
Tensor Tensor::maximum(const Tensor& other) const { return tapestry::maximum(*this, other); }
Tensor Tensor::minimum(const Tensor& other) const { return tapestry::minimum(*this, other); }
Tensor Tensor::eq(const Tensor& other) const { return tapestry::eq(*this, other); }
Tensor Tensor::eq(double other) const { return tapestry::eq(*this, other); }
Tensor Tensor::ne(const Tensor& other) const { return tapestry::ne(*this, other); }
Tensor Tensor::ne(double other) const { return tapestry::ne(*this, other); }
Tensor Tensor::lt(const Tensor& other) const { return tapestry::lt(*this, other); }
Tensor Tensor::lt(double other) const { return tapestry::lt(*this, other); }
Tensor Tensor::le(const Tensor& other) const { return tapestry::le(*this, other); }
Tensor Tensor::le(double other) const { return tapestry::le(*this, other); }
Tensor Tensor::gt(const Tensor& other) const { return tapestry::gt(*this, other); }
Tensor Tensor::gt(double other) const { return tapestry::gt(*this, other); }
Tensor Tensor::ge(const Tensor& other) const { return tapestry::ge(*this, other); }
Tensor Tensor::ge(double other) const { return tapestry::ge(*this, other); }
Tensor Tensor::logical_not() const { return tapestry::logical_not(*this); }
Tensor Tensor::max() const { return tapestry::max(*this); }
Tensor Tensor::min() const { return tapestry::min(*this); }
ValuesIndices Tensor::max(int64_t dim, bool keepdim) const { return tapestry::max(*this, dim, keepdim); }
ValuesIndices Tensor::min(int64_t dim, bool keepdim) const { return tapestry::min(*this, dim, keepdim); }
Tensor Tensor::argmax(int64_t dim, bool keepdim) const { return tapestry::argmax(*this, dim, keepdim); }
Tensor Tensor::argmin(int64_t dim, bool keepdim) const { return tapestry::argmin(*this, dim, keepdim); }
Tensor Tensor::var(const std::vector<int64_t>& dims, int64_t correction, bool keepdim) const {
  return tapestry::var(*this, dims, correction, keepdim);
}
Tensor Tensor::index_select(int64_t dim, const Tensor& index) const { return tapestry::index_select(*this, dim, index); }
Tensor Tensor::gather(int64_t dim, const Tensor& index) const { return tapestry::gather(*this, dim, index); }
Tensor Tensor::scatter(int64_t dim, const Tensor& index, const Tensor& src) const {
  return tapestry::scatter(*this, dim, index, src);
}
Tensor Tensor::scatter(int64_t dim, const Tensor& index, double value) const {
  return tapestry::scatter(*this, dim, index, value);
}
Tensor Tensor::scatter_add(int64_t dim, const Tensor& index, const Tensor& src) const {
  return tapestry::scatter_add(*this, dim, index, src);
}
Tensor Tensor::unfold(int64_t dim, int64_t size, int64_t step) const {
  return tapestry::unfold(*this, dim, size, step);
}
Tensor Tensor::tril(int64_t diagonal) const { return tapestry::tril(*this, diagonal); }
Tensor Tensor::triu(int64_t diagonal) const { return tapestry::triu(*this, diagonal); }
Tensor Tensor::cumsum(int64_t dim) const { return tapestry::cumsum(*this, dim); }
ValuesIndices Tensor::sort(int64_t dim, bool descending) const { return tapestry::sort(*this, dim, descending); }
Tensor Tensor::argsort(int64_t dim, bool descending) const { return tapestry::argsort(*this, dim, descending); }
ValuesIndices Tensor::topk(int64_t k, int64_t dim, bool largest, bool sorted) const {
  return tapestry::topk(*this, k, dim, largest, sorted);
}

// ---- in place
//
// Note [In-place autograd]: with grad mode on, an in-place op whose target or operand requires
// grad is recorded as PyTorch records it. The out-of-place op computes the result (from a clone
// of the target where its backward needs the old values), the result is written into the
// target, and the target takes over the result's history. Each op's backward is thus the one of
// its out-of-place form. Refused, naming the op: a leaf that requires grad (its .grad would lose
// track of what it held), and a target whose storage another tensor shares (a view, or a tensor
// saved for backward): PyTorch rewrites the base's history there, which this tape does not do.
namespace {

using OutOfPlace = std::function<Tensor(const Tensor& target)>;

// Runs the op and returns true when it has to be recorded; false leaves it to the plain kernel.
bool inplace_recorded(const char* op, Tensor& self, const TensorList& operands, const OutOfPlace& compute) {
  check_inplace(op, self);
  TensorList inputs = operands;
  inputs.push_back(self);
  if (!any_requires_grad(inputs)) return false;
  TP_CHECK(self.impl().storage.use_count() == 1,
           "{}: in-place operation on a tensor of shape {} that shares its storage with another tensor (a view, "
           "or a tensor saved for backward), while autograd records it; use the out-of-place op",
           op, self.sizes());
  Tensor result = compute(self);
  TP_CHECK(result.sizes() == self.sizes() && result.dtype() == self.dtype(),
           "{}: the result {} {} cannot be written in place into a tensor {} {}", op, result.dtype(), result.sizes(),
           self.dtype(), self.sizes());
  kernels::copy_(self, result);
  self.impl().grad_fn = result.grad_fn();
  self.impl().requires_grad = true;
  return true;
}

Tensor all_true(const Tensor& t) { return full({}, 1.0, TensorOptions(DType::Bool, t.device())).expand(t.sizes()); }

}  // namespace

Tensor& Tensor::fill_(double value) {
  // The old values get a zero gradient: where() with an all-true mask records exactly that.
  if (!inplace_recorded("fill_", *this, {}, [&](const Tensor& t) { return tapestry::masked_fill(t, all_true(t), value); }))
    kernels::fill_(*this, value);
  return *this;
}
Tensor& Tensor::zero_() {
  if (!inplace_recorded("zero_", *this, {}, [&](const Tensor& t) { return tapestry::masked_fill(t, all_true(t), 0.0); }))
    kernels::fill_(*this, 0.0);
  return *this;
}
Tensor& Tensor::copy_(const Tensor& src) {
  if (!inplace_recorded("copy_", *this, {src}, [&](const Tensor& t) {
        return tapestry::where(all_true(t), tapestry::to(src, t.dtype()).expand(t.sizes()), t);
      }))
    kernels::copy_(*this, src);
  return *this;
}
Tensor& Tensor::add_(const Tensor& other, double alpha) {
  if (!inplace_recorded("add_", *this, {other},
                        [&](const Tensor& t) { return alpha == 1.0 ? tapestry::add(t, other) : tapestry::add(t, tapestry::mul(other, alpha)); }))
    kernels::binary_("add_", kernels::Binary::Add, *this,
                     alpha == 1.0 ? other : kernels::binary("add_", kernels::Binary::Mul, other, scalar_tensor(alpha, other.options())));
  return *this;
}
Tensor& Tensor::add_(double value) {
  if (!inplace_recorded("add_", *this, {}, [&](const Tensor& t) { return tapestry::add(t, value); }))
    kernels::binary_("add_", kernels::Binary::Add, *this, scalar_tensor(value, options()));
  return *this;
}
Tensor& Tensor::sub_(const Tensor& other) {
  if (!inplace_recorded("sub_", *this, {other}, [&](const Tensor& t) { return tapestry::sub(t, other); }))
    kernels::binary_("sub_", kernels::Binary::Sub, *this, other);
  return *this;
}
Tensor& Tensor::sub_(double value) {
  if (!inplace_recorded("sub_", *this, {}, [&](const Tensor& t) { return tapestry::sub(t, value); }))
    kernels::binary_("sub_", kernels::Binary::Sub, *this, scalar_tensor(value, options()));
  return *this;
}
Tensor& Tensor::mul_(const Tensor& other) {
  // MulBackward keeps both operands, so the old target goes in as a clone.
  if (!inplace_recorded("mul_", *this, {other}, [&](const Tensor& t) { return tapestry::mul(tapestry::clone(t), other); }))
    kernels::binary_("mul_", kernels::Binary::Mul, *this, other);
  return *this;
}
Tensor& Tensor::mul_(double value) {
  if (!inplace_recorded("mul_", *this, {}, [&](const Tensor& t) { return tapestry::mul(t, value); }))
    kernels::binary_("mul_", kernels::Binary::Mul, *this, scalar_tensor(value, options()));
  return *this;
}
Tensor& Tensor::div_(const Tensor& other) {
  if (!inplace_recorded("div_", *this, {other}, [&](const Tensor& t) { return tapestry::div(tapestry::clone(t), other); }))
    kernels::binary_("div_", kernels::Binary::Div, *this, other);
  return *this;
}
Tensor& Tensor::div_(double value) {
  if (!inplace_recorded("div_", *this, {}, [&](const Tensor& t) { return tapestry::div(t, value); }))
    kernels::binary_("div_", kernels::Binary::Div, *this, scalar_tensor(value, options()));
  return *this;
}
Tensor& Tensor::masked_fill_(const Tensor& mask, double value) {
  if (!inplace_recorded("masked_fill_", *this, {}, [&](const Tensor& t) { return tapestry::masked_fill(t, mask, value); }))
    kernels::copy_(*this, kernels::where("masked_fill_", mask, scalar_tensor(value, options()), *this));
  return *this;
}
Tensor& Tensor::uniform_(double lo, double hi) {
  TP_CHECK(!(GradMode::is_enabled() && requires_grad()),
           "uniform_: random fill of a tensor of shape {} that requires grad; wrap it in NoGradGuard", sizes());
  kernels::uniform_(*this, lo, hi, default_generator().engine());
  return *this;
}
Tensor& Tensor::normal_(double mean, double std) {
  TP_CHECK(!(GradMode::is_enabled() && requires_grad()),
           "normal_: random fill of a tensor of shape {} that requires grad; wrap it in NoGradGuard", sizes());
  kernels::normal_(*this, mean, std, default_generator().engine());
  return *this;
}

}  // namespace tapestry
