// optim/: update rules against hand-computed values and PyTorch's, parameter groups, state
// save/load, clipping, schedules.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <optional>

#include "tapestry/optim/optimizer.h"
#include "tests/helpers.h"

using namespace tapestry;
using namespace tapestry::testing;

namespace {
Tensor param(std::vector<double> v) { return tensor(v, {}, kFloat64).requires_grad_(); }
void set_grad(Tensor& p, std::vector<double> g) {
  p.zero_grad();
  sum(p * tensor(g, {}, kFloat64)).backward();
}
optim::ParamGroup make_group(std::vector<Tensor> params, std::optional<double> lr = std::nullopt,
                             std::optional<double> weight_decay = std::nullopt) {
  optim::ParamGroup g;
  g.params = std::move(params);
  g.lr = lr;
  g.weight_decay = weight_decay;
  return g;
}
std::map<std::string, Tensor> as_map(const nn::NamedTensors& named) {
  std::map<std::string, Tensor> out;
  for (auto& [name, t] : named) out[name] = t;
  return out;
}
}  // namespace

TEST_CASE("SGD: plain, weight decay, momentum, nesterov") {
  Tensor p = param({1.0, -2.0});
  optim::SGD sgd({p}, {0.1, 0.0, 0.0, false});
  set_grad(p, {0.5, 1.0});
  sgd.step();
  check_values(p, {0.95, -2.1});

  Tensor q = param({1.0});
  optim::SGD mom({q}, {0.1, 0.9, 0.1, false});
  set_grad(q, {1.0});
  mom.step();  // d = 1 + 0.1*1 = 1.1; buf = 1.1; q = 1 - 0.11
  check_values(q, {0.89});
  set_grad(q, {1.0});
  mom.step();  // d = 1 + 0.089 = 1.089; buf = 0.99 + 1.089 = 2.079; q = 0.89 - 0.2079
  check_values(q, {0.89 - 0.2079});

  Tensor r = param({0.0});
  optim::SGD nes({r}, {0.1, 0.5, 0.0, true});
  set_grad(r, {2.0});
  nes.step();  // buf = 2; step = 2 + 0.5*2 = 3
  check_values(r, {-0.3});
}

TEST_CASE("Adam and AdamW: the first two steps by hand") {
  Tensor p = param({1.0});
  optim::AdamOptions o;
  o.lr = 0.1, o.beta1 = 0.9, o.beta2 = 0.99, o.eps = 1e-8;
  optim::Adam adam({p}, o);
  set_grad(p, {2.0});
  adam.step();  // m = 0.2, v = 0.04; m_hat = 2, v_hat = 4 -> step 0.1 * 2 / 2
  check_values(p, {0.9}, 1e-7);
  set_grad(p, {1.0});
  adam.step();
  double m = 0.9 * 0.2 + 0.1, v = 0.99 * 0.04 + 0.01;
  double m_hat = m / (1 - 0.81), v_hat = v / (1 - 0.9801);
  check_values(p, {0.9 - 0.1 * m_hat / (std::sqrt(v_hat) + 1e-8)}, 1e-7);
  CHECK(adam.step_count() == 2);

  Tensor w = param({2.0});
  o.weight_decay = 0.5;
  optim::AdamW adamw({w}, optim::AdamWOptions(o));
  set_grad(w, {3.0});
  adamw.step();  // decay 2 * (1 - 0.05) = 1.9, then - 0.1 * sign
  check_values(w, {1.8}, 1e-7);
  Tensor l2 = param({2.0});
  optim::Adam adam_l2({l2}, o);
  set_grad(l2, {-3.0});  // g + wd p = -2: still a full step of +0.1
  adam_l2.step();
  check_values(l2, {2.1}, 1e-7);
}

