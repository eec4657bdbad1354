// The engine: gradient values, accumulation, broadcasting and views, NoGradGuard, detach,
// retain_graph, the version counter, and misuse errors.
#include "tests/helpers.h"

using namespace tapestry;
using namespace tapestry::testing;

TEST_CASE("backward computes and accumulates gradients into leaves") {
  Tensor x = tensor({1.0, 2.0, 3.0}, {}, kFloat64).requires_grad_();
  Tensor y = sum(x * x);
  CHECK(y.grad_fn_name() == "SumBackward");
  CHECK_FALSE(y.is_leaf());
  CHECK(x.is_leaf());
  y.backward();
  check_values(x.grad(), {2, 4, 6});
  sum(x * 3.0).backward();  // accumulates
  check_values(x.grad(), {5, 7, 9});
  x.zero_grad();
  CHECK_FALSE(x.grad().defined());
}

TEST_CASE("post-accumulate-grad hooks: once per backward, with the finished gradient - removable") {
  Tensor x = tensor({1.0, 2.0}, {}, kFloat64).requires_grad_();
  Tensor w = tensor({3.0}, {}, kFloat64).requires_grad_();
  std::vector<std::vector<double>> seen;
  std::vector<std::string> order;
  HookHandle hx = x.register_post_accumulate_grad_hook([&](const Tensor& leaf) {
    CHECK_FALSE(GradMode::is_enabled());
    seen.push_back(leaf.grad().to_vector<double>());
    order.push_back("x");
  });
  w.register_post_accumulate_grad_hook([&](const Tensor&) { order.push_back("w"); });
  // x is used three times: its hook runs once, after all three contributions are summed.
  Tensor y = sum(x * x) + sum(x * 3.0) * w + sum(x);
  y.backward();
  REQUIRE(seen.size() == 1);
  CHECK(seen[0] == std::vector<double>{2 + 9 + 1, 4 + 9 + 1});
  CHECK(order.size() == 2);
  sum(x * 2.0).backward();  // accumulates: the hook sees the sum over both backwards
  REQUIRE(seen.size() == 2);
  CHECK(seen[1] == std::vector<double>{14, 16});
  CHECK(order.size() == 3);  // w took no gradient this time: its hook did not run
  hx.remove();
  hx.remove();  // a second remove does nothing
  sum(x).backward();
  CHECK(seen.size() == 2);
  // Only leaves that require grad take one.
  Tensor plain = tensor({1.0}, {}, kFloat64);
  CHECK(error_of([&] { plain.register_post_accumulate_grad_hook([](const Tensor&) {}); })
            .find("is not a leaf that requires grad") != std::string::npos);
  Tensor inner = x * 2.0;
  CHECK_THROWS_AS(inner.register_post_accumulate_grad_hook([](const Tensor&) {}), Error);
  // A handle outliving its tensor removes nothing, and does not crash.
  HookHandle orphan;
  {
    Tensor t = tensor({1.0}, {}, kFloat64).requires_grad_();
    orphan = t.register_post_accumulate_grad_hook([](const Tensor&) {});
  }
  orphan.remove();
}

TEST_CASE("a shared subexpression sums its gradients (diamond graph)") {
  Tensor x = tensor({2.0}, {}, kFloat64).requires_grad_();
  Tensor a = x * x;            // 4
  Tensor b = a * 3.0 + a * a;  // 3a + a^2; d/dx = (3 + 2a) * 2x = 11 * 4
  b.backward(ones({1}, kFloat64));
  check_values(x.grad(), {44});
}

TEST_CASE("broadcast inputs get gradients of their own shape") {
  Tensor a = ones({2, 3}, kFloat64).requires_grad_();
  Tensor row = tensor({1.0, 2.0, 3.0}, {}, kFloat64).requires_grad_();
  Tensor col = tensor({1.0, 2.0}, {2, 1}, kFloat64).requires_grad_();
  Tensor s = scalar_tensor(2.0, kFloat64).requires_grad_();
  sum(a * row * col * s).backward();
  CHECK(row.grad().sizes() == Shape{3});
  check_values(row.grad(), {6, 6, 6});  // sum over rows of col * s = (1 + 2) * 2
  CHECK(col.grad().sizes() == Shape{2, 1});
  check_values(col.grad(), {12, 12});  // (1 + 2 + 3) * 2
  CHECK(s.grad().dim() == 0);
  check_values(s.grad(), {18});  // sum(row * col) = 6 * 3
}

