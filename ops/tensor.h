// The strided Tensor: a handle (shared_ptr) to a TensorImpl, which is a view (shape, strides in
// elements, offset) into a Storage shared by every view of the same data. Views never copy.
// The user-facing ops (declared in autograd/functions.h, defined in autograd/) record themselves on
// the autograd tape; the raw kernels they call live in ops/detail/kernels.h and know nothing of grads.
// Note [Sealed core]: like libtorch's TensorBody, this class declares the method forms users type
// (x.add(y), x.sum(), x.backward(), x.view(...)) and printing; autograd/ defines them. The core's own
// code (ops/) never calls them: it links without autograd, and tools/check-layers.py --objects (a
// ctest) fails when an object file of a lower layer needs a symbol that only a higher layer defines.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "tapestry/ops/dtype.h"
#include "tapestry/ops/error.h"
#include "tapestry/ops/shape.h"

namespace tapestry {

struct Node;  // autograd/node.h: one recorded op on the tape
struct ValuesIndices;  // autograd/functions.h: what max(dim), sort and topk return
class Tensor;
class HookHandle;

// Note [Version counter]: every in-place write bumps the storage's version. A tensor saved for
// backward remembers the version it had; backward() compares and refuses stale data.
struct Storage {
  Storage(size_t nbytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data = nullptr;
  size_t nbytes = 0;
  Device device = Device::CPU;
  uint64_t version = 0;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;  // in elements
  int64_t offset = 0;  // in elements
  DType dtype = DType::Float32;

  // Autograd state; the logic lives in autograd/. Leaves have no grad_fn.
  bool requires_grad = false;
  std::shared_ptr<Node> grad_fn;              // the op that made this tensor (non-leaves only)
  std::shared_ptr<TensorImpl> grad;           // accumulated gradient (leaves)
  std::weak_ptr<Node> grad_accumulator;       // the leaf's AccumulateGrad node, shared by all uses
  // Leaves: called, in registration order, each time a backward has accumulated into grad (by id,
  // so that a HookHandle can remove one).
  std::vector<std::pair<int64_t, std::function<void(const Tensor&)>>> post_accumulate_grad_hooks;
};

struct TensorOptions {
  DType dtype = DType::Float32;
  Device device = Device::CPU;
  bool requires_grad = false;
  TensorOptions() = default;
  TensorOptions(DType d) : dtype(d) {}     // NOLINT: implicit, so zeros({2}, kFloat64) reads well
  TensorOptions(Device d) : device(d) {}   // NOLINT: implicit, so zeros({2}, Device::CUDA) reads well
  TensorOptions(DType t, Device d) : dtype(t), device(d) {}
};

class Tensor;
using TensorList = std::vector<Tensor>;

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- metadata
  bool defined() const { return impl_ != nullptr; }
  const Shape& sizes() const;
  int64_t size(int64_t dim) const;
  const Shape& strides() const;
  int64_t stride(int64_t dim) const;
  int64_t dim() const { return static_cast<int64_t>(sizes().size()); }
  int64_t numel() const { return shape_numel(sizes()); }
  int64_t offset() const { return impl().offset; }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device; }
  TensorOptions options() const { return TensorOptions(dtype(), device()); }  // dtype and device, no grad
  bool is_contiguous() const;
  const Storage* storage() const { return impl().storage.get(); }
  uint64_t version() const { return impl().storage->version; }
  TensorImpl& impl() const;
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

  // Pointer to the first element (offset applied). T must match dtype(). On a GPU tensor this is
  // a device pointer: read values with item() or to_vector(), which copy to the host.
  template <class T> T* data_ptr() const;
  void* raw_data() const;
  // The single value of a one-element tensor, converted to T.
  template <class T> T item() const;
  // All values in row-major order, converted to T.
  template <class T> std::vector<T> to_vector() const;