TEST_CASE("optimizer state round-trips, so training resumes exactly") {
  auto run = [](int steps_before, bool reload) {
    Tensor p = param({1.0, 2.0, 3.0});
    optim::AdamOptions o;
    o.lr = 0.05;
    auto adam = std::make_unique<optim::Adam>(std::vector<Tensor>{p}, o);
    for (int s = 0; s < 5; ++s) {
      if (s == steps_before && reload) {  // through a file, as a resumed run would
        std::string path = fmt::format("/tmp/tapestry_test_{}_adam.safetensors", ::getpid());
        adam->save(path);
        Tensor saved_p = p.clone().detach();
        p = saved_p.requires_grad_();
        adam = std::make_unique<optim::Adam>(std::vector<Tensor>{p}, o);
        adam->load(path);
        std::remove(path.c_str());
      }
      set_grad(p, {std::sin(s + 1.0), std::cos(s + 1.0), 0.5});
      adam->step();
    }
    return values(p);
  };
  CHECK(run(3, true) == run(3, false));
  Tensor p = param({1.0});
  optim::Adam a({p}, {});
  std::map<std::string, Tensor> bad = {{"step", scalar_tensor(1, kInt64)}, {"lr", scalar_tensor(0.1, kFloat64)},
                                       {"exp_avg.0", zeros({2}, kFloat64)}};
  CHECK(error_of([&] { a.load_state_dict(bad); }).find("'exp_avg.0' is float64 [2] but parameter 0 is float64 [1]") !=
        std::string::npos);
}

TEST_CASE("clip_grad_norm scales all gradients together") {
  Tensor a = param({3.0}), b = param({4.0});
  sum(a * 1.0 + b * 1.0).backward();
  {
    NoGradGuard g;
    a.grad().fill_(3.0);
    b.grad().fill_(4.0);
  }
  double norm = optim::clip_grad_norm({a, b}, 1.0);
  CHECK(norm == doctest::Approx(5.0));
  check_values(a.grad(), {0.6}, 1e-5);
  check_values(b.grad(), {0.8}, 1e-5);
  CHECK(optim::clip_grad_norm({a, b}, 10.0) == doctest::Approx(1.0).epsilon(1e-5));  // under the limit: unchanged
  check_values(a.grad(), {0.6}, 1e-5);
}

TEST_CASE("schedules: Noam and inverse square root") {
  optim::NoamSchedule noam(512, 4000);
  CHECK(noam.lr(1) == doctest::Approx(std::pow(512, -0.5) * std::pow(4000, -1.5)));
  CHECK(noam.lr(4000) == doctest::Approx(std::pow(512, -0.5) * std::pow(4000, -0.5)));
  CHECK(noam.lr(16000) == doctest::Approx(noam.lr(4000) / 2));
  CHECK(noam.lr(2000) < noam.lr(4000));
  optim::InverseSqrtSchedule inv(1e-3, 100);
  CHECK(inv.lr(50) == doctest::Approx(5e-4));
  CHECK(inv.lr(400) == doctest::Approx(5e-4));
  Tensor p = param({1.0});
  optim::SGD sgd({p}, {});
  noam.apply(sgd, 4000);
  CHECK(sgd.lr() == doctest::Approx(noam.lr(4000)));
  CHECK(error_of([] { optim::NoamSchedule(512, 0); }).find("warmup must be positive") != std::string::npos);
}

// The gradients of the three steps in the two PyTorch comparisons below (a: 3 elements, b and c: 2).
namespace {
const std::vector<std::vector<std::vector<double>>> kGroupGrads = {
    {{0.5, -1.0, 2.0}, {0.1, -0.3}, {1.0, 0.25}},
    {{-0.2, 0.4, 1.5}, {0.7, 0.0}, {-0.5, 2.0}},
    {{0.3, 0.3, -0.6}, {-0.9, 1.2}, {0.05, -1.0}},
};
}  // namespace