TEST_CASE("gradients through views land in the right elements") {
  Tensor x = arange(0.0, 6.0, 1.0, kFloat64).reshape({2, 3}).detach().requires_grad_();
  Tensor w = tensor({1.0, 10.0, 100.0, 1000.0, 10000.0, 100000.0}, {3, 2}, kFloat64);
  sum(x.t() * w).backward();  // x.t()[i][j] = x[j][i]
  check_values(x.grad(), {1, 100, 10000, 10, 1000, 100000});
  x.zero_grad();
  sum(x.slice(1, 1, 3) * 2.0).backward();
  check_values(x.grad(), {0, 2, 2, 0, 2, 2});
  x.zero_grad();
  sum(x.select(0, 1)).backward();
  check_values(x.grad(), {0, 0, 0, 1, 1, 1});
  x.zero_grad();
  sum(x.permute({1, 0}).reshape({6}) * arange(0.0, 6.0, 1.0, kFloat64)).backward();
  check_values(x.grad(), {0, 2, 4, 1, 3, 5});
  x.zero_grad();
  sum(x.unsqueeze(0).expand({4, 2, 3})).backward();
  check_values(x.grad(), {4, 4, 4, 4, 4, 4});
}

TEST_CASE("NoGradGuard and detach stop recording") {
  Tensor x = ones({2}, kFloat64).requires_grad_();
  {
    NoGradGuard guard;
    CHECK_FALSE(GradMode::is_enabled());
    Tensor y = x * 2.0;
    CHECK_FALSE(y.requires_grad());
    CHECK(y.grad_fn() == nullptr);
  }
  CHECK(GradMode::is_enabled());
  Tensor d = (x * 2.0).detach();
  CHECK_FALSE(d.requires_grad());
  CHECK(d.is_leaf());
  Tensor z = sum(x * d);  // d is a constant
  z.backward();
  check_values(x.grad(), {2, 2});
}

TEST_CASE("retain_graph allows a second backward - without it the error is clear") {
  Tensor x = tensor({3.0}, {}, kFloat64).requires_grad_();
  Tensor y = sum(exp(x));
  y.backward(Tensor(), true);
  y.backward();
  check_values(x.grad(), {2 * std::exp(3.0)});
  std::string msg = error_of([&] { y.backward(); });
  CHECK(msg.find("backward through the graph a second time") != std::string::npos);
  CHECK(msg.find("retain_graph") != std::string::npos);
}

TEST_CASE("modifying a saved tensor in place is caught at backward time") {
  Tensor a = tensor({1.0, 2.0}, {}, kFloat64).requires_grad_();
  Tensor w = tensor({3.0, 4.0}, {}, kFloat64);
  Tensor y = sum(a * w);  // saves w
  w.add_(1.0);
  std::string msg = error_of([&] { y.backward(); });
  CHECK(msg.find("saved by MulBackward was modified by an in-place operation") != std::string::npos);
  CHECK(msg.find("version is 1, expected 0") != std::string::npos);

  // The same through a view of the saved tensor: views share the version counter.
  Tensor b = tensor({1.0, 2.0}, {}, kFloat64).requires_grad_();
  Tensor e = exp(b);  // saves its output
  Tensor loss = sum(e);
  {
    NoGradGuard g;
    e.select(0, 0).fill_(0.0);
  }
  CHECK(error_of([&] { loss.backward(); }).find("ExpBackward") != std::string::npos);
}

TEST_CASE("misuse gives clear errors") {
  Tensor x = ones({2, 2}, kFloat64).requires_grad_();
  CHECK(error_of([&] { (x * 2.0).backward(); }).find("implied only for a scalar output, but the output has shape [2, 2]") !=
        std::string::npos);
  CHECK(error_of([&] { ones({1}).backward(); }).find("does not require grad") != std::string::npos);
  CHECK(error_of([&] { x.add_(1.0); }).find("add_: in-place operation on a leaf tensor of shape [2, 2] that requires grad") !=
        std::string::npos);
  CHECK(error_of([&] { arange(3).requires_grad_(); }).find("only floating-point tensors can require grad") !=
        std::string::npos);
  Tensor y = x * 2.0;
  CHECK(error_of([&] { y.backward(ones({3}, kFloat64)); }).find("must match the output") != std::string::npos);
  {
    NoGradGuard g;
    x.add_(1.0);  // optimizer-style update: allowed
  }
  check_values(x, {2, 2, 2, 2});
}

