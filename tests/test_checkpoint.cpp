// Activation checkpointing (autograd/checkpoint.h, Module::set_checkpointing): checkpoint() of a
// composite passes gradcheck and gives the plain gradients; the zoo's models trained one step with
// dropout give the same loss and every gradient to the bit with and without it (the translation
// Transformer's encoder output to rounding: its decoder layers hand it their two uses' gradients
// summed), the generator is where it would be, and nothing is recomputed in eval or without grad.
#include <map>
#include <set>
#include <string>

#include "tapestry/autograd/node.h"

#include "tapestry/models/gpt.h"
#include "tapestry/models/llama.h"
#include "tapestry/models/transformer.h"
#include "tapestry/models/vit.h"
#include "tests/helpers.h"

using namespace tapestry;
using namespace tapestry::testing;

namespace {

// The CheckpointBackward nodes in the graph of t.
int checkpoint_nodes(const Tensor& t) {
  int count = 0;
  std::set<const Node*> seen;
  std::vector<const Node*> stack;
  if (t.grad_fn()) stack.push_back(t.grad_fn().get());
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    if (!seen.insert(n).second) continue;
    count += n->name == "CheckpointBackward";
    for (const auto& next : n->next)
      if (next) stack.push_back(next.get());
  }
  return count;
}

// Every parameter's gradient after one backward of `loss()`, by name; the generator's state after.
struct Backward {
  double loss = 0;
  int checkpointed = 0;  // CheckpointBackward nodes in the loss's graph
  std::map<std::string, std::vector<double>> grads;
  std::string rng;
};

Backward one_backward(nn::Module& model, const std::function<Tensor()>& loss, bool checkpointing, uint64_t seed) {
  model.zero_grad();
  model.set_checkpointing(checkpointing);
  model.train();
  manual_seed(seed);
  Backward b;
  Tensor l = loss();
  b.checkpointed = checkpoint_nodes(l);
  l.backward();
  b.loss = l.item<double>();
  for (const auto& [name, p] : model.named_parameters())
    b.grads[name] = p.grad().defined() ? p.grad().to_vector<double>() : std::vector<double>{};
  b.rng = default_generator().state();
  model.set_checkpointing(false);
  return b;
}

// The same loss, every gradient bit for bit, the generator in the same state; `blocks` segments.
void check_identical(nn::Module& model, const std::function<Tensor()>& loss, int blocks) {
  const Backward plain = one_backward(model, loss, false, 7), ckpt = one_backward(model, loss, true, 7);
  CHECK(plain.checkpointed == 0);
  CHECK(ckpt.checkpointed == blocks);
  CHECK(plain.loss == ckpt.loss);
  CHECK(plain.rng == ckpt.rng);
  for (const auto& [name, g] : plain.grads) {
    REQUIRE_MESSAGE(!g.empty(), name);
    CHECK_MESSAGE(g == ckpt.grads.at(name), name);
  }
}

// check_identical for a 2-block language model of 30 tokens and 12 positions, on one batch.
void check_language_model(models::CausalLM& model) {
  Tensor ids = randint(0, 30, {3, 12}), targets = randint(0, 30, {3, 12});
  check_identical(model, [&] { return model.loss(ids, targets); }, 2);
}

}  // namespace

TEST_CASE("checkpoint: a composite's gradients, gradcheck, inputs that need none, no grad mode") {
  manual_seed(1);
  Tensor w = randn({4, 4}, DType::Float64).requires_grad_();  // a leaf fn reads besides its inputs
  auto fn = [w](const TensorList& in) { return tanh(in[0].matmul(w)).mul(in[1]).sum({1}); };
  Tensor x = randn({3, 4}, DType::Float64).requires_grad_(), y = randn({3, 4}, DType::Float64).requires_grad_();
  CHECK(gradcheck([&](const TensorList& in) { return checkpoint(fn, {in[0], in[1]}); }, {x, y}));
  w.zero_grad();  // gradcheck's backward reached it too
  // The gradients of x, y and w equal the plain ones to the bit.
  Tensor plain = fn({x, y});
  plain.sum().backward();
  const std::vector<double> gx = x.grad().to_vector<double>(), gy = y.grad().to_vector<double>(),
                            gw = w.grad().to_vector<double>();
  x.zero_grad(), y.zero_grad(), w.zero_grad();
  Tensor out = checkpoint(fn, {x, y});
  CHECK(out.grad_fn());
  CHECK(out.grad_fn()->name == "CheckpointBackward");
  CHECK(out.to_vector<double>() == plain.to_vector<double>());
  out.sum().backward();
  CHECK(x.grad().to_vector<double>() == gx);
  CHECK(y.grad().to_vector<double>() == gy);
  CHECK(w.grad().to_vector<double>() == gw);
  // An input that needs no gradient gets none; with none needing one, fn runs as it is.
  Tensor c = randn({3, 4}, DType::Float64);
  w.zero_grad();
  checkpoint(fn, {x, c}).sum().backward();
  CHECK_FALSE(c.grad().defined());
  Tensor direct = checkpoint(fn, {c, c});
  CHECK(direct.grad_fn()->name != "CheckpointBackward");
  {
    NoGradGuard no_grad;
    CHECK_FALSE(checkpoint(fn, {x, y}).requires_grad());
  }
}

