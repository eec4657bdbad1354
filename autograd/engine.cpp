// The reverse-mode engine: grad mode, recording, and backward(). backward() counts each node's
// dependencies with an iterative DFS, then runs nodes in topological order (Kahn's algorithm),
// summing the gradients that flow into each node before running it. No recursion, so deep
// graphs cannot overflow the stack. Broadcast reduction and gradient shape checks happen here,
// once, for every op.
#include <unordered_map>

#include <cmath>

#include "tapestry/autograd/anomaly.h"
#include "tapestry/autograd/node.h"
#include "tapestry/ops/factory.h"
#include "tapestry/ops/detail/kernels.h"
#include "tapestry/ops/profile.h"

namespace tapestry {

namespace {
thread_local bool grad_enabled = true;
bool anomaly_enabled = false;

// The first non-finite element of a floating tensor (NaN only, or NaN and inf), as a string, or "".
std::string first_bad_value(const Tensor& t, bool nan_only) {
  if (!is_floating(t.dtype()) || t.numel() == 0) return "";
  // Read on the host: a device tensor is copied there first (a synchronisation; anomaly mode is a
  // debugging mode).
  Tensor c = kernels::contiguous(kernels::to_device(t, Device::CPU));
  std::string found;
  dispatch_floating(c.dtype(), "detect_anomaly", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* p = c.data_ptr<T>();
    for (int64_t i = 0; i < c.numel(); ++i)
      if (std::isnan(p[i]) || (!nan_only && std::isinf(p[i]))) {
        found = fmt::format("{} at element {}", static_cast<double>(p[i]), i);
        return;
      }
  });
  return found;
}
}  // namespace

bool GradMode::is_enabled() { return grad_enabled; }
void GradMode::set_enabled(bool on) { grad_enabled = on; }
bool AnomalyMode::is_enabled() { return anomaly_enabled; }
void AnomalyMode::set_enabled(bool on) { anomaly_enabled = on; }

SavedTensor::SavedTensor(const Tensor& t, const char* op)
    : data_(t.defined() ? t.detach() : Tensor()), version_(t.defined() ? t.version() : 0), op_(op) {}

Tensor SavedTensor::get() const {
  if (data_.defined())
    TP_CHECK(data_.version() == version_,
             "backward: a tensor of shape {} saved by {} was modified by an in-place operation after it was saved "
             "(its version is {}, expected {}); clone() it before modifying it",
             data_.sizes(), op_, data_.version(), version_);
  return data_;
}

Node::~Node() {
  std::vector<std::shared_ptr<Node>> doomed = std::move(next);
  while (!doomed.empty()) {
    std::shared_ptr<Node> n = std::move(doomed.back());
    doomed.pop_back();
    // Only a node we hold the last reference to dies here; take its edges first so that its
    // destructor finds nothing to recurse into.
    if (n && n.use_count() == 1)
      for (auto& e : n->next) doomed.push_back(std::move(e));
  }
}

