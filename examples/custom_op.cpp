// A user's own differentiable op and model, written against the installed library: a fused
// swish(x) = x * sigmoid(x) with its hand-written backward (record() + SavedTensor), checked
// against finite differences with gradcheck, then used inside an nn::Module trained with Adam.
// Built by examples/CMakeLists.txt through find_package(tapestry); the op itself is in swish.h
// (tests/test_module_api.cpp tests the same header).
#include <cstdio>

#include <tapestry/tapestry.h>

#include "swish.h"

using namespace tapestry;

class SwishMLP : public nn::Module {
 public:
  SwishMLP(int64_t in, int64_t hidden, int64_t out)
      : fc1(register_module("fc1", std::make_shared<nn::Linear>(in, hidden))),
        fc2(register_module("fc2", std::make_shared<nn::Linear>(hidden, out))) {}
  Tensor forward(const Tensor& x) const { return fc2->forward(swish(fc1->forward(x))); }
  std::shared_ptr<nn::Linear> fc1, fc2;
};

int main() {
  std::printf("tapestry %s\n", kVersion);
  manual_seed(0);
  // 1. The backward agrees with finite differences (float64), on a non-contiguous input too.
  Tensor x = randn({4, 3}, DType::Float64).requires_grad_();
  Tensor xt = randn({3, 4}, DType::Float64).requires_grad_();
  if (!gradcheck([](const TensorList& in) { return swish(in[0]); }, {x}) ||
      !gradcheck([](const TensorList& in) { return swish(in[0].transpose(0, 1)); }, {xt})) {
    std::printf("gradcheck failed\n");
    return 1;
  }
  std::printf("gradcheck of swish: ok\n");

  // 2. A model using it learns y = 4 (|x| - x^2) on [-1, 1].
  Tensor inputs = rand({256, 1}) * 2.0 - 1.0;
  Tensor targets = (abs(inputs) - inputs * inputs) * 4.0;
  SwishMLP model(1, 32, 1);
  optim::AdamOptions options;
  options.lr = 1e-2;
  optim::Adam adam(model.parameters(), options);
  double first = 0, last = 0;
  for (int step = 0; step < 500; ++step) {
    Tensor loss = (model.forward(inputs) - targets).pow(2.0).mean();
    loss.backward();
    adam.step();
    adam.zero_grad();
    (step == 0 ? first : last) = loss.item<double>();
  }
  std::printf("mean squared error: %.4f at the start, %.4f after 500 Adam steps\n", first, last);
  return last < first / 4 ? 0 : 1;  // it learns (a kink takes longer to fit exactly)
}