// Reference: PyTorch 1.13, float64, 3 steps with the gradients above:
//   torch.set_default_dtype(torch.float64)
//   a = torch.tensor([1.0, -2.0, 0.5], requires_grad=True)
//   b = torch.tensor([0.25, 3.0], requires_grad=True)
//   c = torch.tensor([-1.5, 2.0], requires_grad=True)
//   opt = torch.optim.AdamW([{"params": [a, b], "lr": 0.005}, {"params": [c], "weight_decay": 0.3}],
//                           lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.05)
//   for ga, gb, gc in grads:
//       a.grad, b.grad, c.grad = torch.tensor(ga), torch.tensor(gb), torch.tensor(gc)
//       opt.step()
//   print(a.tolist(), b.tolist(), c.tolist())
TEST_CASE("parameter groups: two-group AdamW matches PyTorch's AdamW with the same param_groups") {
  Tensor a = param({1.0, -2.0, 0.5}), b = param({0.25, 3.0}), c = param({-1.5, 2.0});
  optim::AdamWOptions o;
  o.lr = 0.01, o.beta1 = 0.9, o.beta2 = 0.95, o.eps = 1e-8, o.weight_decay = 0.05;
  optim::AdamW opt(std::vector<optim::ParamGroup>{make_group({a, b}, 0.005), make_group({c}, std::nullopt, 0.3)}, o);
  REQUIRE(opt.num_groups() == 2);
  REQUIRE(opt.params().size() == 3);  // flat, in group order
  CHECK(opt.params()[0].impl_ptr() == a.impl_ptr());
  CHECK(opt.params()[2].impl_ptr() == c.impl_ptr());
  CHECK(opt.group_params(0).size() == 2);
  CHECK(opt.group_params(1)[0].impl_ptr() == c.impl_ptr());
  CHECK(opt.lr() == doctest::Approx(0.01));  // the base lr
  CHECK(opt.group_lr(0) == doctest::Approx(0.005));
  CHECK(opt.group_lr_ratio(0) == doctest::Approx(0.5));
  CHECK(opt.group_lr(1) == doctest::Approx(0.01));  // unset: the options'
  CHECK(opt.group_weight_decay(0) == doctest::Approx(0.05));  // unset: the options'
  CHECK(opt.group_weight_decay(1) == doctest::Approx(0.3));
  CHECK(error_of([&] { opt.group_lr(2); }).find("no parameter group 2; there are 2") != std::string::npos);
  for (const auto& g : kGroupGrads) {
    set_grad(a, g[0]);
    set_grad(b, g[1]);
    set_grad(c, g[2]);
    opt.step();
  }
  check_values(a, {0.9897580722449081, -1.9913224128798672, 0.4867102235264334}, 1e-12);
  check_values(b, {0.24122806939657282, 3.0037226062548465}, 1e-12);
  check_values(c, {-1.5015467507423848, 1.9611866795375037}, 1e-12);
}

// Reference: PyTorch 1.13, float64, the same tensors and gradients as above:
//   opt = torch.optim.SGD([{"params": [a], "lr": 0.2, "weight_decay": 0.1}, {"params": [b, c]}],
//                         lr=0.1, momentum=0.9, weight_decay=0.01)
TEST_CASE("parameter groups: two-group SGD with momentum matches PyTorch's") {
  Tensor a = param({1.0, -2.0, 0.5}), b = param({0.25, 3.0}), c = param({-1.5, 2.0});
  optim::SGD opt(std::vector<optim::ParamGroup>{make_group({a}, 0.2, 0.1), make_group({b, c})},
                 optim::SGDOptions{0.1, 0.9, 0.01, false});
  CHECK(opt.group_lr(0) == doctest::Approx(0.2));
  CHECK(opt.group_lr(1) == doctest::Approx(0.1));
  CHECK(opt.group_weight_decay(0) == doctest::Approx(0.1));
  CHECK(opt.group_weight_decay(1) == doctest::Approx(0.01));
  for (const auto& g : kGroupGrads) {
    set_grad(a, g[0]);
    set_grad(b, g[1]);
    set_grad(c, g[2]);
    opt.step();
  }
  check_values(a, {0.641472, -1.462944, -1.052904}, 1e-12);
  check_values(b, {0.17860668975, 2.944370427}, 1e-12);
  check_values(c, {-1.6722622985, 1.6413345730000002}, 1e-12);
}

