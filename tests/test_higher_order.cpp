// Higher-order gradients (issue 45): autograd::grad, backward(create_graph), gradgradcheck, the
// errors PyTorch gives, and autograd::functional against closed forms.
#include <cmath>
#include <string>

#include "tapestry/autograd/checkpoint.h"
#include "tapestry/autograd/functional.h"
#include "tapestry/autograd/gradcheck.h"
#include "tests/helpers.h"

using namespace tapestry;
using namespace tapestry::testing;

namespace {
Tensor f64(std::initializer_list<double> v) { return tensor(v, {}, kFloat64); }
}  // namespace

TEST_CASE("autograd::grad: first, second and third derivatives of x^3, .grad untouched") {
  Tensor x = f64({1.0, -2.0, 0.5}).requires_grad_();
  Tensor y = sum(x * x * x);
  Tensor g = autograd::grad({y}, {x}, {}, std::nullopt, true)[0];
  check_values(g, {3.0, 12.0, 0.75}, 1e-12);  // 3 x^2
  CHECK(g.requires_grad());
  Tensor h = autograd::grad({sum(g)}, {x}, {}, std::nullopt, true)[0];
  check_values(h, {6.0, -12.0, 3.0}, 1e-12);  // 6 x
  Tensor t = autograd::grad({sum(h)}, {x})[0];
  check_values(t, {6.0, 6.0, 6.0}, 1e-12);
  CHECK_FALSE(x.grad().defined());  // grad() returns, never accumulates
}

TEST_CASE("backward(create_graph): .grad keeps a history, differentiated again (a gradient penalty)") {
  Tensor w = f64({0.5, -1.0}).requires_grad_();
  Tensor x = f64({2.0, 3.0}).requires_grad_();
  Tensor out = sum(tanh(w * x));
  out.backward(Tensor(), false, true);
  REQUIRE(x.grad().defined());
  CHECK(x.grad().requires_grad());
  // d/dw of |d out/dx|^2, with d out/dx = w sech^2(wx): by hand below.
  Tensor penalty = sum(x.grad() * x.grad());
  Tensor gw = autograd::grad({penalty}, {w})[0];
  std::vector<double> want;
  for (int i = 0; i < 2; ++i) {
    const double wi = i == 0 ? 0.5 : -1.0, xi = i == 0 ? 2.0 : 3.0;
    const double s2 = 1.0 / std::pow(std::cosh(wi * xi), 2), th = std::tanh(wi * xi);
    // d/dw [w^2 s2^2] = 2 w s2^2 + w^2 * 2 s2 * (-2 s2 th x)
    want.push_back(2 * wi * s2 * s2 - 4 * wi * wi * s2 * s2 * th * xi);
  }
  check_values(gw, want, 1e-10);
  // A .grad with a history refers back to its own leaf (a cycle, as in PyTorch): dropping it frees the graph.
  x.zero_grad();
  w.zero_grad();
}

TEST_CASE("autograd::grad: several outputs and inputs, grad_outputs, allow_unused, non-leaf inputs") {
  Tensor a = f64({1.0, 2.0}).requires_grad_(), b = f64({3.0}).requires_grad_(), unused = f64({1.0}).requires_grad_();
  Tensor mid = a * 2.0;  // a non-leaf input
  Tensor y1 = mid * b, y2 = sum(mid);
  TensorList g = autograd::grad({y1, y2}, {mid, b, unused}, {f64({1.0, 10.0}), Tensor()}, true, false, true);
  check_values(g[0], {3.0 + 1.0, 30.0 + 1.0});  // b * v + 1
  check_values(g[1], {2.0 * 1.0 + 4.0 * 10.0});  // sum(mid * v)
  CHECK_FALSE(g[2].defined());
  CHECK_FALSE(a.grad().defined());
}

TEST_CASE("autograd::grad and backward refuse what PyTorch refuses, with a clear message") {
  Tensor x = f64({1.0, 2.0}).requires_grad_();
  Tensor y = x * x;
  CHECK(contains(error_of([&] { autograd::grad({y}, {x}); }), "a gradient can be implied only for a scalar output"));
  Tensor constant = f64({1.0});
  CHECK(contains(error_of([&] { autograd::grad({sum(y)}, {constant}); }), "does not require grad"));
  Tensor other = f64({1.0}).requires_grad_();
  CHECK(contains(error_of([&] { autograd::grad({sum(y)}, {other}); }), "was not used in computing the outputs"));
  CHECK(contains(error_of([&] { autograd::grad({constant}, {x}); }), "output 0 does not require grad"));
  Tensor z = sum(x * x);
  autograd::grad({z}, {x});  // frees the graph (retain_graph defaults to create_graph: false)
  CHECK(contains(error_of([&] { autograd::grad({z}, {x}); }), "backward through the graph a second time"));
  Tensor w = sum(x * x);
  {
    NoGradGuard no_grad;
    CHECK(contains(error_of([&] { w.backward(Tensor(), false, true); }), "create_graph inside NoGradGuard"));
    CHECK(contains(error_of([&] { autograd::grad({w}, {x}, {}, std::nullopt, true); }), "create_graph inside NoGradGuard"));
  }
}

