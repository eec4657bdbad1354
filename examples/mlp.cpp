// A 2 -> 16 -> 1 tanh MLP learns XOR, trained with plain SGD written by hand: forward, backward,
// then an update under NoGradGuard. Prints the loss every 100 steps and the final predictions.
#include <cstdio>
#include <iostream>
#include <vector>

#include <tapestry/tapestry.h>

using namespace tapestry;

int main() {
  manual_seed(0);
  Tensor x = tensor({0.f, 0.f, 0.f, 1.f, 1.f, 0.f, 1.f, 1.f}, {4, 2});  // (4, 2) the four inputs
  Tensor y = tensor({0.f, 1.f, 1.f, 0.f}, {4, 1});                      // (4, 1) their XOR
  Tensor w1 = randn({2, 16}).requires_grad_();
  Tensor b1 = zeros({16}).requires_grad_();
  Tensor w2 = (randn({16, 1}) * 0.25).requires_grad_();
  Tensor b2 = zeros({1}).requires_grad_();
  std::vector<Tensor> params = {w1, b1, w2, b2};  // handles: they share the tensors above
  // (N, 2) -> (N, 16) -> (N, 1)
  auto forward = [&](const Tensor& in) { return (in.matmul(w1) + b1).tanh().matmul(w2) + b2; };

  const double lr = 0.1;
  for (int step = 0; step <= 1000; ++step) {
    Tensor loss = (forward(x) - y).pow(2.0).mean();
    loss.backward();
    {
      NoGradGuard no_grad;  // the update must not be recorded (and in-place ops need it)
      for (Tensor& p : params) {
        p.sub_(p.grad() * lr);
        p.zero_grad();
      }
    }
    if (step % 100 == 0) std::printf("step %4d  loss %.3g\n", step, loss.item<double>());
  }

  NoGradGuard no_grad;
  std::cout << "predictions for (0,0) (0,1) (1,0) (1,1):\n" << forward(x) << "\n";
  return 0;
}