// Reference: torch.optim.lr_scheduler.LambdaLR over two groups (lr 6e-4 from the defaults, and
// 1.5e-4 of its own), lr_lambda = get_lr(step) / 6e-4 with get_lr nanoGPT's cosine (peak 6e-4,
// warmup 10, decay to 6e-5 at step 110); each group's lr at steps 1, 10, 35, 60, 110 and 120:
//   opt = torch.optim.AdamW([{"params": [p]}, {"params": [q], "lr": 1.5e-4}], lr=6e-4)
//   sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: get_lr(s) / 6e-4)
//   for s in range(121): record [g["lr"] for g in opt.param_groups] at s; opt.step(); sched.step()
TEST_CASE("parameter groups: a schedule scales every group, keeping its lr ratio (as LambdaLR)") {
  Tensor p = param({1.0}), q = param({2.0});
  optim::AdamWOptions o;
  o.lr = 6e-4;
  optim::AdamW opt(std::vector<optim::ParamGroup>{make_group({p}), make_group({q}, 1.5e-4)}, o);
  CHECK(opt.group_lr_ratio(0) == doctest::Approx(1.0));
  CHECK(opt.group_lr_ratio(1) == doctest::Approx(0.25));
  optim::CosineSchedule schedule(6e-4, 10, 110, 6e-5);
  const std::map<int64_t, std::pair<double, double>> torch_lrs = {
      {1, {5.9999999999999995e-05, 1.4999999999999999e-05}},
      {10, {0.0006, 0.00015}},
      {35, {0.0005209188309203678, 0.00013022970773009194}},
      {60, {0.00032999999999999994, 8.249999999999999e-05}},
      {110, {5.9999999999999995e-05, 1.4999999999999999e-05}},
      {120, {5.9999999999999995e-05, 1.4999999999999999e-05}},
  };
  for (const auto& entry : torch_lrs) {
    const int64_t step = entry.first;
    const std::pair<double, double> lrs = entry.second;
    INFO("step ", step);
    schedule.apply(opt, step);
    CHECK(opt.lr() == doctest::Approx(schedule.lr(step)).epsilon(1e-12));
    CHECK(opt.group_lr(0) == doctest::Approx(lrs.first).epsilon(1e-12));
    CHECK(opt.group_lr(1) == doctest::Approx(lrs.second).epsilon(1e-12));
    CHECK(opt.group_lr_ratio(1) == doctest::Approx(0.25));
  }

  // And step() uses each group's scheduled lr: plain SGD, gradient 1, moves each by its lr.
  Tensor x = param({0.0}), y = param({0.0});
  optim::SGD sgd(std::vector<optim::ParamGroup>{make_group({x}), make_group({y}, 0.05)}, optim::SGDOptions{0.1});
  optim::LinearSchedule linear(1.0, 4, 12);
  linear.apply(sgd, 8);  // halfway down: 0.5
  set_grad(x, {1.0});
  set_grad(y, {1.0});
  sgd.step();
  check_values(x, {-0.5}, 1e-12);
  check_values(y, {-0.25}, 1e-12);
}

TEST_CASE("parameter groups: state round-trips, so training resumes bit-identically") {
  optim::CosineSchedule schedule(0.05, 2, 8, 0.005);
  auto run = [&](bool reload) {
    Tensor a = param({1.0, 2.0, 3.0}), b = param({-1.0, 0.5});
    optim::AdamWOptions o;
    o.lr = 0.05, o.weight_decay = 0.1;
    auto make = [&](double lr0, double wd1) {
      return std::make_unique<optim::AdamW>(
          std::vector<optim::ParamGroup>{make_group({a}, lr0), make_group({b}, std::nullopt, wd1)}, o);
    };
    auto opt = make(0.02, 0.0);
    for (int s = 1; s <= 7; ++s) {
      if (s == 4 && reload) {  // through a file, as a resumed run would
        std::string path = fmt::format("/tmp/tapestry_test_{}_groups.safetensors", ::getpid());
        opt->save(path);
        Tensor saved_a = a.clone().detach(), saved_b = b.clone().detach();
        a = saved_a.requires_grad_();
        b = saved_b.requires_grad_();
        // Built with other hyperparameters: the state's lr ratios and weight decays win, as in PyTorch.
        opt = make(0.04, 0.2);
        opt->load(path);
        std::remove(path.c_str());
        CHECK(opt->group_lr_ratio(0) == doctest::Approx(0.4));
        CHECK(opt->group_weight_decay(1) == 0.0);
        CHECK(opt->step_count() == 3);
      }
      schedule.apply(*opt, s);
      set_grad(a, {std::sin(s + 1.0), std::cos(s + 1.0), 0.5});
      set_grad(b, {std::cos(2.0 * s), -0.25});
      opt->step();
    }
    std::vector<double> out = values(a), vb = values(b);
    out.insert(out.end(), vb.begin(), vb.end());
    return out;
  };
  CHECK(run(true) == run(false));

  Tensor p = param({1.0}), q = param({2.0});
  optim::AdamW w(std::vector<optim::ParamGroup>{make_group({p}, 0.5), make_group({q})}, optim::AdamWOptions{});
  auto state = as_map(w.state_dict());
  CHECK(state.count("group.0.lr_ratio") == 1);
  CHECK(state.at("group.0.lr_ratio").dtype() == kFloat64);
  CHECK(state.at("group.0.lr_ratio").dim() == 0);
  CHECK(state.at("group.1.weight_decay").dim() == 0);
  CHECK(state.at("group.1.num_params").item<int64_t>() == 1);
}

