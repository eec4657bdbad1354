// The tape. Every differentiable op that sees an input requiring grad records one Node: its
// name, one edge per input (the node that made that input, the leaf's AccumulateGrad node, or
// null), the inputs' shapes, and a closure computing the inputs' gradients from the output's.
//
// Note [Tape ownership]: an output tensor owns its grad_fn; a node owns the nodes of its inputs
// through its edges. Saved tensors are detached aliases (SavedTensor), so no node ever owns a
// tensor that points back at it: no reference cycles, and the graph dies with its outputs.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tapestry/autograd/grad_mode.h"
#include "tapestry/ops/tensor.h"

namespace tapestry {

// Computes the gradient of each input from the gradient of the output. An undefined Tensor
// means "no gradient for this input". Runs with grad mode off.
using BackwardFn = std::function<TensorList(const Tensor& grad_output)>;

struct Node {
  std::string name;                          // e.g. "MulBackward"
  std::vector<std::shared_ptr<Node>> next;   // per input; null when the input needs no grad
  std::vector<Shape> input_shapes;           // the engine reduces broadcast grads to these
  std::vector<DType> input_dtypes;
  BackwardFn backward;                       // empty once released (see retain_graph)
  bool released = false;
  std::shared_ptr<TensorImpl> leaf;          // AccumulateGrad nodes: the leaf to accumulate into
  std::weak_ptr<TensorImpl> retained;        // the output that called retain_grad(): its grad sums this node's

  Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  // Frees a long chain of nodes iteratively: the default destructor would recurse once per node
  // and overflow the stack on deep graphs.
  ~Node();
};

// A tensor kept for backward: a detached alias plus the storage version it had when saved.
// get() refuses data that an in-place op has changed since (see Note [Version counter]).
//
// Note [Saved tensors in a recording backward]: a backward that records (create_graph: grad mode
// is on while it runs) needs the saved tensors with their history, so that its gradients depend
// on the op's inputs. An input that requires grad is kept whole for that (its TensorImpl: the
// graph above it is alive anyway through the node's edges); an op's own output cannot be (it owns
// the node: a cycle), so output() keeps the alias and get() gives it the running node as grad_fn.
// With grad mode off, get() gives the detached alias, as before.
class SavedTensor {
 public:
  SavedTensor() = default;
  SavedTensor(const Tensor& t, const char* op);
  static SavedTensor output(const Tensor& out, const char* op);  // the op's own result
  Tensor get() const;

 private:
  Tensor data_;
  std::shared_ptr<TensorImpl> input_;  // t itself, when it required grad
  bool is_output_ = false;
  uint64_t version_ = 0;
  const char* op_ = "";
};

// Records `out` as the result of op `name` applied to `inputs` when grad mode is on and some
// input requires grad; returns `out` (now with a grad_fn) either way.
Tensor record(const char* name, Tensor out, const TensorList& inputs, BackwardFn backward);

// True when grad mode is on and some input requires grad: ops skip saving tensors otherwise.
bool any_requires_grad(const TensorList& inputs);

// Reverse-mode pass from `root` with upstream gradient `grad` (see Tensor::backward). With
// create_graph the backward records its own ops, so the gradients it leaves in .grad have a
// history of their own (a second backward differentiates them).
void run_backward(const Tensor& root, const Tensor& grad, bool retain_graph, bool create_graph = false);

// The gradients of `outputs` (weighted by grad_outputs) with respect to `inputs`, returned
// instead of accumulated into any .grad: torch.autograd.grad (autograd/grad.h is the user's form).
TensorList run_grad(const TensorList& outputs, const TensorList& inputs, const TensorList& grad_outputs,
                    bool retain_graph, bool create_graph, bool allow_unused);

// A linear function of a gradient g computed by a kernel that records nothing (a scatter, a
// copy into zeros, a dropout mask): in a recording backward, out is recorded as a function of g
// whose backward is `adjoint`, the transpose of that linear map, built from recorded ops.
Tensor linear_in_grad(const char* name, Tensor out, const Tensor& g, std::function<Tensor(const Tensor&)> adjoint);

// In a recording backward: the gradient of f at `inputs` (tensors with their history) against
// the upstream g, as a recorded function of both, through f's composite of recorded ops. A fused
// kernel's backward takes this path when create_graph asks for derivatives of its gradient.
// Entries are undefined for inputs that are undefined or need no gradient.
TensorList composite_vjp(const std::function<Tensor(const TensorList&)>& f, const TensorList& inputs, const Tensor& g);

// Sums a (broadcast) gradient back down to `shape`.
Tensor sum_to(const Tensor& grad, const Shape& shape);

// In-place ops call this first: it refuses writes into leaves that require grad while grad mode
// is on, naming the op (Note [In-place autograd] in autograd/tensor_methods.cpp).
void check_inplace(const char* op, const Tensor& t);

}  // namespace tapestry