bool any_requires_grad(const TensorList& inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

namespace {
std::shared_ptr<Node> grad_accumulator(const Tensor& leaf) {
  TensorImpl& impl = leaf.impl();
  if (auto node = impl.grad_accumulator.lock()) return node;
  auto node = std::make_shared<Node>();
  node->name = "AccumulateGrad";
  node->leaf = leaf.impl_ptr();
  node->input_shapes = {leaf.sizes()};
  node->input_dtypes = {leaf.dtype()};
  impl.grad_accumulator = node;
  return node;
}
}  // namespace

Tensor record(const char* name, Tensor out, const TensorList& inputs, BackwardFn backward) {
  if (!any_requires_grad(inputs)) return out;
  if (anomaly_enabled) {
    std::string bad = first_bad_value(out, true);
    TP_CHECK(bad.empty(), "detect_anomaly: the forward of the op recorded as {} produced {} in its output of shape {}",
             name, bad, out.sizes());
  }
  auto node = std::make_shared<Node>();
  node->name = name;
  for (const Tensor& t : inputs) {
    std::shared_ptr<Node> edge;
    if (t.defined() && t.requires_grad()) edge = t.grad_fn() ? t.grad_fn() : grad_accumulator(t);
    node->next.push_back(std::move(edge));
    node->input_shapes.push_back(t.defined() ? t.sizes() : Shape{});
    node->input_dtypes.push_back(t.defined() ? t.dtype() : DType::Float32);
  }
  node->backward = std::move(backward);
  out.impl().grad_fn = std::move(node);
  out.impl().requires_grad = true;
  return out;
}

Tensor sum_to(const Tensor& grad, const Shape& shape) {
  if (grad.sizes() == shape) return grad;
  const int64_t lead = grad.dim() - static_cast<int64_t>(shape.size());
  TP_CHECK(lead >= 0, "sum_to: gradient of shape {} has fewer dims than the target shape {}", grad.sizes(), shape);
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < grad.dim(); ++d) {
    if (d < lead || (shape[d - lead] == 1 && grad.size(d) != 1)) dims.push_back(d);
    else TP_CHECK(grad.size(d) == shape[d - lead], "sum_to: gradient of shape {} cannot be summed to shape {}",
                  grad.sizes(), shape);
  }
  if (dims.empty()) return grad;
  Tensor r = kernels::reduce("sum_to", kernels::Reduce::Sum, grad, dims, true);
  // Drop the leading dims that keepdim left as 1s.
  return make_tensor(r.impl().storage, shape, contiguous_strides(shape), r.offset(), r.dtype());
}

void check_inplace(const char* op, const Tensor& t) {
  TP_CHECK(!(GradMode::is_enabled() && t.requires_grad() && t.is_leaf()),
           "{}: in-place operation on a leaf tensor of shape {} that requires grad; use the out-of-place op, "
           "or wrap the update in NoGradGuard",
           op, t.sizes());
}