TEST_CASE("parameter groups: load_state_dict names every misfit") {
  Tensor a = param({1.0, 2.0, 3.0}), b = param({4.0, 5.0}), c = param({6.0, 7.0});
  optim::Adam two(std::vector<optim::ParamGroup>{make_group({a, b}, 1e-4), make_group({c})}, optim::AdamOptions{});
  for (Tensor* t : {&a, &b, &c}) set_grad(*t, std::vector<double>(static_cast<size_t>(t->numel()), 1.0));
  two.step();
  auto state = as_map(two.state_dict());

  // The same tensors in one group: the group count differs.
  optim::Adam one({a, b, c}, optim::AdamOptions{});
  std::string e = error_of([&] { one.load_state_dict(state); });
  CHECK(contains(e, "optimizer load_state_dict"));
  CHECK(contains(e, "the state has 2 parameter groups but this optimizer has 1"));
  CHECK(one.step_count() == 0);  // nothing was loaded

  // Two groups split differently: their sizes differ (the flat buffers would fit).
  optim::Adam split(std::vector<optim::ParamGroup>{make_group({a}), make_group({b, c})}, optim::AdamOptions{});
  e = error_of([&] { split.load_state_dict(state); });
  CHECK(contains(e, "group 0 has 2 parameters in the state but 1 in this optimizer"));
  CHECK(contains(e, "group 1 has 1 parameters in the state but 2 in this optimizer"));

  // Several misfits at once, each named.
  optim::Adam same(std::vector<optim::ParamGroup>{make_group({a, b}), make_group({c})}, optim::AdamOptions{});
  auto bad = state;
  bad.erase("group.1.weight_decay");
  bad["exp_avg.2"] = zeros({3}, kFloat64);
  bad["exp_avg_sq.7"] = zeros({2}, kFloat64);
  bad["group.0.lr_ratio"] = scalar_tensor(-1.0, kFloat64);
  e = error_of([&] { same.load_state_dict(bad); });
  CHECK(contains(e, "'group.1.weight_decay' is missing from the state"));
  CHECK(contains(e, "'exp_avg.2' is float64 [3] but parameter 2 is float64 [2]"));
  CHECK(contains(e, "'exp_avg_sq.7' refers to parameter 7 but there are 3"));
  CHECK(contains(e, "'group.0.lr_ratio' is -"));
  CHECK(contains(e, "it must be finite and non-negative"));
  // The good state loads, and restores the groups' ratios and weight decays.
  same.load_state_dict(state);
  CHECK(same.step_count() == 1);
  CHECK(same.group_lr_ratio(0) == doctest::Approx(0.1));
  CHECK(same.group_lr(0) == doctest::Approx(1e-4));
}

