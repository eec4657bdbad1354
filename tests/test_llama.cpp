// models::Llama: names, the parameter count, validation, the rotary tables, causality,
// grouped-query attention equal to multi-head attention with repeated key/value heads, the KV
// cache (holding the key/value heads only), a falling loss and a whole-model gradcheck.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "tapestry/models/llama.h"
#include "tapestry/optim/optimizer.h"
#include "tests/helpers.h"

using namespace tapestry;
using namespace tapestry::testing;
using models::Llama;
using models::LlamaConfig;

namespace {
LlamaConfig tiny_config(int64_t kv_heads = 2, bool tie = false) {
  LlamaConfig c = LlamaConfig::named("tiny", 20);
  c.kv_heads = kv_heads, c.tie_embeddings = tie, c.max_positions = 16, c.d_ff = 40;
  return c;
}
}  // namespace

TEST_CASE("Llama: names, parameter count, tied head, validation") {
  manual_seed(1);
  Llama model(tiny_config());
  auto named = model.named_parameters();
  std::vector<std::string> names;
  for (auto& [n, p] : named) names.push_back(n);
  CHECK(names.front() == "embed_tokens.weight");
  CHECK(std::find(names.begin(), names.end(), "layers.1.self_attn.k_proj.weight") != names.end());
  CHECK(std::find(names.begin(), names.end(), "layers.0.mlp.gate_proj.weight") != names.end());
  CHECK(std::find(names.begin(), names.end(), "layers.0.post_attention_layernorm.weight") != names.end());
  CHECK(names.back() == "lm_head.weight");
  // D 64, 4 heads of 16, 2 kv heads: q, o 64x64; k, v 64x32; MLP 3 x 64x40; 2 norms per layer.
  const int64_t per_layer = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 40 + 2 * 64;
  CHECK(model.num_parameters() == 20 * 64 + 2 * per_layer + 64 + 64 * 20);
  CHECK(model.layers->at<models::LlamaBlock>(0)->self_attn->k_proj->weight.sizes() == Shape{32, 64});
  Llama tied(tiny_config(2, true));
  CHECK(tied.lm_head->weight.impl_ptr() == tied.embed_tokens->weight.impl_ptr());
  CHECK(tied.num_parameters() == model.num_parameters() - 64 * 20);

  LlamaConfig bad = tiny_config(3);
  CHECK(error_of([&] { Llama m(bad); }).find("kv_heads 3 must divide heads 4") != std::string::npos);
  bad = tiny_config();
  bad.heads = 32;  // head dim 2: fine; 64 heads would give 1, odd
  CHECK_NOTHROW(bad.validate());
  bad.heads = 64, bad.kv_heads = 64;
  CHECK(error_of([&] { bad.validate(); }).find("must be even for the rotary pairs") != std::string::npos);
  CHECK(error_of([] { LlamaConfig::named("huge", 10); }).find("unknown config 'huge'") != std::string::npos);
  CHECK(error_of([&] { model.forward(randint(0, 20, {1, 17}, kInt64)); }).find("exceed the context of 16") !=
        std::string::npos);
  CHECK(error_of([&] { model.forward(tensor({0, 25}, {1, 2})); }).find("token ids must be in [0, 20)") !=
        std::string::npos);
}

TEST_CASE("rotary_tables: Hugging Face's float32 angles") {
  auto [c, s] = models::rotary_tables(5, 8, 10000.0);
  CHECK(c.sizes() == Shape{5, 4});
  CHECK(c.dtype() == kFloat32);
  // position 3, pair 1: angle 3 / 10000^(2/8) = 0.3
  CHECK(values(c)[3 * 4 + 1] == doctest::Approx(std::cos(0.3)).epsilon(1e-6));
  CHECK(values(s)[3 * 4 + 1] == doctest::Approx(std::sin(0.3)).epsilon(1e-6));
  CHECK(values(c)[0] == 1.0);  // position 0 does not turn
  CHECK(error_of([] { models::rotary_tables(4, 7, 10000.0); }).find("an even head_dim") != std::string::npos);
}

