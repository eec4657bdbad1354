// optim/: update rules against hand-computed values, state save/load, clipping, schedules.
#include <unistd.h>

#include <cmath>
#include <cstdio>

#include "tapestry/optim/optimizer.h"
#include "tests/helpers.h"

using namespace tapestry;
using namespace tapestry::testing;

namespace {
Tensor param(std::vector<double> v) { return tensor(v).requires_grad_(); }
void set_grad(Tensor& p, std::vector<double> g) {
  p.zero_grad();
  sum(p * tensor(g)).backward();
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
  optim::AdamW adamw({w}, o);
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