void run_backward(const Tensor& root, const Tensor& grad_in, bool retain_graph) {
  TP_CHECK(root.requires_grad(),
           "backward: the tensor of shape {} does not require grad and has no grad_fn (did you forget "
           "requires_grad_(), or run the forward under NoGradGuard?)",
           root.sizes());
  Tensor grad = grad_in;
  if (!grad.defined()) {
    TP_CHECK(root.numel() == 1,
             "backward: a gradient can be implied only for a scalar output, but the output has shape {}; pass "
             "backward(grad) explicitly",
             root.sizes());
    grad = ones(root.sizes(), root.options());
  }
  TP_CHECK(grad.sizes() == root.sizes() && grad.dtype() == root.dtype(),
           "backward: the gradient ({} {}) must match the output ({} {})", grad.dtype(), grad.sizes(), root.dtype(),
           root.sizes());
  NoGradGuard no_grad;

  std::shared_ptr<Node> start = root.grad_fn();
  if (!start) start = grad_accumulator(root);  // root is itself a leaf

  // Dependencies: how many edges lead into each node from the part of the graph we reach.
  std::unordered_map<Node*, int> deps;
  std::vector<Node*> stack{start.get()};
  deps[start.get()] = 0;
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const auto& next : n->next) {
      if (!next) continue;
      auto [it, fresh] = deps.try_emplace(next.get(), 0);
      ++it->second;
      if (fresh) stack.push_back(next.get());
    }
  }

  std::unordered_map<Node*, Tensor> pending;  // gradients summed so far, per node
  pending[start.get()] = grad;
  std::vector<std::shared_ptr<Node>> ready{start};
  while (!ready.empty()) {
    std::shared_ptr<Node> node = std::move(ready.back());
    ready.pop_back();
    Tensor g;
    if (auto it = pending.find(node.get()); it != pending.end()) {
      g = std::move(it->second);
      pending.erase(it);
    }
    auto release_edges = [&] {
      for (const auto& next : node->next)
        if (next && --deps[next.get()] == 0) ready.push_back(next);
    };
    if (!g.defined()) {  // no gradient reached this node: it only counts down its inputs
      release_edges();
      continue;
    }
    if (std::shared_ptr<TensorImpl> out = node->retained.lock()) {  // retain_grad(): a copy, summed over backwards
      if (out->grad) {
        Tensor acc(out->grad);
        kernels::binary_("retain_grad", kernels::Binary::Add, acc, g);
      } else {
        Tensor copy = empty(g.sizes(), g.options());
        kernels::copy_(copy, g);
        out->grad = copy.impl_ptr();
      }
    }

    if (node->leaf) {  // AccumulateGrad
      TensorImpl& leaf = *node->leaf;
      Tensor gl = kernels::to_dtype(g, leaf.dtype);
      g = Tensor();  // drop this handle so that gl may be the only one left
      if (!leaf.grad) {
        // Steal a gradient nothing else can see (contiguous, covering its own storage, held only
        // here): saves a copy of every parameter's gradient per step. Otherwise copy it, so the
        // leaf's .grad never aliases a tensor another node may hold.
        const auto& st = gl.impl().storage;
        bool sole = gl.is_contiguous() && gl.offset() == 0 && gl.impl_ptr().use_count() == 1 &&
                    st.use_count() == 1 && st->nbytes == static_cast<size_t>(gl.numel()) * dtype_size(gl.dtype());
        if (sole) {
          leaf.grad = gl.impl_ptr();
        } else {
          Tensor copy = empty(gl.sizes(), gl.options());
          kernels::copy_(copy, gl);
          leaf.grad = copy.impl_ptr();
        }
      } else {
        Tensor acc(leaf.grad);
        kernels::binary_("AccumulateGrad", kernels::Binary::Add, acc, gl);
      }
      if (!leaf.post_accumulate_grad_hooks.empty()) {
        const Tensor leaf_tensor(node->leaf);
        // A copy: a hook may remove itself (or another) while we walk them.
        auto hooks = leaf.post_accumulate_grad_hooks;
        for (auto& [id, hook] : hooks) hook(leaf_tensor);
      }
      continue;
    }
    TP_CHECK(!node->released,
             "backward: trying to backward through the graph a second time (through {}); its saved tensors were "
             "freed by the first backward. Pass retain_graph=true to the first backward() if you need a second.",
             node->name);
    TensorList grads;
    {
      TP_PROFILE(node->name.c_str());
      grads = node->backward(g);
    }
    TP_CHECK(grads.size() == node->next.size(), "backward: {} returned {} gradients for {} inputs", node->name,
             grads.size(), node->next.size());
    if (anomaly_enabled)
      for (size_t i = 0; i < grads.size(); ++i) {
        if (!node->next[i] || !grads[i].defined()) continue;
        std::string bad = first_bad_value(grads[i], false);
        TP_CHECK(bad.empty(), "detect_anomaly: {} returned {} in the gradient of its input {} (shape {})", node->name,
                 bad, i, grads[i].sizes());
      }
    if (!retain_graph) {
      node->backward = nullptr;  // frees the saved tensors
      node->released = true;
    }
    for (size_t i = 0; i < grads.size(); ++i) {
      const auto& next = node->next[i];
      if (!next || !grads[i].defined()) continue;
      Tensor gi = sum_to(grads[i], node->input_shapes[i]);
      TP_CHECK(gi.sizes() == node->input_shapes[i], "backward: {} returned a gradient of shape {} for input {} of shape {}",
               node->name, gi.sizes(), i, node->input_shapes[i]);
      Tensor& slot = pending[next.get()];
      slot = slot.defined() ? kernels::binary("backward", kernels::Binary::Add, slot, gi) : gi;
    }
    release_edges();
  }
}

}  // namespace tapestry
