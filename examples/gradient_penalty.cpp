// A WGAN-GP critic step (Gulrajani et al. 2017): the critic's loss holds the norm of its own
// gradient with respect to its input, at points between real and fake samples, so the
// parameters' gradients are second derivatives. With a path argument, writes the weights, the
// batch, the loss and every parameter gradient there, for tools/reference/second_order_ref.py
// to recompute in PyTorch (ctest second_order_parity).
#include <cstdio>
#include <string>

#include <tapestry/tapestry.h>

using namespace tapestry;

class Critic : public nn::Module {
 public:
  Critic()
      : fc1(register_module("fc1", std::make_shared<nn::Linear>(2, 16))),
        fc2(register_module("fc2", std::make_shared<nn::Linear>(16, 16))),
        fc3(register_module("fc3", std::make_shared<nn::Linear>(16, 1))) {}
  Tensor forward(const Tensor& x) const { return fc3->forward(tanh(fc2->forward(tanh(fc1->forward(x))))); }
  std::shared_ptr<nn::Linear> fc1, fc2, fc3;
};

int main(int argc, char** argv) {
  manual_seed(3);
  Critic critic;
  critic.to(kFloat64);
  Generator gen(5);
  const int64_t batch = 8;
  const double lambda = 10.0;
  Tensor real = randn({batch, 2}, kFloat64, &gen) * 0.5 + 1.0;
  Tensor fake = randn({batch, 2}, kFloat64, &gen);
  Tensor eps = rand({batch, 1}, kFloat64, &gen);

  // The penalty at the interpolates: (|d critic / d x| - 1)^2, the gradient taken with
  // create_graph so that the loss's backward differentiates it again.
  Tensor between = (eps * real + (1.0 - eps) * fake).requires_grad_();
  Tensor grad_x = autograd::grad({critic.forward(between).sum()}, {between}, {}, std::nullopt, true)[0];
  Tensor norm = sqrt((grad_x * grad_x).sum({1}));
  Tensor penalty = ((norm - 1.0) * (norm - 1.0)).mean();
  Tensor loss = critic.forward(fake).mean() - critic.forward(real).mean() + lambda * penalty;
  loss.backward();

  double gnorm = 0;
  for (const Tensor& p : critic.parameters()) gnorm += (p.grad() * p.grad()).sum().item<double>();
  std::printf("gradient_penalty: loss %.6f (penalty %.6f), parameter gradient norm %.6f\n", loss.item<double>(),
              penalty.item<double>(), std::sqrt(gnorm));
  if (argc > 1) {
    nn::NamedTensors dump = critic.state_dict();
    dump.emplace_back("batch.real", real);
    dump.emplace_back("batch.fake", fake);
    dump.emplace_back("batch.eps", eps);
    dump.emplace_back("out.loss", loss.detach());
    for (auto& [name, p] : critic.named_parameters()) dump.emplace_back("grad." + name, p.grad());
    nn::save_safetensors(argv[1], dump, {{"example", "gradient_penalty"}, {"lambda", "10"}});
  }
  return std::isfinite(loss.item<double>()) ? 0 : 1;
}