TEST_CASE("parameter groups: a parameter in two groups, empty groups, lr 0") {
  Tensor a = param({1.0}), b = param({2.0}), c = param({3.0});
  std::string e = error_of([&] {
    optim::AdamW(std::vector<optim::ParamGroup>{make_group({a, b}), make_group({c, a})}, optim::AdamWOptions{});
  });
  CHECK(contains(e, "optimizer: parameter 3 appears in more than one group"));
  CHECK(contains(e, "same tensor as parameter 0"));
  e = error_of([&] { optim::SGD({a, b, a}, optim::SGDOptions{}); });  // twice in one group
  CHECK(contains(e, "optimizer: parameter 2 appears in more than one group"));

  // Empty groups are allowed, and keep their place in the numbering.
  optim::SGD sgd(std::vector<optim::ParamGroup>{make_group({}), make_group({a}, 0.5), make_group({})},
                 optim::SGDOptions{1.0});
  CHECK(sgd.num_groups() == 3);
  CHECK(sgd.params().size() == 1);
  CHECK(sgd.group_params(0).empty());
  set_grad(a, {1.0});
  sgd.step();
  check_values(a, {0.5});
  auto state = as_map(sgd.state_dict());
  CHECK(state.count("group.2.lr_ratio") == 1);
  optim::SGD again(std::vector<optim::ParamGroup>{make_group({}), make_group({a}), make_group({})},
                   optim::SGDOptions{1.0});
  again.load_state_dict(state);
  CHECK(again.group_lr(1) == doctest::Approx(0.5));

  // With options.lr 0 a group's own lr has no ratio unless it is 0 too.
  optim::SGDOptions zero;
  zero.lr = 0;
  CHECK(contains(error_of([&] { optim::SGD(std::vector<optim::ParamGroup>{make_group({b}, 0.1)}, zero); }),
                 "the optimizer's lr is 0"));
  optim::SGD frozen(std::vector<optim::ParamGroup>{make_group({b}), make_group({c}, 0.0)}, zero);
  frozen.set_lr(0.3);
  CHECK(frozen.group_lr(0) == doctest::Approx(0.3));  // unset: ratio 1
  CHECK(frozen.group_lr(1) == 0.0);                   // its own lr 0: stays 0
  CHECK(contains(error_of([&] { optim::SGD(std::vector<optim::ParamGroup>{make_group({b}, -0.1)}, optim::SGDOptions{}); }),
                 "group 0 has lr -0.1; it must be non-negative"));
  CHECK(contains(error_of([&] {
                   optim::SGD(std::vector<optim::ParamGroup>{make_group({b}, std::nullopt, -1.0)}, optim::SGDOptions{});
                 }),
                 "group 0 has weight_decay -"));
}

TEST_CASE("parameter groups: a state saved before groups existed still loads into one group") {
  Tensor p = param({1.0, 2.0});
  optim::AdamOptions o;
  o.lr = 0.1, o.weight_decay = 0.01;
  optim::Adam adam({p}, o);
  // As Optimizer::state_dict wrote it before groups: step, lr and the buffers, nothing else.
  std::map<std::string, Tensor> old = {{"step", scalar_tensor(3, kInt64)},
                                       {"lr", scalar_tensor(0.05, kFloat64)},
                                       {"exp_avg.0", tensor({0.1, 0.2}, {}, kFloat64)},
                                       {"exp_avg_sq.0", tensor({0.01, 0.04}, {}, kFloat64)}};
  adam.load_state_dict(old);
  CHECK(adam.step_count() == 3);
  CHECK(adam.lr() == doctest::Approx(0.05));
  CHECK(adam.group_lr(0) == doctest::Approx(0.05));  // ratio 1, as constructed
  CHECK(adam.group_weight_decay(0) == doctest::Approx(0.01));
  // It steps on from that state: step 4 by hand (L2 weight decay added to the gradient).
  set_grad(p, {0.5, -1.0});
  adam.step();
  std::vector<double> expected;
  const double p0[] = {1.0, 2.0}, g0[] = {0.5, -1.0}, m0[] = {0.1, 0.2}, v0[] = {0.01, 0.04};
  for (int j = 0; j < 2; ++j) {
    double g = g0[j] + 0.01 * p0[j];
    double m = 0.9 * m0[j] + 0.1 * g, v = 0.999 * v0[j] + 0.001 * g * g;
    double step_size = 0.05 / (1 - std::pow(0.9, 4)), bc2 = std::sqrt(1 - std::pow(0.999, 4));
    expected.push_back(p0[j] - step_size * m / (std::sqrt(v) / bc2 + 1e-8));
  }
  check_values(p, expected, 1e-12);

  // It fits only a one-group optimizer.
  Tensor q = param({1.0});
  optim::Adam two(std::vector<optim::ParamGroup>{make_group({p}), make_group({q})}, o);
  CHECK(contains(error_of([&] { two.load_state_dict(old); }), "the state has no parameter groups"));
}