TEST_CASE("backward with an explicit gradient, and on a leaf") {
  Tensor x = tensor({1.0, 2.0}, {}, kFloat64).requires_grad_();
  (x * x).backward(tensor({1.0, 0.5}, {}, kFloat64));
  check_values(x.grad(), {2, 2});
  Tensor leaf = tensor({5.0}, {}, kFloat64).requires_grad_();
  leaf.backward();
  check_values(leaf.grad(), {1});
}

TEST_CASE("a deep graph does not overflow the stack") {
  Tensor x = tensor({1.0}, {}, kFloat64).requires_grad_();
  Tensor y = x;
  for (int i = 0; i < 20000; ++i) y = y * 1.0001;
  y.backward();
  CHECK(x.grad().item<double>() == doctest::Approx(std::pow(1.0001, 20000)));
}

TEST_CASE("a branch that needs no grad is skipped - multiple outputs of split both flow") {
  Tensor x = tensor({1.0, 2.0, 3.0, 4.0}, {}, kFloat64).requires_grad_();
  auto parts = split(x, 2);
  Tensor y = sum(parts[0] * 2.0) + sum(parts[1] * 3.0);
  y.backward();
  check_values(x.grad(), {2, 2, 3, 3});
  Tensor c = tensor({1.0, 1.0}, {}, kFloat64);  // needs no grad
  Tensor z = sum(c * c) + sum(x);
  x.zero_grad();
  z.backward();
  check_values(x.grad(), {1, 1, 1, 1});
}

TEST_CASE("a tiny MLP learns XOR with hand-written SGD") {
  manual_seed(0);
  Tensor X = tensor({0.f, 0.f, 0.f, 1.f, 1.f, 0.f, 1.f, 1.f}, {4, 2});
  Tensor Y = tensor({0.f, 1.f, 1.f, 0.f}, {4, 1});
  Tensor w1 = (randn({2, 16}) * 0.5).detach().requires_grad_(), b1 = zeros({16}).requires_grad_();
  Tensor w2 = (randn({16, 1}) * 0.5).detach().requires_grad_(), b2 = zeros({1}).requires_grad_();
  TensorList params{w1, b1, w2, b2};
  float first = 0, last = 0;
  for (int step = 0; step < 500; ++step) {
    Tensor h = tanh(matmul(X, w1) + b1);
    Tensor pred = matmul(h, w2) + b2;
    Tensor loss = mean(pow(pred - Y, 2.0));
    loss.backward();
    NoGradGuard no_grad;
    for (Tensor& p : params) {
      p.sub_(p.grad() * 0.2);
      p.zero_grad();
    }
    if (step == 0) first = loss.item<float>();
    last = loss.item<float>();
  }
  CHECK(first > 0.1f);
  CHECK(last < 0.01f);
}

TEST_CASE("the engine refuses a backward that returns a gradient of the wrong shape") {
  Tensor x = tensor({1.0, 2.0, 3.0}, {}, kFloat64).requires_grad_();
  Tensor out;
  {
    NoGradGuard g;
    out = x * 2.0;
  }
  out = record("WrongShapeBackward", out, {x}, [](const Tensor& g) { return TensorList{ones({2, 5}, g.dtype())}; });
  CHECK(error_of([&] { sum(out).backward(); }).find("sum_to: gradient of shape [2, 5] cannot be summed to shape [3]") !=
        std::string::npos);
}

TEST_CASE("changing embedding ids in place after the lookup is caught") {
  Tensor w = randn({5, 2}, kFloat64).requires_grad_();
  Tensor ids = tensor({1, 3});
  Tensor loss = sum(embedding(w, ids));
  ids.fill_(0);
  CHECK(error_of([&] { loss.backward(); }).find("saved by EmbeddingBackward was modified") != std::string::npos);
}

TEST_CASE("dropping a long graph does not recurse once per node") {
  Tensor x = tensor({1.0}, {}, kFloat64).requires_grad_();
  Tensor y = x;
  for (int i = 0; i < 200000; ++i) y = y + 1.0;
  y = Tensor();  // frees 200000 nodes; a recursive destructor would overflow the stack
  CHECK(x.is_leaf());
}
