// PyTorch's habits (issue 44): where tapestry uses PyTorch's name, it means PyTorch's thing. Each
// case pins one default, overload or message that docs/coming-from-pytorch.md names. Others live
// beside their code: Embedding's padding_idx (test_regressions.cpp), TransformerEncoderLayer's
// batch_first (test_nn_blocks.cpp), DataLoader's defaults (test_vision.cpp).
#include <string>
#include <type_traits>
#include <vector>

#include "tapestry/autograd/gradcheck.h"
#include "tapestry/data/transforms.h"
#include "tapestry/optim/optimizer.h"
#include "tests/helpers.h"

using namespace tapestry;
using namespace tapestry::testing;


TEST_CASE("habits: arange infers int64 from integer bounds and float32 from floating ones, as torch.arange") {
  CHECK(arange(0, 10).dtype() == kInt64);
  check_values(arange(0, 10, 3), {0, 3, 6, 9});
  CHECK(arange(int64_t{2}, 5).dtype() == kInt64);
  CHECK(arange(0.0, 2.0, 0.5).dtype() == kFloat32);
  CHECK(arange(0, 2, 0.5).dtype() == kFloat32);  // a floating step makes it floating
  check_values(arange(0, 2, 0.5), {0, 0.5, 1, 1.5});
  CHECK(arange(0, 4, 1, kFloat64).dtype() == kFloat64);
}

TEST_CASE("habits: tensor() of floating values is float32, the default dtype, as torch.tensor") {
  CHECK(tensor({1.0, 2.0}).dtype() == kFloat32);
  CHECK(tensor(std::vector<double>{1.0, 2.0}, {2, 1}).dtype() == kFloat32);
  CHECK(tensor({1.0f, 2.0f}).dtype() == kFloat32);
  CHECK(tensor({1.0, 2.0}, {}, kFloat64).dtype() == kFloat64);
  CHECK(tensor({1, 2}).dtype() == kInt64);
}

TEST_CASE("habits: AdamW's default weight decay is PyTorch's 0.01 (Adam's stays 0), and AdamOptions does not reach AdamW") {
  static_assert(!std::is_convertible_v<optim::AdamOptions, optim::AdamWOptions>,
                "AdamW(params, AdamOptions{}) must not compile: it would carry Adam's weight decay of 0");
  static_assert(std::is_constructible_v<optim::AdamW, std::vector<Tensor>, optim::AdamWOptions>);
  CHECK(optim::AdamWOptions{}.weight_decay == 0.01);
  CHECK(optim::AdamOptions{}.weight_decay == 0.0);
  // torch.optim.AdamW([p], lr=0.1), p = 2, grad 3: p (1 - 0.1 * 0.01) - 0.1 * 3 / (3 + 1e-8) = 1.898
  Tensor p = tensor({2.0}, {}, kFloat64).requires_grad_();
  optim::AdamWOptions o;
  o.lr = 0.1;
  optim::AdamW opt({p}, o);
  (p * 3.0).sum().backward();
  opt.step();
  check_values(p, {1.898}, 1e-8);
  // Adam's options, kept on purpose: spelled out.
  optim::AdamOptions adam;
  adam.lr = 0.1;
  CHECK(optim::AdamWOptions(adam).weight_decay == 0.0);
}

TEST_CASE("habits: an optimizer over no parameters is refused, as PyTorch's 'empty parameter list'") {
  struct Empty : nn::Module {};
  Empty m;
  CHECK(contains(error_of([&] { optim::AdamW(m.parameters(), optim::AdamWOptions{}); }), "empty parameter list"));
  CHECK(contains(error_of([] { optim::SGD(std::vector<Tensor>{}, optim::SGDOptions{}); }), "empty parameter list"));
  // An empty group beside others is fine (a model with nothing to exempt from decay).
  Tensor w = zeros({2}).requires_grad_();
  optim::AdamW fine(std::vector<optim::ParamGroup>{{{w}}, {{}, std::nullopt, 0.0}}, optim::AdamWOptions{});
  CHECK(fine.params().size() == 1);
}

TEST_CASE("habits: grad() of a non-leaf says why and offers retain_grad(), which keeps it") {
  Tensor x = tensor({1.0, 2.0}, {}, kFloat64).requires_grad_();
  Tensor y = x * 3.0;
  (y * y).sum().backward();
  const std::string e = error_of([&] { y.grad(); });
  CHECK(contains(e, "not a leaf"));
  CHECK(contains(e, "MulBackward"));
  CHECK(contains(e, "retain_grad()"));
  check_values(x.grad(), {18.0, 36.0});  // d (3x)^2 / dx = 18 x

  Tensor y2 = x * 3.0;
  y2.retain_grad();
  CHECK(y2.retains_grad());
  CHECK_FALSE(y2.grad().defined());  // nothing yet, and no error: it was asked for
  Tensor loss = (y2 * y2).sum();
  loss.backward(Tensor(), /*retain_graph=*/true);
  check_values(y2.grad(), {6.0, 12.0});  // 2 y
  loss.backward();
  check_values(y2.grad(), {12.0, 24.0});  // summed over backwards, as a leaf's
  x.retain_grad();  // a leaf: nothing to do
  CHECK(contains(error_of([] { tensor({1.0}).retain_grad(); }), "does not require grad"));
}