TEST_CASE("schedules: cosine and linear with warmup, as nanoGPT's get_lr") {
  const double peak = 6e-4, min_lr = 6e-5, pi = std::acos(-1.0);
  optim::CosineSchedule cosine(peak, 10, 110, min_lr);
  optim::LinearSchedule linear(peak, 10, 110, min_lr);
  auto cosine_formula = [&](int64_t s) {
    return min_lr + 0.5 * (1.0 + std::cos(pi * static_cast<double>(s - 10) / 100.0)) * (peak - min_lr);
  };
  auto linear_formula = [&](int64_t s) { return min_lr + (1.0 - static_cast<double>(s - 10) / 100.0) * (peak - min_lr); };
  // Reference: nanoGPT's get_lr (warmup lr * it / warmup_iters; cosine or linear decay), it = step:
  //   def get_lr(it, lr=6e-4, warmup_iters=10, lr_decay_iters=110, min_lr=6e-5, cosine=True):
  //       if it < warmup_iters: return lr * it / warmup_iters
  //       if it > lr_decay_iters: return min_lr
  //       r = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
  //       coeff = 0.5 * (1.0 + math.cos(math.pi * r)) if cosine else 1.0 - r
  //       return min_lr + coeff * (lr - min_lr)
  //   at steps 1, 10, 35, 60, 110, 120
  const std::vector<int64_t> steps = {1, 10, 35, 60, 110, 120};
  const std::vector<double> cosine_ref = {5.9999999999999995e-05, 0.0006, 0.0005209188309203678,
                                          0.00032999999999999994, 6e-05, 6e-05};
  const std::vector<double> linear_ref = {5.9999999999999995e-05, 0.0006, 0.0004649999999999999,
                                          0.00032999999999999994, 6e-05, 6e-05};
  for (size_t i = 0; i < steps.size(); ++i) {
    INFO("step ", steps[i]);
    CHECK(cosine.lr(steps[i]) == doctest::Approx(cosine_ref[i]).epsilon(1e-12));
    CHECK(linear.lr(steps[i]) == doctest::Approx(linear_ref[i]).epsilon(1e-12));
  }
  CHECK(cosine.lr(1) == doctest::Approx(peak * 1 / 10));  // warmup
  CHECK(linear.lr(5) == doctest::Approx(peak * 5 / 10));
  CHECK(cosine.lr(10) == doctest::Approx(peak));           // the end of the warmup is the peak
  CHECK(cosine.lr(60) == doctest::Approx((peak + min_lr) / 2));  // the middle
  CHECK(linear.lr(60) == doctest::Approx((peak + min_lr) / 2));
  for (int64_t s : {11, 35, 80, 109}) {
    CHECK(cosine.lr(s) == doctest::Approx(cosine_formula(s)).epsilon(1e-12));
    CHECK(linear.lr(s) == doctest::Approx(linear_formula(s)).epsilon(1e-12));
  }
  CHECK(cosine.lr(110) == doctest::Approx(min_lr));  // total
  CHECK(cosine.lr(120) == min_lr);                   // after total
  CHECK(linear.lr(1000000) == min_lr);
  for (int64_t s = 11; s <= 110; ++s) CHECK(cosine.lr(s) <= cosine.lr(s - 1));

  // No warmup: the decay starts at step 1; min_lr defaults to 0; warmup == total: no decay.
  optim::CosineSchedule no_warmup(1.0, 0, 100);
  CHECK(no_warmup.lr(1) == doctest::Approx(0.5 * (1.0 + std::cos(pi / 100))));
  CHECK(no_warmup.lr(100) == doctest::Approx(0.0));
  CHECK(no_warmup.lr(101) == 0.0);
  optim::LinearSchedule warmup_only(2.0, 10, 10);
  CHECK(warmup_only.lr(5) == doctest::Approx(1.0));
  CHECK(warmup_only.lr(10) == doctest::Approx(2.0));
  CHECK(warmup_only.lr(11) == 0.0);

  CHECK(contains(error_of([] { optim::CosineSchedule(0.0, 10, 100); }), "CosineSchedule: peak_lr must be positive"));
  CHECK(contains(error_of([] { optim::LinearSchedule(-1e-3, 10, 100); }), "LinearSchedule: peak_lr must be positive"));
  CHECK(contains(error_of([] { optim::CosineSchedule(1e-3, 10, 100, 2e-3); }), "CosineSchedule: min_lr must be in"));
  CHECK(contains(error_of([] { optim::LinearSchedule(1e-3, 10, 100, -1e-4); }), "LinearSchedule: min_lr must be in"));
  CHECK(contains(error_of([] { optim::LinearSchedule(1e-3, 200, 100); }),
                 "LinearSchedule: warmup must be in [0, total = 100], got 200"));
  CHECK(contains(error_of([] { optim::CosineSchedule(1e-3, -1, 100); }), "CosineSchedule: warmup must be in"));
  CHECK(contains(error_of([] { optim::CosineSchedule(1e-3, 0, 0); }), "CosineSchedule: total must be positive"));
}
