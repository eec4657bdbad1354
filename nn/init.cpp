// Parameter initialisation (see init.h).
#include "tapestry/nn/init.h"

#include <cmath>
#include <random>
#include <vector>

#include "tapestry/ops/factory.h"

namespace tapestry::nn::init {

namespace {
void check_floating(const char* fn, const Tensor& t) {
  TP_CHECK(t.defined() && is_floating(t.dtype()), "{}: expected a floating-point tensor, got {}", fn,
           t.defined() ? fmt::format("{} {}", t.dtype(), t.sizes()) : std::string("an undefined one"));
}
}  // namespace

Tensor zeros_(Tensor t) { return constant_(t, 0.0); }
Tensor ones_(Tensor t) { return constant_(t, 1.0); }

Tensor constant_(Tensor t, double value) {
  TP_CHECK(t.defined(), "constant_: undefined tensor");
  NoGradGuard no_grad;
  t.fill_(value);
  return t;
}

Tensor uniform_(Tensor t, double a, double b) {
  check_floating("uniform_", t);
  TP_CHECK(a <= b, "uniform_: a {} is greater than b {}", a, b);
  NoGradGuard no_grad;
  t.uniform_(a, b);
  return t;
}

Tensor normal_(Tensor t, double mean, double std) {
  check_floating("normal_", t);
  TP_CHECK(std >= 0, "normal_: std must be >= 0, got {}", std);
  NoGradGuard no_grad;
  t.normal_(mean, std);
  return t;
}

Tensor trunc_normal_(Tensor t, double mean, double std, double a, double b) {
  check_floating("trunc_normal_", t);
  TP_CHECK(std > 0 && a < b, "trunc_normal_: needs std > 0 and a < b, got std {}, [{}, {}]", std, a, b);
  // Rejection is slow only when [a, b] holds little of the mass: refuse bounds more than 6 std
  // from the mean on the same side (a draw would almost never land).
  TP_CHECK(b > mean - 6 * std && a < mean + 6 * std,
           "trunc_normal_: [{}, {}] lies more than 6 std from the mean {} (std {})", a, b, mean, std);
  std::normal_distribution<double> normal(mean, std);
  auto& engine = default_generator().engine();
  std::vector<double> values(static_cast<size_t>(t.numel()));
  for (double& v : values) do v = normal(engine); while (v < a || v > b);
  NoGradGuard no_grad;
  t.copy_(tensor(values, t.sizes(), kFloat64));  // float64 on the host, converted and moved by copy_
  return t;
}

Fans fans(const Tensor& t, const char* fn) {
  TP_CHECK(t.defined() && t.dim() >= 2, "{}: fan in and fan out need a tensor of at least 2 dims, got shape {}", fn,
           t.defined() ? t.sizes() : Shape{});
  int64_t receptive = 1;
  for (int64_t d = 2; d < t.dim(); ++d) receptive *= t.size(d);
  return {t.size(1) * receptive, t.size(0) * receptive};
}

double calculate_gain(const std::string& nonlinearity, double param) {
  if (nonlinearity == "linear" || nonlinearity == "sigmoid" || nonlinearity.rfind("conv", 0) == 0) return 1.0;
  if (nonlinearity == "tanh") return 5.0 / 3.0;
  if (nonlinearity == "relu") return std::sqrt(2.0);
  if (nonlinearity == "leaky_relu") return std::sqrt(2.0 / (1.0 + param * param));
  if (nonlinearity == "selu") return 3.0 / 4.0;
  throw Error(fmt::format("calculate_gain: unknown nonlinearity '{}' (linear, sigmoid, tanh, relu, leaky_relu, selu)",
                          nonlinearity));
}

Tensor xavier_uniform_(Tensor t, double gain) {
  check_floating("xavier_uniform_", t);
  const Fans f = fans(t, "xavier_uniform_");
  const double bound = gain * std::sqrt(6.0 / static_cast<double>(f.fan_in + f.fan_out));
  return uniform_(t, -bound, bound);
}

Tensor xavier_normal_(Tensor t, double gain) {
  check_floating("xavier_normal_", t);
  const Fans f = fans(t, "xavier_normal_");
  return normal_(t, 0.0, gain * std::sqrt(2.0 / static_cast<double>(f.fan_in + f.fan_out)));
}

namespace {
double kaiming_std(const char* fn, const Tensor& t, double a, const std::string& mode, const std::string& nonlinearity) {
  check_floating(fn, t);
  TP_CHECK(mode == "fan_in" || mode == "fan_out", "{}: mode must be fan_in or fan_out, got '{}'", fn, mode);
  const Fans f = fans(t, fn);
  const int64_t fan = mode == "fan_in" ? f.fan_in : f.fan_out;
  TP_CHECK(fan > 0, "{}: the tensor of shape {} has {} 0", fn, t.sizes(), mode);
  return calculate_gain(nonlinearity, a) / std::sqrt(static_cast<double>(fan));
}
}  // namespace

Tensor kaiming_uniform_(Tensor t, double a, const std::string& mode, const std::string& nonlinearity) {
  const double bound = std::sqrt(3.0) * kaiming_std("kaiming_uniform_", t, a, mode, nonlinearity);
  return uniform_(t, -bound, bound);
}

Tensor kaiming_normal_(Tensor t, double a, const std::string& mode, const std::string& nonlinearity) {
  return normal_(t, 0.0, kaiming_std("kaiming_normal_", t, a, mode, nonlinearity));
}

}  // namespace tapestry::nn::init
