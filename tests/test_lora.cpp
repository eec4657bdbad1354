// nn::add_lora and its companions (nn/lora.h) on a tiny Llama: the adapters' names and parameter
// count, an adapted model that starts as its base, a gradcheck of the adapted layer, training that
// leaves the base bit-identical, the merged model equal to base plus adapters, the training state
// (gradients and AdamW moments) below full fine-tuning's, the fingerprint, and the errors.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tapestry/models/gpt.h"
#include "tapestry/models/llama.h"
#include "tapestry/nn/lora.h"
#include "tapestry/optim/optimizer.h"
#include "tests/helpers.h"

using namespace tapestry;
using namespace tapestry::testing;
using models::Llama;
using models::LlamaConfig;

namespace {

LlamaConfig lora_config(bool tie = false) {
  LlamaConfig c = LlamaConfig::named("tiny", 20);  // D 64, 4 heads of 16, 2 kv heads
  c.max_positions = 16, c.d_ff = 40, c.tie_embeddings = tie;
  return c;
}

// A batch of ids and next-token targets.
std::pair<Tensor, Tensor> batch(uint64_t seed) {
  Generator gen(seed);
  Tensor ids = randint(0, 20, {2, 8}, DType::Int64, &gen);
  return {ids.slice(1, 0, 7).contiguous(), ids.slice(1, 1, 8).contiguous()};
}

// Copies of the tensors (the values as they are now).
std::map<std::string, Tensor> snapshot(const nn::NamedTensors& state) {
  std::map<std::string, Tensor> copies;
  for (const auto& [name, t] : state) copies[name] = t.detach().clone();
  return copies;
}

bool bit_identical(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes()) return false;
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  for (size_t i = 0; i < x.size(); ++i)
    if (!(x[i] == y[i])) return false;
  return true;
}

// Bytes of the gradients a backward left and of the optimizer's state after one step.
int64_t training_state_bytes(nn::Module& model, optim::Optimizer& opt) {
  int64_t bytes = 0;
  for (const Tensor& p : model.parameters())
    if (p.grad().defined()) bytes += p.grad().numel() * static_cast<int64_t>(dtype_size(p.grad().dtype()));
  for (const auto& [name, t] : opt.state_dict()) bytes += t.numel() * static_cast<int64_t>(dtype_size(t.dtype()));
  return bytes;
}

}  // namespace

TEST_CASE("add_lora: PEFT's names, the parameter count, the base frozen, the outputs unchanged at the start") {
  manual_seed(1);
  Llama model(lora_config());
  model.eval();
  auto [x, y] = batch(3);
  const Tensor before = model.forward(x).detach();
  const int64_t base_params = model.num_parameters();

  nn::LoRAOptions o;
  o.rank = 4, o.alpha = 8, o.targets = {"q_proj", "v_proj", "down_proj"};
  const std::vector<std::string> adapted = nn::add_lora(model, o);
  CHECK(adapted == std::vector<std::string>{"layers.0.self_attn.q_proj", "layers.0.self_attn.v_proj",
                                            "layers.0.mlp.down_proj", "layers.1.self_attn.q_proj",
                                            "layers.1.self_attn.v_proj", "layers.1.mlp.down_proj"});
  // rank x (in + out) per layer: q 64 -> 64, v 64 -> 32, down 40 -> 64; two blocks.
  const int64_t per_block = 4 * (64 + 64) + 4 * (64 + 32) + 4 * (40 + 64);
  CHECK(model.num_trainable_parameters() == 2 * per_block);
  CHECK(model.num_parameters() == base_params + 2 * per_block);
  const nn::NamedTensors adapters = nn::lora_state_dict(model);
  REQUIRE(adapters.size() == 12);
  CHECK(adapters[0].first == "layers.0.self_attn.q_proj.lora_A.weight");
  CHECK(adapters[0].second.sizes() == Shape{4, 64});
  CHECK(adapters[1].first == "layers.0.self_attn.q_proj.lora_B.weight");
  CHECK(adapters[1].second.sizes() == Shape{64, 4});
  for (const auto& [name, p] : model.named_parameters())
    CHECK_MESSAGE(p.requires_grad() == (name.find(".lora_") != std::string::npos), name);
  CHECK(nn::base_state_dict(model).size() == model.state_dict().size() - 12);
  // B starts at zero: the adapted model computes the base's outputs.
  CHECK(max_diff(model.forward(x), before) == 0.0);
  // The weight decay split holds the trainable parameters only.
  CHECK(model.decay_parameters().size() == 12);
  CHECK(model.no_decay_parameters().empty());
}

