// The reverse-mode engine: grad mode, recording, and backward(). backward() counts each node's
// dependencies with an iterative DFS, then runs nodes in topological order (Kahn's algorithm),
// summing the gradients that flow into each node before running it. No recursion, so deep
// graphs cannot overflow the stack. Broadcast reduction and gradient shape checks happen here,
// once, for every op.
#include <cmath>
#include <unordered_map>
#include <utility>

#include "tapestry/autograd/anomaly.h"
#include "tapestry/autograd/functions.h"
#include "tapestry/autograd/node.h"
#include "tapestry/ops/factory.h"
#include "tapestry/ops/detail/kernels.h"
#include "tapestry/ops/profile.h"

namespace tapestry {

namespace {
thread_local bool grad_enabled = true;
bool anomaly_enabled = false;
// The node whose backward runs now on this thread (Note [Saved tensors in a recording backward]).
thread_local std::shared_ptr<Node> running_node;

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
    : data_(t.defined() ? t.detach() : Tensor()),
      input_(t.defined() && t.requires_grad() ? t.impl_ptr() : nullptr),
      version_(t.defined() ? t.version() : 0),
      op_(op) {}

SavedTensor SavedTensor::output(const Tensor& out, const char* op) {
  SavedTensor s(out, op);
  s.input_ = nullptr;
  s.is_output_ = true;
  return s;
}

Tensor SavedTensor::get() const {
  if (!data_.defined()) return data_;
  TP_CHECK(data_.version() == version_,
           "backward: a tensor of shape {} saved by {} was modified by an in-place operation after it was saved "
           "(its version is {}, expected {}); clone() it before modifying it",
           data_.sizes(), op_, data_.version(), version_);
  if (GradMode::is_enabled()) {  // a recording backward: the value with its history
    if (input_) return Tensor(input_);
    if (is_output_ && running_node) {
      Tensor t = data_.detach();
      t.impl().grad_fn = running_node;
      t.impl().requires_grad = true;
      return t;
    }
  }
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
  if (GradMode::is_enabled()) return reshape(sum(grad, dims, true), shape);  // a recording backward
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

namespace {

// The gradient an output starts from: the given one, or ones for a one-element output.
Tensor initial_grad(const char* op, const Tensor& out, const Tensor& given, size_t which) {
  if (!given.defined()) {
    TP_CHECK(out.numel() == 1,
             "{}: a gradient can be implied only for a scalar output, but the output{} has shape {}; pass {} explicitly",
             op, which == 0 ? std::string() : fmt::format(" {}", which), out.sizes(),
             std::string(op) == "backward" ? "backward(grad)" : "its grad_outputs entry");
    return ones(out.sizes(), out.options());
  }
  TP_CHECK(given.sizes() == out.sizes() && given.dtype() == out.dtype(),
           "{}: the gradient ({} {}) must match the output ({} {})", op, given.dtype(), given.sizes(), out.dtype(),
           out.sizes());
  return given;
}

Tensor add_grads(const Tensor& a, const Tensor& b, bool create_graph) {
  return create_graph ? add(a, b) : kernels::binary("backward", kernels::Binary::Add, a, b);
}

// Runs the graph behind `roots` (each with its gradient). captures == nullptr: a backward(), which
// accumulates into the leaves' .grad. Otherwise autograd::grad: the gradient reaching each node of
// `capture_nodes` is summed into captures[i], no .grad is touched, and only nodes that lead to a
// captured one run.
void execute(const TensorList& roots, const TensorList& root_grads, bool retain_graph, bool create_graph,
             const std::vector<Node*>* capture_nodes, TensorList* captures) {
  GradModeGuard mode(create_graph);

  std::vector<std::shared_ptr<Node>> starts;
  std::unordered_map<Node*, Tensor> pending;  // gradients summed so far, per node
  for (size_t r = 0; r < roots.size(); ++r) {
    std::shared_ptr<Node> start = roots[r].grad_fn();
    if (!start) start = grad_accumulator(roots[r]);  // a leaf
    Tensor& slot = pending[start.get()];
    if (!slot.defined()) starts.push_back(start);
    slot = slot.defined() ? add_grads(slot, root_grads[r], create_graph) : root_grads[r];
  }

  // Dependencies: how many edges lead into each node from the part of the graph we reach.
  std::unordered_map<Node*, int> deps;
  std::vector<Node*> stack;
  for (const auto& s : starts) {
    if (deps.try_emplace(s.get(), 0).second) stack.push_back(s.get());
  }
  std::vector<Node*> order;  // discovery order (for the pruning pass)
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    order.push_back(n);
    for (const auto& next : n->next) {
      if (!next) continue;
      auto [it, fresh] = deps.try_emplace(next.get(), 0);
      ++it->second;
      if (fresh) stack.push_back(next.get());
    }
  }
  // autograd::grad: a node runs only when one of its inputs' nodes is captured or runs (a fixed
  // point over the DAG, walked from the leaves' end first, so one or two sweeps settle it).
  std::unordered_map<Node*, bool> needed;
  if (capture_nodes) {
    std::unordered_map<Node*, bool> captured;
    for (Node* c : *capture_nodes) captured[c] = true;
    for (bool changed = true; changed;) {
      changed = false;
      for (auto it = order.rbegin(); it != order.rend(); ++it) {
        Node* n = *it;
        if (needed[n]) continue;
        for (const auto& next : n->next)
          if (next && (captured[next.get()] || needed[next.get()])) {
            needed[n] = changed = true;
            break;
          }
      }
    }
  }

  std::vector<std::shared_ptr<Node>> ready;
  for (const auto& s : starts)
    if (deps[s.get()] == 0) ready.push_back(s);
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
    if (capture_nodes && g.defined()) {
      for (size_t c = 0; c < capture_nodes->size(); ++c) {
        if ((*capture_nodes)[c] != node.get()) continue;
        Tensor& slot = (*captures)[c];
        Tensor gc = node->leaf ? (create_graph ? to(g, node->leaf->dtype) : kernels::to_dtype(g, node->leaf->dtype)) : g;
        slot = slot.defined() ? add_grads(slot, gc, create_graph) : gc;
      }
      if (node->leaf || !needed[node.get()]) g = Tensor();  // nothing past it is asked for
    }
    if (!g.defined()) {  // no gradient reached this node (or none is needed): it only counts down its inputs
      release_edges();
      continue;
    }
    if (std::shared_ptr<TensorImpl> out = node->retained.lock()) {  // retain_grad(): a copy, summed over backwards
      if (create_graph) {
        out->grad = (out->grad ? add(Tensor(out->grad), g) : g).impl_ptr();
      } else if (out->grad) {
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
      if (create_graph) {
        // As PyTorch: the gradient keeps its history (out of place, so an earlier .grad is not changed).
        Tensor gl = to(g, leaf.dtype);
        leaf.grad = (leaf.grad ? add(Tensor(leaf.grad), gl) : gl).impl_ptr();
      } else {
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
      std::shared_ptr<Node> outer = std::exchange(running_node, node);
      try {
        grads = node->backward(g);
      } catch (...) {
        running_node = std::move(outer);
        throw;
      }
      running_node = std::move(outer);
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
      slot = slot.defined() ? add_grads(slot, gi, create_graph) : gi;
    }
    release_edges();
  }
}

void check_create_graph(const char* op, bool create_graph) {
  TP_CHECK(!create_graph || GradMode::is_enabled(),
           "{}: create_graph inside NoGradGuard: the backward would have to record its ops while grad mode is off; "
           "leave the NoGradGuard scope (or open an EnableGradGuard) first",
           op);
}

}  // namespace

void run_backward(const Tensor& root, const Tensor& grad_in, bool retain_graph, bool create_graph) {
  TP_CHECK(root.requires_grad(),
           "backward: the tensor of shape {} does not require grad and has no grad_fn (did you forget "
           "requires_grad_(), or run the forward under NoGradGuard?)",
           root.sizes());
  check_create_graph("backward", create_graph);
  Tensor grad = initial_grad("backward", root, grad_in, 0);
  execute({root}, {grad}, retain_graph || create_graph, create_graph, nullptr, nullptr);
}

TensorList run_grad(const TensorList& outputs, const TensorList& inputs, const TensorList& grad_outputs,
                    bool retain_graph, bool create_graph, bool allow_unused) {
  const char* op = "autograd::grad";
  check_create_graph(op, create_graph);
  TP_CHECK(!outputs.empty() && !inputs.empty(), "{}: needs at least one output and one input, got {} and {}", op,
           outputs.size(), inputs.size());
  TP_CHECK(grad_outputs.empty() || grad_outputs.size() == outputs.size(),
           "{}: got {} grad_outputs for {} outputs (give one per output, or none for one-element outputs)", op,
           grad_outputs.size(), outputs.size());
  TensorList roots, grads;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    TP_CHECK(out.defined() && out.requires_grad(),
             "{}: output {} does not require grad and has no grad_fn (computed from inputs that need no gradient, or "
             "under NoGradGuard)",
             op, i);
    roots.push_back(out);
    grads.push_back(initial_grad(op, out, grad_outputs.empty() ? Tensor() : grad_outputs[i], i));
  }
  std::vector<Node*> capture_nodes;
  std::vector<std::shared_ptr<Node>> keep;  // a leaf's accumulator must outlive the pass
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = inputs[i];
    TP_CHECK(x.defined() && x.requires_grad(), "{}: input {} (shape {}) does not require grad; only tensors that "
             "require grad can be differentiated against", op, i, x.defined() ? x.sizes() : Shape{});
    keep.push_back(x.grad_fn() ? x.grad_fn() : grad_accumulator(x));
    capture_nodes.push_back(keep.back().get());
  }
  TensorList captures(inputs.size());
  execute(roots, grads, retain_graph, create_graph, &capture_nodes, &captures);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (captures[i].defined()) continue;
    TP_CHECK(allow_unused, "{}: input {} (shape {}) was not used in computing the outputs; pass allow_unused = true "
             "to get an undefined gradient for it", op, i, inputs[i].sizes());
  }
  return captures;
}

TensorList composite_vjp(const std::function<Tensor(const TensorList&)>& f, const TensorList& inputs, const Tensor& g) {
  EnableGradGuard recording;
  Tensor out = f(inputs);
  TensorList wanted, grads(inputs.size());
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) wanted.push_back(t);
  if (wanted.empty() || !out.requires_grad()) return grads;
  TensorList got = run_grad({out}, wanted, {g}, true, true, true);
  for (size_t i = 0, w = 0; i < inputs.size(); ++i)
    if (inputs[i].defined() && inputs[i].requires_grad()) grads[i] = got[w++];
  return grads;
}

Tensor linear_in_grad(const char* name, Tensor out, const Tensor& g, std::function<Tensor(const Tensor&)> adjoint) {
  return record(name, std::move(out), {g}, [adjoint = std::move(adjoint)](const Tensor& gg) {
    return TensorList{adjoint(gg)};
  });
}

}  // namespace tapestry