TEST_CASE("checkpointing the zoo: the same loss and every gradient to the bit, dropout included") {
  SUBCASE("GPT") {
    models::GPTConfig c = models::GPTConfig::named("tiny", 30);
    c.block_size = 12, c.dropout = 0.2;
    manual_seed(2);
    models::GPT model(c);
    check_language_model(model);
  }
  SUBCASE("Llama") {
    models::LlamaConfig c = models::LlamaConfig::named("tiny", 30);
    c.max_positions = 12, c.dropout = 0.2;
    manual_seed(3);
    models::Llama model(c);
    check_language_model(model);
  }
  SUBCASE("ViT (nn::TransformerEncoder)") {
    models::ViTConfig c = models::ViTConfig::named("tiny");
    c.dropout = 0.2;
    manual_seed(4);
    models::ViT model(c);
    Tensor images = randn({4, 1, 28, 28}), labels = randint(0, 10, {4});
    check_identical(model, [&] { return model.loss(images, labels, 0.1); }, 2);
  }
  SUBCASE("Transformer: the encoder's gradients to rounding, the rest to the bit") {
    models::TransformerConfig c = models::TransformerConfig::named("tiny", 25, 27);
    c.dropout = 0.2;
    manual_seed(5);
    models::Transformer model(c);
    Tensor src = randint(3, 25, {2, 9}), tgt = randint(3, 27, {2, 8});
    Tensor tgt_in = tgt.slice(1, 0, 7).contiguous(), tgt_out = tgt.slice(1, 1, 8).contiguous();
    auto loss = [&] { return model.loss(src, tgt_in, tgt_out, 0.1); };
    const Backward plain = one_backward(model, loss, false, 7), ckpt = one_backward(model, loss, true, 7);
    CHECK(ckpt.checkpointed == 4);  // 2 encoder and 2 decoder layers
    CHECK(plain.loss == ckpt.loss);
    CHECK(plain.rng == ckpt.rng);
    for (const auto& [name, g] : plain.grads) {
      const std::vector<double>& h = ckpt.grads.at(name);
      REQUIRE(g.size() == h.size());
      const bool upstream = name.rfind("decoder", 0) != 0 && name.rfind("generator", 0) != 0 &&
                            name.rfind("tgt_embed", 0) != 0;
      double worst = 0, scale = 0;
      for (size_t i = 0; i < g.size(); ++i) worst = std::max(worst, std::abs(g[i] - h[i])), scale = std::max(scale, std::abs(g[i]));
      // (Relative to at least 1e-2: the key biases' gradients are rounding noise around 0.)
      if (upstream) CHECK_MESSAGE(worst <= 1e-5 * std::max(scale, 1e-2), name);
      else CHECK_MESSAGE(worst == 0, name);
    }
  }
}

TEST_CASE("checkpointing: nothing is recomputed in eval() or without grad - generation with a cache runs plainly") {
  models::GPTConfig c = models::GPTConfig::named("tiny", 30);
  c.block_size = 12;
  manual_seed(6);
  models::GPT model(c);
  model.set_checkpointing(true);
  CHECK(model.checkpointing());
  CHECK(model.blocks->at<models::GPTBlock>(0)->checkpointing());
  Tensor ids = randint(0, 30, {2, 5});
  CHECK(model.checkpoint_blocks());
  CHECK(checkpoint_nodes(model.forward(ids)) == 2);
  {
    NoGradGuard no_grad;
    CHECK_FALSE(model.checkpoint_blocks());
    CHECK_FALSE(model.forward(ids).requires_grad());
  }
  model.eval();
  CHECK_FALSE(model.checkpoint_blocks());
  const Tensor logits = model.forward(ids);
  CHECK(checkpoint_nodes(logits) == 0);
  model.set_checkpointing(false);
  CHECK(max_diff(model.forward(ids), logits) == 0);
  // Decoding with a KV cache, even in train() (no dropout: the config has none), runs the blocks
  // plainly and gives the same tokens.
  model.train();
  model.set_checkpointing(true);
  models::GPTCache cache;
  CHECK(checkpoint_nodes(model.forward(ids, &cache)) == 0);
  models::SampleOptions so;
  so.greedy = true, so.max_new = 4;
  const auto with = models::generate(model, {{1, 2, 3}}, so);
  model.set_checkpointing(false);
  CHECK(models::generate(model, {{1, 2, 3}}, so) == with);
}