TEST_CASE("Llama: causal - grouped-query attention equals multi-head with repeated key/value heads") {
  manual_seed(2);
  Llama gqa(tiny_config(2));
  NoGradGuard no_grad;
  Generator g(3);
  Tensor ids = randint(0, 20, {2, 9}, kInt64, &g);
  Tensor logits = gqa.forward(ids);
  CHECK(logits.sizes() == Shape{2, 9, 20});
  // A changed last token leaves the earlier positions' logits alone.
  Tensor changed = ids.clone();
  changed.select(1, 8).fill_(3.0);
  CHECK(max_diff(gqa.forward(changed).slice(1, 0, 8), logits.slice(1, 0, 8)) == 0);

  // The same model with 4 kv heads, kv head h = the GQA's kv head h / 2 (query heads 2j and 2j+1
  // share kv head j).
  Llama mha(tiny_config(4));
  auto source = gqa.named_parameters();
  auto target = mha.named_parameters();
  for (size_t i = 0; i < source.size(); ++i)
    if (source[i].second.sizes() == target[i].second.sizes()) target[i].second.copy_(source[i].second);
  for (size_t i = 0; i < gqa.layers->size(); ++i) {
    auto a = gqa.layers->at<models::LlamaBlock>(i)->self_attn, b = mha.layers->at<models::LlamaBlock>(i)->self_attn;
    for (auto [src, dst] : {std::pair{a->k_proj, b->k_proj}, std::pair{a->v_proj, b->v_proj}}) {
      Tensor w = src->weight.view({2, 1, 16, 64}).expand({2, 2, 16, 64}).reshape({64, 64});
      dst->weight.copy_(w);
    }
  }
  CHECK(max_diff(mha.forward(ids), logits) <= 1e-5);
}

TEST_CASE("Llama: the KV cache (key/value heads only) gives the full forward's logits") {
  manual_seed(4);
  Llama model(tiny_config());
  NoGradGuard no_grad;
  Generator g(5);
  Tensor ids = randint(0, 20, {2, 12}, kInt64, &g);
  Tensor full = model.forward(ids);
  auto part = [&](int64_t a, int64_t b) { return ids.slice(1, a, b).contiguous(); };
  models::LlamaCache one;
  for (int64_t t = 0; t < 12; ++t) {
    INFO("position ", t);
    CHECK(max_diff(model.forward(part(t, t + 1), &one), full.slice(1, t, t + 1)) <= 1e-5);
  }
  CHECK(one.layers.size() == 2);
  CHECK(one.layers[0].k.sizes() == Shape{2, 2, 12, 16});  // G = 2 heads cached, not H = 4
  models::LlamaCache chunked;
  for (auto [a, b] : {std::pair<int64_t, int64_t>{0, 4}, {4, 9}, {9, 10}, {10, 12}}) {
    INFO("chunk ", a, "..", b);
    CHECK(max_diff(model.forward(part(a, b), &chunked), full.slice(1, a, b)) <= 1e-5);
  }
  // Explicit positions: a left-padded row, its pad masked out and its positions starting at 0.
  Tensor padded = tensor({0, 0, 5, 6, 7}, {1, 5});
  Tensor positions = tensor({0, 0, 0, 1, 2}, {1, 5});
  Tensor pad_mask = tensor({1.f, 1.f, 0.f, 0.f, 0.f}, {1, 1, 1, 5}).gt(0.5);
  Tensor got = model.forward(padded, nullptr, positions, pad_mask).slice(1, 2, 5);
  CHECK(max_diff(got, model.forward(tensor({5, 6, 7}, {1, 3}))) <= 1e-5);
}

TEST_CASE("Llama: AdamW lowers the loss on one batch - the float64 model passes gradcheck") {
  manual_seed(6);
  Llama model(tiny_config());
  Generator g(7);
  Tensor ids = randint(0, 20, {4, 12}, kInt64, &g), targets = randint(0, 20, {4, 12}, kInt64, &g);
  auto [first, last] = first_and_last_loss(model.parameters(), [&] { return model.loss(ids, targets); }, 25);
  CHECK(std::isfinite(last));
  CHECK(last < 0.6 * first);

  manual_seed(8);
  Llama m64(tiny_config(2, true));
  m64.to(kFloat64);
  Tensor x = randint(0, 20, {2, 5}, kInt64, &g), y = randint(0, 20, {2, 5}, kInt64, &g);
  CHECK(m64.loss(x, y).dtype() == kFloat64);
  auto b0 = m64.layers->at<models::LlamaBlock>(0);
  TensorList params = {m64.embed_tokens->weight, b0->self_attn->q_proj->weight, b0->self_attn->k_proj->weight,
                       b0->self_attn->v_proj->weight, b0->mlp->gate_proj->weight, b0->input_layernorm->weight,
                       m64.norm->weight};
  CHECK(gradcheck([&](const TensorList&) { return m64.loss(x, y); }, params));
}