TEST_CASE("gradgradcheck: the fused kernels' second derivatives (gelu, softmax, layer_norm, linear, attention, cross_entropy)") {
  Generator g(5);
  Tensor x = randn({3, 4}, kFloat64, &g).requires_grad_();
  CHECK(gradgradcheck([](const TensorList& in) { return gelu(in[0]); }, {x}));
  CHECK(gradgradcheck([](const TensorList& in) { return gelu(in[0], "tanh"); }, {x}));
  CHECK(gradgradcheck([](const TensorList& in) { return softmax(in[0], 1); }, {x}));
  CHECK(gradgradcheck([](const TensorList& in) { return log_softmax(in[0], 0); }, {x}));
  Tensor w = randn({4}, kFloat64, &g).requires_grad_(), b = randn({4}, kFloat64, &g).requires_grad_();
  CHECK(gradgradcheck([](const TensorList& in) { return layer_norm(in[0], {4}, in[1], in[2]); }, {x, w, b}));
  CHECK(gradgradcheck([](const TensorList& in) { return rms_norm(in[0], {4}, in[1]); }, {x, w}));
  Tensor lw = randn({5, 4}, kFloat64, &g).requires_grad_(), lb = randn({5}, kFloat64, &g).requires_grad_();
  CHECK(gradgradcheck([](const TensorList& in) { return tanh(linear(in[0], in[1], in[2])); }, {x, lw, lb}));
  Tensor q = randn({2, 3, 4}, kFloat64, &g).requires_grad_(), k = randn({2, 5, 4}, kFloat64, &g).requires_grad_(),
         v = randn({2, 5, 3}, kFloat64, &g).requires_grad_();
  Tensor mask = gt(rand({3, 5}, kFloat64, &g), 0.3);
  CHECK(gradgradcheck([&](const TensorList& in) { return scaled_dot_product_attention(in[0], in[1], in[2], mask); },
                      {q, k, v}));
  Tensor qs = randn({2, 4, 4}, kFloat64, &g).requires_grad_(), ks = randn({2, 4, 4}, kFloat64, &g).requires_grad_(),
         vs = randn({2, 4, 3}, kFloat64, &g).requires_grad_();
  CHECK(gradgradcheck(
      [](const TensorList& in) { return scaled_dot_product_attention(in[0], in[1], in[2], Tensor(), true); },
      {qs, ks, vs}));
  Tensor logits = randn({4, 6}, kFloat64, &g).requires_grad_();
  Tensor target = tensor({1, 0, 5, 2});
  CHECK(gradgradcheck([&](const TensorList& in) { return cross_entropy(in[0], target, 0.2, 0); }, {logits}));
  CHECK(gradgradcheck([&](const TensorList& in) { return cross_entropy(in[0], target); }, {logits}));
}