  // ---- autograd
  bool requires_grad() const { return impl().requires_grad; }
  Tensor& requires_grad_(bool on = true);
  bool is_leaf() const { return impl().grad_fn == nullptr; }
  // The accumulated gradient: undefined before any backward reached it. A non-leaf keeps none
  // unless retain_grad() was called before the backward (as PyTorch): asking for it then throws,
  // saying so, where PyTorch returns None with a warning.
  Tensor grad() const;
  void zero_grad();     // drops the accumulated gradient (as PyTorch's set_to_none)
  // A non-leaf that requires grad keeps its gradient in grad() from the next backward on (summed
  // over backwards, as a leaf's). A no-op on a leaf.
  void retain_grad() const;
  bool retains_grad() const;
  const std::shared_ptr<Node>& grad_fn() const { return impl().grad_fn; }
  std::string grad_fn_name() const;
  // create_graph: the backward records its own ops, so the .grad it leaves can be differentiated
  // again (second derivatives); it implies retain_graph, as in PyTorch. Such a .grad's history
  // holds its own leaf (a cycle, as PyTorch warns): zero_grad() frees it; autograd::grad avoids it.
  void backward(const Tensor& grad = Tensor(), bool retain_graph = false, bool create_graph = false) const;
  Tensor detach() const;  // same storage, no history
  // As PyTorch's: `hook(leaf)` runs once per backward, right after that backward has added this
  // leaf's gradient into leaf.grad() (so grad() is final for that backward), while the backward
  // goes on with the rest of the graph. Data parallelism starts a bucket's all-reduce from it.
  // Leaves that require grad only; the hook runs with grad mode off. Keep the handle to remove it.
  HookHandle register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook) const;

  // ---- views (no copy) and copies; all differentiable
  Tensor view(const Shape& shape) const;
  Tensor reshape(const Shape& shape) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor t() const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor unfold(int64_t dim, int64_t size, int64_t step) const;
  Tensor expand(const Shape& shape) const;
  Tensor expand_as(const Tensor& other) const;
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor contiguous() const;
  Tensor clone() const;
  Tensor to(DType dtype) const;
  // A copy on `device` (this tensor itself when already there); differentiable, as in PyTorch.
  Tensor to(Device device) const;
  Tensor cpu() const { return to(Device::CPU); }

  // ---- math (differentiable), see autograd/functions.h for the free-function forms
  Tensor exp() const;
  Tensor log() const;
  Tensor sqrt() const;
  Tensor rsqrt() const;
  Tensor tanh() const;
  Tensor relu() const;
  Tensor gelu() const;
  Tensor sigmoid() const;
  Tensor abs() const;
  Tensor neg() const;
  Tensor pow(double exponent) const;
  Tensor clamp(double lo, double hi) const;
  Tensor clamp_min(double lo) const;
  Tensor log1p() const;
  Tensor expm1() const;
  Tensor softplus(double beta = 1.0, double threshold = 20.0) const;
  Tensor logsumexp(int64_t dim, bool keepdim = false) const;
  Tensor sum() const;
  Tensor sum(const std::vector<int64_t>& dims, bool keepdim = false) const;
  Tensor mean() const;
  Tensor mean(const std::vector<int64_t>& dims, bool keepdim = false) const;
  Tensor softmax(int64_t dim) const;
  Tensor log_softmax(int64_t dim) const;
  Tensor matmul(const Tensor& other) const;
  Tensor masked_fill(const Tensor& mask, double value) const;
  // The method forms libtorch users type: each is the function of the same name in
  // autograd/functions.h, with this tensor first (x.add(y) is add(x, y), differentiable alike).
  Tensor add(const Tensor& other) const;
  Tensor add(double other) const;
  Tensor sub(const Tensor& other) const;
  Tensor sub(double other) const;
  Tensor mul(const Tensor& other) const;
  Tensor mul(double other) const;
  Tensor div(const Tensor& other) const;
  Tensor div(double other) const;
  Tensor maximum(const Tensor& other) const;
  Tensor minimum(const Tensor& other) const;
  Tensor eq(const Tensor& other) const;
  Tensor eq(double other) const;
  Tensor ne(const Tensor& other) const;
  Tensor ne(double other) const;
  Tensor lt(const Tensor& other) const;
  Tensor lt(double other) const;
  Tensor le(const Tensor& other) const;
  Tensor le(double other) const;
  Tensor gt(const Tensor& other) const;
  Tensor gt(double other) const;
  Tensor ge(const Tensor& other) const;
  Tensor ge(double other) const;
  Tensor logical_not() const;
  Tensor max() const;  // over all elements
  Tensor min() const;
  ValuesIndices max(int64_t dim, bool keepdim = false) const;
  ValuesIndices min(int64_t dim, bool keepdim = false) const;
  Tensor argmax(int64_t dim, bool keepdim = false) const;
  Tensor argmin(int64_t dim, bool keepdim = false) const;
  Tensor var(const std::vector<int64_t>& dims = {}, int64_t correction = 1, bool keepdim = false) const;
  Tensor index_select(int64_t dim, const Tensor& index) const;
  Tensor gather(int64_t dim, const Tensor& index) const;
  Tensor scatter(int64_t dim, const Tensor& index, const Tensor& src) const;
  Tensor scatter(int64_t dim, const Tensor& index, double value) const;
  Tensor scatter_add(int64_t dim, const Tensor& index, const Tensor& src) const;
  Tensor tril(int64_t diagonal = 0) const;
  Tensor triu(int64_t diagonal = 0) const;
  Tensor cumsum(int64_t dim) const;
  ValuesIndices sort(int64_t dim = -1, bool descending = false) const;
  Tensor argsort(int64_t dim = -1, bool descending = false) const;
  ValuesIndices topk(int64_t k, int64_t dim = -1, bool largest = true, bool sorted = true) const;

  // ---- in place (bump the version; refused on tensors that require grad while grad mode is on)
  Tensor& fill_(double value);
  Tensor& zero_();
  Tensor& copy_(const Tensor& src);  // src broadcast to this shape, converted to this dtype
  Tensor& add_(const Tensor& other, double alpha = 1.0);
  Tensor& add_(double value);
  Tensor& sub_(const Tensor& other);
  Tensor& sub_(double value);
  Tensor& mul_(const Tensor& other);
  Tensor& mul_(double value);
  Tensor& div_(const Tensor& other);
  Tensor& div_(double value);
  Tensor& masked_fill_(const Tensor& mask, double value);
  Tensor& uniform_(double lo, double hi);
  Tensor& normal_(double mean = 0.0, double std = 1.0);

 private:
  std::shared_ptr<TensorImpl> impl_;
};

// What Tensor::register_post_accumulate_grad_hook returns: remove() unregisters the hook (a second
// remove(), or one after the tensor is gone, does nothing). Dropping the handle keeps the hook.
class HookHandle {
 public:
  HookHandle() = default;
  HookHandle(std::weak_ptr<TensorImpl> owner, int64_t id) : owner_(std::move(owner)), id_(id) {}
  void remove();

 private:
  std::weak_ptr<TensorImpl> owner_;
  int64_t id_ = -1;
};

// Builds a tensor header over existing storage (used by views and kernels).
Tensor make_tensor(std::shared_ptr<Storage> storage, Shape shape, Shape strides, int64_t offset, DType dtype);

// Printing (autograd/print.cpp: it names the grad_fn).
std::string to_string(const Tensor& t);
std::ostream& operator<<(std::ostream& os, const Tensor& t);

}  // namespace tapestry

template <> struct fmt::formatter<tapestry::Tensor> : fmt::formatter<std::string_view> {
  template <class Ctx> auto format(const tapestry::Tensor& t, Ctx& ctx) const {
    return fmt::formatter<std::string_view>::format(tapestry::to_string(t), ctx);
  }
};