TEST_CASE("habits: load_state_dict(other.state_dict()) compiles and loads, for modules and optimizers") {
  manual_seed(1);
  nn::Linear a(3, 2), b(3, 2);
  b.load_state_dict(a.state_dict());
  CHECK(max_diff(a.weight, b.weight) == 0);
  CHECK(max_diff(a.bias, b.bias) == 0);
  nn::NamedTensors twice = a.state_dict();
  twice.push_back(twice.front());
  CHECK(contains(error_of([&] { b.load_state_dict(twice); }), "names 'weight' twice"));

  optim::AdamW oa(a.parameters(), optim::AdamWOptions{}), ob(b.parameters(), optim::AdamWOptions{});
  a.forward(ones({1, 3})).sum().backward();
  oa.step();
  ob.load_state_dict(oa.state_dict());
  CHECK(ob.step_count() == 1);
}

TEST_CASE("habits: Module::to converts .grad too, as model.double()") {
  nn::Linear l(3, 2);
  l.forward(ones({1, 3})).sum().backward();
  l.to(kFloat64);
  REQUIRE(l.weight.grad().defined());
  CHECK(l.weight.grad().dtype() == kFloat64);
  check_values(l.weight.grad(), std::vector<double>(6, 1.0));
  l.forward(ones({1, 3}, kFloat64)).sum().backward();  // accumulates into the converted gradient
  check_values(l.weight.grad(), std::vector<double>(6, 2.0));
  l.to(Device::Emulated);
  CHECK(l.weight.grad().device() == Device::Emulated);
  check_values(l.bias.grad().cpu(), {2.0, 2.0});
}

TEST_CASE("habits: data::Normalize is torchvision's Normalize, as a function and as a DataLoader transform") {
  Tensor img = arange(0.0, 24.0, 1.0, kFloat64).reshape({2, 3, 2, 2});
  Tensor got = data::normalize(img, {1.0, 2.0, 3.0}, {2.0, 4.0, 8.0});
  Tensor want = div(sub(img, tensor({1.0, 2.0, 3.0}, {3, 1, 1}, kFloat64)), tensor({2.0, 4.0, 8.0}, {3, 1, 1}, kFloat64));
  CHECK(max_diff(got, want) == 0);
  CHECK(max_diff(data::normalize(img.select(0, 1), {1.0, 2.0, 3.0}, {2.0, 4.0, 8.0}), want.select(0, 1)) == 0);  // [C, H, W]
  CHECK(max_diff(data::normalize(img, {0.5}, {0.25}), (img - 0.5) / 0.25) == 0);  // one value, every channel
  CHECK(contains(error_of([&] { data::normalize(img, {1.0, 2.0}, {1.0}); }), "mean has 2 values for images of 3 channels"));
  CHECK(contains(error_of([&] { data::normalize(img, {0.0}, {0.0}); }), "every std must be above 0"));
  CHECK(contains(error_of([&] { data::normalize(img.to(kInt64), {0.0}, {1.0}); }), "floating-point"));
  Tensor x = randn({1, 2, 2, 2}, kFloat64).requires_grad_();
  CHECK(gradcheck([](const TensorList& in) { return data::normalize(in[0], {0.1, -0.2}, {0.5, 2.0}); }, {x}));

  data::TensorDataset ds(arange(0.0, 16.0, 1.0, kFloat32).reshape({4, 1, 2, 2}), arange(4));
  data::DataLoaderOptions o;
  o.batch_size = 2;
  data::DataLoader loader(ds, o, data::Normalize{{2.0}, {4.0}});
  CHECK(max_diff(loader.batch(1, 1).data, (ds.data().narrow(0, 2, 2) - 2.0) / 4.0) == 0);
}

TEST_CASE("habits: the method forms of log1p, expm1, softplus, clamp_min and logsumexp") {
  Tensor x = tensor({-0.5, 0.0, 2.0, 30.0}, {2, 2}, kFloat64);
  CHECK(max_diff(x.log1p(), log1p(x)) == 0);
  CHECK(max_diff(x.expm1(), expm1(x)) == 0);
  CHECK(max_diff(x.softplus(2.0, 10.0), softplus(x, 2.0, 10.0)) == 0);
  CHECK(max_diff(x.clamp_min(0.5), clamp_min(x, 0.5)) == 0);
  CHECK(max_diff(x.logsumexp(1, true), logsumexp(x, 1, true)) == 0);
}
