// autograd::grad and autograd::functional (see functional.h), on the engine's run_grad.
#include "tapestry/autograd/functional.h"

#include "tapestry/autograd/functions.h"
#include "tapestry/autograd/node.h"

namespace tapestry::autograd {

TensorList grad(const TensorList& outputs, const TensorList& inputs, const TensorList& grad_outputs,
                std::optional<bool> retain_graph, bool create_graph, bool allow_unused) {
  return run_grad(outputs, inputs, grad_outputs, retain_graph.value_or(create_graph), create_graph, allow_unused);
}

namespace functional {

namespace {

// The inputs func runs on: fresh leaves that require grad, or, with create_graph, the caller's
// tensors themselves where they require grad (so the result stays a function of them).
TensorList prepare(const char* op, const TensorList& inputs, bool create_graph) {
  TP_CHECK(!inputs.empty(), "{}: needs at least one input", op);
  TensorList out;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = inputs[i];
    TP_CHECK(x.defined() && is_floating(x.dtype()), "{}: input {} must be a defined floating-point tensor", op, i);
    if (create_graph && x.requires_grad()) out.push_back(view(x, x.sizes()));  // a new node over x's history
    else out.push_back(x.detach().requires_grad_());
  }
  return out;
}

Tensor evaluate(const char* op, const Function& func, const TensorList& xs) {
  EnableGradGuard recording;
  Tensor out = func(xs);
  TP_CHECK(out.defined(), "{}: the function returned an undefined tensor", op);
  return out;
}

// Gradients of out against xs; an input out does not depend on gets zeros, as PyTorch's
// functional API (strict = false).
TensorList grads_of(const Tensor& out, const TensorList& xs, const Tensor& weight, bool create_graph) {
  TensorList g(xs.size());
  if (out.requires_grad()) g = run_grad({out}, xs, {weight}, true, create_graph, true);
  for (size_t i = 0; i < xs.size(); ++i)
    if (!g[i].defined()) g[i] = zeros(xs[i].sizes(), xs[i].options());
  return g;
}

void check_like(const char* op, const char* what, const TensorList& v, const TensorList& xs) {
  TP_CHECK(v.size() == xs.size(), "{}: {} has {} tensors for {} inputs", op, what, v.size(), xs.size());
  for (size_t i = 0; i < v.size(); ++i)
    TP_CHECK(v[i].defined() && v[i].sizes() == xs[i].sizes() && v[i].dtype() == xs[i].dtype(),
             "{}: {}[{}] must match input {} ({} {}), got {}", op, what, i, i, xs[i].dtype(), xs[i].sizes(),
             v[i].defined() ? fmt::format("{} {}", v[i].dtype(), v[i].sizes()) : std::string("undefined"));
}

Tensor weight_for(const char* op, const Tensor& out, const Tensor& v) {
  if (v.defined()) {
    TP_CHECK(v.sizes() == out.sizes() && v.dtype() == out.dtype(), "{}: v ({} {}) must match the output ({} {})", op,
             v.dtype(), v.sizes(), out.dtype(), out.sizes());
    return v;
  }
  TP_CHECK(out.numel() == 1, "{}: v may be omitted only for a one-element output; the output has shape {}", op,
           out.sizes());
  return ones(out.sizes(), out.options());
}

Tensor finish(const Tensor& t, bool create_graph) { return create_graph ? t : t.detach(); }

}  // namespace

std::pair<Tensor, TensorList> vjp(const Function& func, const TensorList& inputs, const Tensor& v, bool create_graph) {
  const TensorList xs = prepare("vjp", inputs, create_graph);
  const Tensor out = evaluate("vjp", func, xs);
  TensorList g = grads_of(out, xs, weight_for("vjp", out, v), create_graph);
  for (Tensor& t : g) t = finish(t, create_graph);
  return {finish(out, create_graph), g};
}

std::pair<Tensor, Tensor> jvp(const Function& func, const TensorList& inputs, const TensorList& v, bool create_graph) {
  const TensorList xs = prepare("jvp", inputs, create_graph);
  check_like("jvp", "v", v, xs);
  const Tensor out = evaluate("jvp", func, xs);
  // The double-vjp trick: u -> J^T u is linear in u, so differentiating <J^T u, v> in u gives J v.
  Tensor u = zeros(out.sizes(), out.options()).requires_grad_();
  TensorList jt_u = grads_of(out, xs, u, true);
  Tensor inner = scalar_tensor(0.0, out.options());
  for (size_t i = 0; i < xs.size(); ++i) inner = add(inner, sum(mul(jt_u[i], v[i])));
  Tensor jv = zeros(out.sizes(), out.options());
  if (inner.requires_grad()) {
    TensorList r = run_grad({inner}, {u}, {}, true, create_graph, true);
    if (r[0].defined()) jv = r[0];
  }
  return {finish(out, create_graph), finish(jv, create_graph)};
}

TensorList jacobian(const Function& func, const TensorList& inputs, bool create_graph) {
  const TensorList xs = prepare("jacobian", inputs, create_graph);
  const Tensor out = evaluate("jacobian", func, xs);
  const int64_t m = out.numel();
  // One vjp per output element (a one-hot weight), stacked: row k is d out[k] / d inputs.
  std::vector<TensorList> rows(xs.size());
  for (int64_t k = 0; k < m; ++k) {
    Tensor e = zeros({m}, out.options());
    {
      NoGradGuard raw;
      e.select(0, k).fill_(1.0);
    }
    TensorList g = grads_of(out, xs, reshape(e, out.sizes()), create_graph);
    for (size_t i = 0; i < xs.size(); ++i) rows[i].push_back(g[i]);
  }
  TensorList result;
  for (size_t i = 0; i < xs.size(); ++i) {
    Shape shape = out.sizes();
    for (int64_t s : xs[i].sizes()) shape.push_back(s);
    Tensor j = m == 0 ? zeros(shape, xs[i].options()) : reshape(stack(rows[i], 0), shape);
    result.push_back(finish(j, create_graph));
  }
  return result;
}

std::vector<TensorList> hessian(const Function& func, const TensorList& inputs, bool create_graph) {
  // One jacobian of the whole gradient, flattened and concatenated: row block i (its numel(i)
  // rows) is d grad_i / d inputs.
  const TensorList xs = prepare("hessian", inputs, create_graph);
  const TensorList rows = jacobian(
      [&func](const TensorList& in) {
        const Tensor out = func(in);
        TP_CHECK(out.numel() == 1, "hessian: the function must return one element, got shape {}", out.sizes());
        TensorList flat;
        for (const Tensor& g : grads_of(out, in, ones(out.sizes(), out.options()), true)) flat.push_back(reshape(g, {-1}));
        return cat(flat, 0);
      },
      xs, create_graph);
  std::vector<TensorList> h(xs.size());
  int64_t start = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const int64_t n = xs[i].numel();
    for (size_t j = 0; j < xs.size(); ++j) {
      Shape shape = xs[i].sizes();
      for (int64_t s : xs[j].sizes()) shape.push_back(s);
      h[i].push_back(reshape(rows[j].narrow(0, start, n), shape));
    }
    start += n;
  }
  return h;
}

