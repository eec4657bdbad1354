// Parameter initialisation, as torch.nn.init: each function fills a tensor in place (without
// recording: it is not part of any graph), draws from the default generator (manual_seed), and
// returns the tensor. Fans follow PyTorch's: for a weight [out, in, k...], fan_in = in * prod(k),
// fan_out = out * prod(k); tensors of fewer than 2 dims have no fans (an Error for the
// fan-based functions). The draws are tapestry's own: same distributions as PyTorch, not the
// same numbers.
//   model.apply([](nn::Module& m) {
//     if (auto* lin = dynamic_cast<nn::Linear*>(&m)) { nn::init::xavier_uniform_(lin->weight); }
//   });
#pragma once
#include <string>

#include "tapestry/nn/module.h"

namespace tapestry::nn::init {

Tensor zeros_(Tensor t);
Tensor ones_(Tensor t);
Tensor constant_(Tensor t, double value);
Tensor uniform_(Tensor t, double a = 0.0, double b = 1.0);
Tensor normal_(Tensor t, double mean = 0.0, double std = 1.0);
// N(mean, std) redrawn until it falls in [a, b] (absolute bounds, as PyTorch's).
Tensor trunc_normal_(Tensor t, double mean = 0.0, double std = 1.0, double a = -2.0, double b = 2.0);
// U(-bound, bound), bound = gain * sqrt(6 / (fan_in + fan_out)); and N(0, gain^2 * 2 / (fan_in + fan_out)).
Tensor xavier_uniform_(Tensor t, double gain = 1.0);
Tensor xavier_normal_(Tensor t, double gain = 1.0);
// He initialisation: std = gain / sqrt(fan), gain from `nonlinearity` ("relu": sqrt(2),
// "leaky_relu": sqrt(2 / (1 + a^2)), "linear"/"sigmoid": 1, "tanh": 5/3); mode "fan_in" or "fan_out".
// Uniform: U(-sqrt(3) * std, sqrt(3) * std). PyTorch's defaults (a = 0, leaky_relu).
Tensor kaiming_uniform_(Tensor t, double a = 0.0, const std::string& mode = "fan_in",
                        const std::string& nonlinearity = "leaky_relu");
Tensor kaiming_normal_(Tensor t, double a = 0.0, const std::string& mode = "fan_in",
                       const std::string& nonlinearity = "leaky_relu");

// torch.nn.init.calculate_gain.
double calculate_gain(const std::string& nonlinearity, double param = 0.01);
struct Fans {
  int64_t fan_in, fan_out;
};
Fans fans(const Tensor& t, const char* fn);

}  // namespace tapestry::nn::init
