// The Tensor itself: factories, dtypes, views without copies, contiguity, printing, randomness.
#include "tests/helpers.h"

using namespace tapestry;
using namespace tapestry::testing;

TEST_CASE("factories give the right shape, dtype and values") {
  Tensor z = zeros({2, 3});
  CHECK(z.sizes() == Shape{2, 3});
  CHECK(z.dtype() == kFloat32);
  CHECK(z.strides() == Shape{3, 1});
  CHECK(z.is_contiguous());
  check_values(z, {0, 0, 0, 0, 0, 0});
  check_values(ones({2}, kFloat64), {1, 1});
  CHECK(ones({2}, kFloat64).dtype() == kFloat64);
  check_values(full({3}, 2.5), {2.5, 2.5, 2.5});
  check_values(arange(5), {0, 1, 2, 3, 4});
  CHECK(arange(5).dtype() == kInt64);
  check_values(arange(1.0, 2.0, 0.25, kFloat32), {1, 1.25, 1.5, 1.75});
  Tensor t = tensor({1.f, 2.f, 3.f, 4.f, 5.f, 6.f}, {2, 3});
  CHECK(t.sizes() == Shape{2, 3});
  check_values(t, {1, 2, 3, 4, 5, 6});
  CHECK(tensor({7}).item<int64_t>() == 7);
  CHECK(scalar_tensor(3.0).dim() == 0);
  CHECK(scalar_tensor(3.0).numel() == 1);
  CHECK(scalar_tensor(3.0).item<double>() == 3.0);
  Tensor e = zeros({0, 3});
  CHECK(e.numel() == 0);
  CHECK(zeros_like(t).sizes() == t.sizes());
  check_values(full_like(t, 7.0), {7, 7, 7, 7, 7, 7});
}

TEST_CASE("dtype conversion copies and converts values") {
  Tensor f = tensor({1.5f, -2.5f, 3.0f});
  Tensor i = f.to(kInt64);
  CHECK(i.dtype() == kInt64);
  CHECK(i.to_vector<int64_t>() == std::vector<int64_t>{1, -2, 3});
  Tensor d = f.to(kFloat64);
  CHECK(d.dtype() == kFloat64);
  CHECK(d.storage() != f.storage());
  check_values(d, {1.5, -2.5, 3.0});
  CHECK(f.to(kFloat32).storage() == f.storage());  // same dtype: no copy
  Tensor b = gt(f, 0.0);
  CHECK(b.dtype() == kBool);
  check_values(b.to(kFloat32), {1, 0, 1});
}

TEST_CASE("views share storage and do not copy") {
  Tensor a = arange(0.0, 24.0, 1.0, kFloat32).reshape({2, 3, 4});
  const Storage* s = a.storage();
  CHECK(a.view({6, 4}).storage() == s);
  CHECK(a.reshape({4, 6}).storage() == s);
  CHECK(a.view({-1}).sizes() == Shape{24});
  CHECK(a.view({2, -1}).sizes() == Shape{2, 12});

  Tensor t = a.transpose(0, 2);  // (4, 3, 2)
  CHECK(t.storage() == s);
  CHECK(t.sizes() == Shape{4, 3, 2});
  CHECK(t.strides() == Shape{1, 4, 12});
  CHECK_FALSE(t.is_contiguous());
  CHECK(t.contiguous().is_contiguous());
  CHECK(t.contiguous().storage() != s);
  check_values(t.select(0, 1).select(0, 2), {9, 21});

  Tensor p = a.permute({2, 0, 1});
  CHECK(p.storage() == s);
  CHECK(p.sizes() == Shape{4, 2, 3});
  check_values(p.select(0, 3).select(0, 1), {15, 19, 23});

  Tensor sl = a.slice(2, 1, 4, 2);  // columns 1 and 3
  CHECK(sl.storage() == s);
  CHECK(sl.sizes() == Shape{2, 3, 2});
  CHECK(sl.offset() == 1);
  check_values(sl.select(0, 0).select(0, 0), {1, 3});
  check_values(a.slice(1, -1, 3).select(0, 1), {20, 21, 22, 23});  // negative start
  check_values(a.narrow(2, 2, 2).select(0, 0).select(0, 2), {10, 11});

  Tensor row = tensor({1.f, 2.f, 3.f});
  Tensor ex = row.expand({4, 3});
  CHECK(ex.storage() == row.storage());
  CHECK(ex.strides() == Shape{0, 1});
  check_values(ex.select(0, 3), {1, 2, 3});
  Tensor col = tensor({1.f, 2.f}, {2, 1}).expand({2, 5});
  check_values(col.select(1, 4), {1, 2});

  Tensor u = row.unsqueeze(0);
  CHECK(u.sizes() == Shape{1, 3});
  CHECK(u.storage() == row.storage());
  CHECK(row.unsqueeze(-1).sizes() == Shape{3, 1});
  CHECK(u.squeeze().sizes() == Shape{3});
  CHECK(u.squeeze(0).sizes() == Shape{3});
  CHECK(u.squeeze(1).sizes() == Shape{1, 3});  // not size 1: unchanged
  CHECK(a.flatten(1).sizes() == Shape{2, 12});
  CHECK(a.flatten().sizes() == Shape{24});
}