TEST_CASE("autograd::functional: vjp, jvp, jacobian, hessian, hvp and vhp against closed forms") {
  using namespace autograd::functional;
  // f(x, y) = sum(x^2 y) + sum(sin-free smooth terms): f = sum(x * x * y) + sum(exp(x))
  auto f = [](const TensorList& in) { return add(sum(mul(mul(in[0], in[0]), in[1])), sum(exp(in[0]))); };
  Tensor x = f64({0.5, -1.0}), y = f64({2.0, 3.0});
  // grad: df/dx = 2 x y + e^x, df/dy = x^2
  auto [out, g] = vjp(f, {x, y});
  check_values(out.reshape({1}), {0.5 * 0.5 * 2 + 1.0 * 3 + std::exp(0.5) + std::exp(-1.0)}, 1e-12);
  check_values(g[0], {2 * 0.5 * 2 + std::exp(0.5), 2 * -1.0 * 3 + std::exp(-1.0)}, 1e-12);
  check_values(g[1], {0.25, 1.0}, 1e-12);
  CHECK_FALSE(x.requires_grad());  // the caller's tensors are untouched
  // Hessian blocks: d2f/dx2 = diag(2 y + e^x), d2f/dxdy = diag(2 x), d2f/dy2 = 0
  std::vector<TensorList> H = hessian(f, {x, y});
  check_values(H[0][0], {2 * 2 + std::exp(0.5), 0, 0, 2 * 3 + std::exp(-1.0)}, 1e-12);
  check_values(H[0][1], {1.0, 0, 0, -2.0}, 1e-12);
  check_values(H[1][0], {1.0, 0, 0, -2.0}, 1e-12);
  check_values(H[1][1], {0, 0, 0, 0}, 1e-12);
  Tensor vx = f64({1.0, 2.0}), vy = f64({-1.0, 0.5});
  auto [o2, hv] = hvp(f, {x, y}, {vx, vy});
  // H v = [Hxx vx + Hxy vy, Hyx vx]
  check_values(hv[0], {(4 + std::exp(0.5)) * 1.0 + 1.0 * -1.0, (6 + std::exp(-1.0)) * 2.0 + -2.0 * 0.5}, 1e-12);
  check_values(hv[1], {1.0 * 1.0, -2.0 * 2.0}, 1e-12);
  auto [o3, vh] = vhp(f, {x, y}, {vx, vy});
  CHECK(max_diff(vh[0], hv[0]) < 1e-12);
  // Vector-valued: h(x) = x * x[0] (elementwise), J = diag(x0) + e0 column x
  auto h = [](const TensorList& in) { return mul(in[0], select(in[0], 0, 0)); };
  Tensor z = f64({2.0, 3.0, -1.0});
  TensorList J = jacobian(h, {z});
  check_values(J[0], {4.0, 0, 0, 3.0, 2.0, 0, -1.0, 0, 2.0}, 1e-12);
  auto [o4, jv] = jvp(h, {z}, {f64({1.0, 0.0, 1.0})});
  check_values(jv, {4.0, 3.0, 1.0}, 1e-12);  // J [1, 0, 1]
  // create_graph: the results stay differentiable (the gradient of a hessian-vector product).
  Tensor xg = f64({0.5, -1.0}).requires_grad_();
  auto [o5, hv2] = hvp(f, {xg, y}, {vx, vy}, true);
  CHECK(hv2[0].requires_grad());
  Tensor d = autograd::grad({sum(hv2[0])}, {xg})[0];  // d/dx of (2y + e^x) vx + 2 x vy summed: e^x vx + 2 vy
  check_values(d, {std::exp(0.5) * 1.0 + 2 * -1.0, std::exp(-1.0) * 2.0 + 2 * 0.5}, 1e-12);
}

TEST_CASE("create_graph through checkpoint and dropout: the same second derivatives as without") {
  Generator g(9);
  Tensor x = randn({3, 4}, kFloat64, &g).requires_grad_();
  Tensor w = randn({4, 4}, kFloat64, &g).requires_grad_();
  auto body = [](const TensorList& in) { return tanh(matmul(in[0], in[1])); };
  Tensor plain = autograd::grad({sum(body({x, w}))}, {x}, {}, std::nullopt, true)[0];
  Tensor ck = autograd::grad({sum(checkpoint(body, {x, w}))}, {x}, {}, std::nullopt, true)[0];
  CHECK(max_diff(plain, ck) < 1e-12);
  Tensor d1 = autograd::grad({sum(plain * plain)}, {w})[0], d2 = autograd::grad({sum(ck * ck)}, {w})[0];
  CHECK(max_diff(d1, d2) < 1e-12);
  CHECK(gradgradcheck([](const TensorList& in) {
          Generator gen(3);
          return dropout(in[0] * in[0], 0.4, true, &gen);
        }, {x}));
}

TEST_CASE("gradgradcheck fails on a backward whose gradient does not record its dependence on x") {
  // d(x^2) = 2 x g, computed from a detached x: right first derivative, second derivative lost.
  auto square = [](const TensorList& in) {
    const Tensor x = in[0];
    Tensor out = mul(x.detach(), x.detach());
    return record("BrokenSquareBackward", out, {x}, [x](const Tensor& g) { return TensorList{mul(g, x.detach() * 2.0)}; });
  };
  Tensor x = f64({0.5, -1.5}).requires_grad_();
  CHECK(gradcheck(square, {x}));
  CHECK(contains(error_of([&] { gradgradcheck(square, {x}); }), "gradcheck: input 0"));
}