std::pair<Tensor, TensorList> vhp(const Function& func, const TensorList& inputs, const TensorList& v, bool create_graph) {
  const TensorList xs = prepare("vhp", inputs, create_graph);
  check_like("vhp", "v", v, xs);
  const Tensor out = evaluate("vhp", func, xs);
  TP_CHECK(out.numel() == 1, "vhp: the function must return one element, got shape {}", out.sizes());
  TensorList g = grads_of(out, xs, ones(out.sizes(), out.options()), true);
  Tensor inner = scalar_tensor(0.0, out.options());
  for (size_t i = 0; i < xs.size(); ++i) inner = add(inner, sum(mul(g[i], v[i])));
  TensorList r = grads_of(inner, xs, ones({}, out.options()), create_graph);  // zeros where H v has no path
  for (Tensor& t : r) t = finish(t, create_graph);
  return {finish(out, create_graph), r};
}

std::pair<Tensor, TensorList> hvp(const Function& func, const TensorList& inputs, const TensorList& v, bool create_graph) {
  // H is symmetric for a twice-differentiable func, so H v = (v^T H)^T; PyTorch's hvp takes the
  // double-vjp route to the same numbers.
  auto [out, r] = vhp(func, inputs, v, create_graph);
  return {out, r};
}

}  // namespace functional
}  // namespace tapestry::autograd
