// MAML (Finn et al. 2017) on sine-wave regression, one inner SGD step: the meta-gradient flows
// through the inner step, so it holds second derivatives of the support loss (the inner
// gradient is taken with create_graph). Meta-trains briefly and prints the query loss after one
// inner step before and after. With a path argument, writes the first meta-gradient, its
// weights and tasks, for tools/reference/second_order_ref.py to recompute in PyTorch.
#include <cmath>
#include <cstdio>
#include <vector>

#include <tapestry/tapestry.h>

using namespace tapestry;

namespace {

// A 1-40-40-1 ReLU network as a function of its parameters, so that the inner step's adapted
// weights (tensors with a history) can be used in place of the module's.
Tensor net(const Tensor& x, const TensorList& w) {
  Tensor h = relu(linear(x, w[0], w[1]));
  h = relu(linear(h, w[2], w[3]));
  return linear(h, w[4], w[5]);
}

Tensor mse(const Tensor& a, const Tensor& b) { return ((a - b) * (a - b)).mean(); }

struct Task {
  Tensor xs, ys, xq, yq;  // support and query: 10 points each
};

Task sample_task(Generator& gen) {
  const double amplitude = 0.1 + 4.9 * rand({}, kFloat64, &gen).item<double>();
  const double phase = M_PI * rand({}, kFloat64, &gen).item<double>();
  auto points = [&](int64_t n) {
    Tensor x = rand({n, 1}, kFloat64, &gen) * 10.0 - 5.0;
    std::vector<double> y = x.to_vector<double>();
    for (double& v : y) v = amplitude * std::sin(v + phase);
    return std::make_pair(x, tensor(y, {n, 1}, kFloat64));
  };
  auto [xs, ys] = points(10);
  auto [xq, yq] = points(10);
  return {xs, ys, xq, yq};
}

// The meta-loss of a batch of tasks: each task's query loss after one inner SGD step from w.
Tensor meta_loss(const TensorList& w, const std::vector<Task>& tasks, double inner_lr) {
  Tensor total = zeros({}, kFloat64);
  for (const Task& t : tasks) {
    TensorList g = autograd::grad({mse(net(t.xs, w), t.ys)}, w, {}, std::nullopt, /*create_graph=*/true);
    TensorList adapted;
    for (size_t i = 0; i < w.size(); ++i) adapted.push_back(w[i] - inner_lr * g[i]);
    total = total + mse(net(t.xq, adapted), t.yq);
  }
  return total / static_cast<double>(tasks.size());
}

}  // namespace

int main(int argc, char** argv) {
  manual_seed(7);
  Generator gen(11);
  const double inner_lr = 0.01;
  TensorList w;
  for (auto [out, in] : std::vector<std::pair<int64_t, int64_t>>{{40, 1}, {40, 40}, {1, 40}}) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    w.push_back(((rand({out, in}, kFloat64, &gen) * 2.0 - 1.0) * bound).requires_grad_());
    w.push_back(((rand({out}, kFloat64, &gen) * 2.0 - 1.0) * bound).requires_grad_());
  }
  std::vector<Task> held_out;
  for (int i = 0; i < 16; ++i) held_out.push_back(sample_task(gen));
  auto evaluate = [&] { return meta_loss(w, held_out, inner_lr).item<double>(); };
  const double before = evaluate();

  optim::AdamOptions ao;
  ao.lr = 1e-3;
  optim::Adam meta_opt(w, ao);
  for (int step = 0; step < 1000; ++step) {
    std::vector<Task> tasks;
    for (int i = 0; i < 4; ++i) tasks.push_back(sample_task(gen));
    Tensor loss = meta_loss(w, tasks, inner_lr);
    meta_opt.zero_grad();
    loss.backward();
    if (step == 0 && argc > 1) {  // the first meta-gradient, for the PyTorch comparison
      nn::NamedTensors dump;
      const char* names[] = {"w1", "b1", "w2", "b2", "w3", "b3"};
      for (size_t i = 0; i < w.size(); ++i) {
        dump.emplace_back(std::string("param.") + names[i], w[i].detach().clone());
        dump.emplace_back(std::string("grad.") + names[i], w[i].grad().clone());
      }
      for (size_t t = 0; t < tasks.size(); ++t) {
        const std::string k = "task" + std::to_string(t) + ".";
        dump.emplace_back(k + "xs", tasks[t].xs), dump.emplace_back(k + "ys", tasks[t].ys);
        dump.emplace_back(k + "xq", tasks[t].xq), dump.emplace_back(k + "yq", tasks[t].yq);
      }
      dump.emplace_back("out.loss", loss.detach());
      nn::save_safetensors(argv[1], dump, {{"example", "maml_sine"}, {"inner_lr", "0.01"}, {"tasks", "4"}});
    }
    meta_opt.step();
  }
  const double after = evaluate();
  std::printf("maml_sine: held-out query loss after one inner step: %.4f before meta-training, %.4f after 1000 "
              "meta-steps\n", before, after);
  return after < before ? 0 : 1;
}