TEST_CASE("reshape copies only when strides make a view impossible") {
  Tensor a = arange(0.0, 6.0, 1.0, kFloat32).reshape({2, 3});
  Tensor t = a.t();  // (3, 2), strides (1, 3)
  Tensor r = t.reshape({6});
  CHECK(r.storage() != a.storage());  // no view exists: copied
  check_values(r, {0, 3, 1, 4, 2, 5});
  CHECK(t.reshape({3, 2, 1}).storage() == a.storage());  // adding a size-1 dim is a view
  CHECK(a.slice(1, 0, 2).reshape({2, 2, 1}).storage() == a.storage());
  std::string msg = error_of([&] { t.view({6}); });
  CHECK(msg.find("view: shape [6] cannot view an input of shape [3, 2] with strides [1, 3]") != std::string::npos);
}

TEST_CASE("a view writes through to its base") {
  Tensor a = zeros({3, 3});
  a.select(1, 1).fill_(5.0);
  check_values(a, {0, 5, 0, 0, 5, 0, 0, 5, 0});
  a.t().select(0, 2).copy_(tensor({1.f, 2.f, 3.f}));
  check_values(a, {0, 5, 1, 0, 5, 2, 0, 5, 3});
  CHECK(a.version() == 2);
}

TEST_CASE("printing shows values, shape and dtype like PyTorch's repr") {
  CHECK(to_string(tensor({1.f, 2.f, 3.5f})) == "tensor([1.0000, 2.0000, 3.5000], shape=[3], dtype=float32)");
  CHECK(to_string(arange(4).reshape({2, 2})) == "tensor([[0, 1],\n        [2, 3]], shape=[2, 2], dtype=int64)");
  CHECK(to_string(scalar_tensor(2.0, kFloat64)) == "tensor(2.0000, shape=[], dtype=float64)");
  CHECK(to_string(gt(tensor({1.f, -1.f}), 0.0)) == "tensor([ True, False], shape=[2], dtype=bool)");
  Tensor x = ones({2}).requires_grad_();
  CHECK(to_string(x).find("requires_grad=True") != std::string::npos);
  CHECK(to_string(mul(x, 2.0)).find("grad_fn=<MulBackward>") != std::string::npos);
  std::string big = fmt::format("{}", zeros({2000}));
  CHECK(big.find("...") != std::string::npos);
  CHECK(big.size() < 200);
}

TEST_CASE("random draws are reproducible from a seed") {
  manual_seed(42);
  Tensor a = randn({100});
  manual_seed(42);
  Tensor b = randn({100});
  CHECK(values(a) == values(b));
  Tensor c = randn({100});
  CHECK(values(a) != values(c));
  std::vector<double> v = values(a);
  double mean = 0;
  for (double x : v) mean += x / 100;
  CHECK(std::fabs(mean) < 0.4);
  Generator g(7);
  std::vector<double> u = values(rand({1000}, kFloat64, &g));
  for (double x : u) CHECK((x >= 0 && x < 1));
  std::vector<int64_t> r = randint(3, 6, {500}, kInt64, &g).to_vector<int64_t>();
  for (int64_t x : r) CHECK((x >= 3 && x < 6));
  // A generator's state round-trips, so training can resume its randomness.
  Generator g2(1);
  std::string state = g2.state();
  Tensor first = rand({5}, kFloat32, &g2);
  g2.set_state(state);
  CHECK(values(rand({5}, kFloat32, &g2)) == values(first));
}

TEST_CASE("results do not depend on the thread count") {
  manual_seed(3);
  Tensor x = randn({300, 700});
  Tensor y = randn({700});
  auto run = [&] {
    return std::vector<std::vector<double>>{values(sum(x)), values(sum(x, {0})), values(exp(x) * y),
                                            values(softmax(x, 1)), values(layer_norm(x, {700}))};
  };
  int before = get_num_threads();
  set_num_threads(1);
  auto one = run();
  set_num_threads(2);
  auto two = run();
  set_num_threads(before);
  CHECK(one == two);
}