TEST_CASE("add_lora: the adapted layer passes gradcheck (input, A, B) - dropout only while training") {
  manual_seed(2);
  nn::LoRAOptions o;
  o.rank = 2, o.alpha = 3, o.targets = {"lin"};
  struct Holder : nn::Module {
    std::shared_ptr<nn::Linear> lin;
  } holder;
  holder.lin = holder.register_module("lin", std::make_shared<nn::Linear>(5, 3));
  nn::add_lora(holder, o);
  holder.to(DType::Float64);
  nn::Linear& lin = *holder.lin;
  lin.lora_B->weight.detach().normal_(0, 1);  // nonzero, so that A's gradient is too
  Tensor x = randn({2, 4, 5}, DType::Float64).requires_grad_();
  CHECK(gradcheck([&](const TensorList& in) { return lin.forward(in[0]); }, {x, lin.lora_A->weight, lin.lora_B->weight}));
  // y = x W^T + b + (alpha / rank) x A^T B^T, by hand.
  const Tensor expected = x.matmul(lin.weight.transpose(0, 1)).add(lin.bias).add(
      x.matmul(lin.lora_A->weight.transpose(0, 1)).matmul(lin.lora_B->weight.transpose(0, 1)).mul(1.5));
  CHECK(max_diff(lin.forward(x), expected) < 1e-12);
  CHECK_FALSE(lin.weight.requires_grad());
  lin.lora_dropout = 0.5;
  holder.eval();
  CHECK(max_diff(lin.forward(x), expected) < 1e-12);  // no dropout in eval()
  holder.train();
  CHECK(max_diff(lin.forward(x), expected) > 1e-6);
}

TEST_CASE("LoRA training: the base bit-identical, the merged model equals base plus adapters, the state below full fine-tuning") {
  manual_seed(3);
  Llama model(lora_config());
  const std::map<std::string, Tensor> base = snapshot(model.state_dict());
  const std::string base_print = nn::fingerprint(model.state_dict());
  nn::LoRAOptions o;
  o.rank = 2, o.alpha = 4, o.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  nn::add_lora(model, o);
  optim::AdamWOptions ao;
  ao.lr = 1e-2, ao.weight_decay = 0.1;
  optim::AdamW adamw(model.trainable_parameters(), ao);
  auto [x, y] = batch(4);
  const double first = model.loss(x, y).item<double>();
  double last = first;
  for (int step = 0; step < 30; ++step) {
    adamw.zero_grad();
    Tensor loss = model.loss(x, y);
    loss.backward();
    adamw.step();
    last = loss.item<double>();
  }
  CHECK(last < first - 0.1);
  const int64_t lora_state = training_state_bytes(model, adamw);
  // The base: every tensor bit-identical, the fingerprint unchanged; the adapters moved.
  for (const auto& [name, t] : nn::base_state_dict(model)) CHECK_MESSAGE(bit_identical(t, base.at(name)), name);
  CHECK(nn::fingerprint(nn::base_state_dict(model)) == base_print);
  CHECK(nn::fingerprint(model.state_dict()) != base_print);
  for (const auto& [name, t] : nn::lora_state_dict(model))
    if (name.find("lora_B") != std::string::npos) CHECK_MESSAGE(t.abs().max().item<double>() > 0, name);

  // The merged weights in a plain model give the adapted model's logits.
  model.eval();
  auto [x2, y2] = batch(5);
  const Tensor adapted_logits = model.forward(x2).detach();
  Llama plain(lora_config());
  const nn::NamedTensors merged = nn::merged_state_dict(model);
  plain.load_state_dict(std::map<std::string, Tensor>(merged.begin(), merged.end()));
  plain.eval();
  const Tensor merged_logits = plain.forward(x2);
  CHECK(max_diff(merged_logits, adapted_logits) < 1e-4 * adapted_logits.abs().max().item<double>());
  // In float64 they agree to rounding.
  model.to(DType::Float64), plain.to(DType::Float64);
  const nn::NamedTensors merged64 = nn::merged_state_dict(model);
  plain.load_state_dict(std::map<std::string, Tensor>(merged64.begin(), merged64.end()));
  CHECK(max_diff(plain.forward(x2), model.forward(x2)) < 1e-10);
  // The unmerged weights differ from the merged ones only where adapters were.
  const std::map<std::string, Tensor> merged_map(merged.begin(), merged.end());
  CHECK(bit_identical(merged_map.at("embed_tokens.weight"), base.at("embed_tokens.weight")));
  CHECK_FALSE(bit_identical(merged_map.at("layers.0.self_attn.q_proj.weight"), base.at("layers.0.self_attn.q_proj.weight")));

  // Full fine-tuning of the same model keeps a gradient and two moments for every weight.
  manual_seed(3);
  Llama full(lora_config());
  optim::AdamW full_adamw(full.parameters(), ao);
  full.loss(x, y).backward();
  full_adamw.step();
  const int64_t full_state = training_state_bytes(full, full_adamw);
  CHECK(full_state >= 3 * full.num_parameters() * 4);
  CHECK(lora_state < full_state / 5);
  MESSAGE("training state: LoRA ", lora_state, " bytes, full fine-tuning ", full_state);
}

TEST_CASE("add_lora: errors before any change - rank, alpha, unknown or tied layers, twice") {
  manual_seed(4);
  Llama model(lora_config(/*tie=*/true));
  nn::LoRAOptions o;
  o.targets = {"q_proj"};
  o.rank = 0;
  CHECK_THROWS_WITH_AS(nn::add_lora(model, o), doctest::Contains("rank must be at least 1"), Error);
  o.rank = 2, o.alpha = 0;
  CHECK_THROWS_WITH_AS(nn::add_lora(model, o), doctest::Contains("alpha must be positive"), Error);
  o.alpha = 4, o.dropout = 1;
  CHECK_THROWS_WITH_AS(nn::add_lora(model, o), doctest::Contains("dropout must be in [0, 1)"), Error);
  o.dropout = 0, o.targets = {"q_proj", "query"};
  CHECK_THROWS_WITH_AS(nn::add_lora(model, o),
                       doctest::Contains("no Linear layer is named 'query'; the model's are: down_proj, gate_proj, "
                                         "k_proj, lm_head, o_proj, q_proj, up_proj, v_proj"),
                       Error);
  o.targets = {"lm_head"};  // tied to the embedding
  CHECK_THROWS_WITH_AS(nn::add_lora(model, o), doctest::Contains("lm_head's weight is tied"), Error);
  // A rank above a layer's smaller dimension (issue 44: 1000000 failed late, out of memory).
  o.targets = {"q_proj"}, o.rank = 1000000;
  CHECK_THROWS_WITH_AS(nn::add_lora(model, o), doctest::Contains("rank 1000000 is above the smaller dimension of"),
                       Error);
  CHECK_THROWS_WITH_AS(nn::add_lora(model, o), doctest::Contains("MiB; take a rank of at most"), Error);
  o.rank = 2;
  CHECK(model.num_trainable_parameters() == model.num_parameters());  // nothing changed
  o.targets = {"q_proj", "q_proj"};  // listed twice: adapted once
  CHECK(nn::add_lora(model, o).size() == 2);
  CHECK_THROWS_WITH_AS(nn::add_lora(model, o), doctest::Contains("the model has adapters already"), Error);
  // A tie is seen whichever layer was registered first.
  struct Pair : nn::Module {
    std::shared_ptr<nn::Linear> a, b;
  } pair;
  pair.a = pair.register_module("a", std::make_shared<nn::Linear>(4, 4));
  pair.b = pair.register_module("b", std::make_shared<nn::Linear>(4, 4));
  pair.a->tie_parameter("weight", pair.b->weight);
  o.targets = {"a"};
  CHECK_THROWS_WITH_AS(nn::add_lora(pair, o), doctest::Contains("a's weight is tied"), Error);
  // The GPT's layers by their own names.
  models::GPTConfig g = models::GPTConfig::named("tiny", 20);
  models::GPT gpt(g);
  o.targets = {"w_q", "fc"};
  CHECK(nn::add_lora(gpt, o) == std::vector<std::string>{"blocks.0.attn.w_q", "blocks.0.mlp.fc", "blocks.1.attn.w_q",
                                                         "blocks.1.mlp.fc"});
}

TEST_CASE("fingerprint: names, shapes and values decide it") {
  Tensor a = tensor(std::vector<double>{1, 2, 3}, {}, kFloat64).to(DType::Float32), b = a.clone();
  const std::string f = nn::fingerprint({{"w", a}});
  CHECK(f.rfind("crc32:", 0) == 0);
  CHECK(f.size() == 14);
  CHECK(nn::fingerprint({{"w", b}}) == f);
  CHECK(nn::fingerprint({{"v", b}}) != f);
  CHECK(nn::fingerprint({{"w", b.view({3, 1})}}) != f);
  b.data_ptr<float>()[2] = std::nextafter(3.0f, 4.0f);
  CHECK(nn::fingerprint({{"w", b}}) != f);
}
