// models/gpt: configs and their parameter counts, a tiny GPT's forward (shapes, causality, the
// loss, tied head, parameter groups, training steps, a whole-model gradcheck), the KV cache
// against the full forward, generate() and sample_next(), and load_gpt2_hf on a checkpoint
// written here in Hugging Face's layout from a tapestry GPT.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>

#include "tapestry/models/gpt.h"
#include "tapestry/nn/safetensors.h"
#include "tests/helpers.h"

using namespace tapestry;
using namespace tapestry::testing;
using models::GPT;
using models::GPTConfig;
using Ids = std::vector<int64_t>;

namespace {

GPTConfig tiny_config() {
  GPTConfig c;
  c.vocab = 20, c.block_size = 16, c.layers = 2, c.heads = 2, c.d_model = 16, c.dropout = 0.0;
  return c;
}

// GPT-2's parameter count with the head tied to the token embedding: embeddings, per layer two
// LayerNorms, q/k/v/o projections with biases and the MLP, then the final LayerNorm.
int64_t expected_parameters(const GPTConfig& c) {
  const int64_t V = c.vocab, B = c.block_size, D = c.d_model, F = c.ff_dim();
  return V * D + B * D + c.layers * (4 * (D * D + D) + 2 * 2 * D + D * F + F + F * D + D) + 2 * D;
}

Tensor ids_tensor(const Ids& ids) { return tensor(ids, {1, static_cast<int64_t>(ids.size())}); }

// Greedy continuation without the cache: the whole sequence runs through the model each step.
// The plain continuation, uncached: each token from a full forward of the last block_size tokens
// (nanoGPT's sliding window).
Ids greedy_reference(GPT& model, Ids seq, int64_t n) {
  NoGradGuard no_grad;
  Ids out;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t T = std::min<int64_t>(static_cast<int64_t>(seq.size()), model.config.block_size);
    Tensor logits = model.forward(ids_tensor(Ids(seq.end() - T, seq.end())));
    const int64_t next = argmax(logits.select(1, T - 1), 1).item<int64_t>();
    out.push_back(next);
    seq.push_back(next);
  }
  return out;
}

Ids random_ids(int64_t n, int64_t vocab, uint64_t seed) {
  Generator g(seed);
  return randint(0, vocab, {n}, kInt64, &g).to_vector<int64_t>();
}

std::set<const TensorImpl*> identities(const std::vector<Tensor>& ts) {
  std::set<const TensorImpl*> out;
  for (const Tensor& t : ts) out.insert(t.impl_ptr().get());
  return out;
}


// The model's weights in Hugging Face's GPT2LMHeadModel layout: Conv1D weights [in, out], the
// query, key and value projections side by side in c_attn, the old causal-mask buffer attn.bias
// (which the loader must skip), and lm_head.weight (the tied head, outside the prefix).
nn::NamedTensors hf_state(const GPT& m, const std::string& prefix, bool with_head = true) {
  NoGradGuard no_grad;
  nn::NamedTensors out;
  auto put = [&](const std::string& name, const Tensor& t) {
    out.emplace_back(prefix + name, t.detach().contiguous().clone());
  };
  auto conv1d = [](const nn::Linear& l) { return l.weight.detach().transpose(0, 1); };
  put("wte.weight", m.wte->weight);
  put("wpe.weight", m.wpe->weight);
  for (size_t i = 0; i < m.blocks->size(); ++i) {
    auto b = m.blocks->at<models::GPTBlock>(i);
    const std::string h = fmt::format("h.{}.", i);
    put(h + "ln_1.weight", b->ln_1->weight);
    put(h + "ln_1.bias", b->ln_1->bias);
    put(h + "attn.bias", tril(ones({1, 1, m.config.block_size, m.config.block_size})));
    put(h + "attn.c_attn.weight", cat({conv1d(*b->attn->w_q), conv1d(*b->attn->w_k), conv1d(*b->attn->w_v)}, 1));
    put(h + "attn.c_attn.bias",
        cat({b->attn->w_q->bias.detach(), b->attn->w_k->bias.detach(), b->attn->w_v->bias.detach()}, 0));
    put(h + "attn.c_proj.weight", conv1d(*b->attn->w_o));
    put(h + "attn.c_proj.bias", b->attn->w_o->bias);
    put(h + "ln_2.weight", b->ln_2->weight);
    put(h + "ln_2.bias", b->ln_2->bias);
    put(h + "mlp.c_fc.weight", conv1d(*b->mlp->fc));
    put(h + "mlp.c_fc.bias", b->mlp->fc->bias);
    put(h + "mlp.c_proj.weight", conv1d(*b->mlp->proj));
    put(h + "mlp.c_proj.bias", b->mlp->proj->bias);
  }
  put("ln_f.weight", m.ln_f->weight);
  put("ln_f.bias", m.ln_f->bias);
  if (with_head) out.emplace_back("lm_head.weight", m.head->weight.detach().clone());
  return out;
}

}  // namespace

TEST_CASE("GPTConfig: the named configs, GPT-2 124M's shapes and parameter count, validation") {
  for (const std::string& name : GPTConfig::names()) {
    INFO(name);
    GPTConfig c = GPTConfig::named(name, 100);
    CHECK(c.vocab == 100);
    CHECK_NOTHROW(c.validate());
    CHECK(c.d_model % c.heads == 0);
    CHECK(c.ff_dim() == 4 * c.d_model);
  }
  CHECK(GPTConfig::names() == std::vector<std::string>{"tiny", "mini", "small", "medium", "gpt2"});
  GPTConfig tiny = GPTConfig::named("tiny", 10);
  CHECK(tiny.layers == 2);
  CHECK(tiny.heads == 2);
  CHECK(tiny.d_model == 64);
  CHECK(tiny.block_size == 64);
  GPTConfig gpt2 = GPTConfig::named("gpt2", 50257);
  CHECK(gpt2.layers == 12);
  CHECK(gpt2.heads == 12);
  CHECK(gpt2.d_model == 768);
  CHECK(gpt2.block_size == 1024);
  CHECK(gpt2.ff_dim() == 3072);
  CHECK(gpt2.gelu_tanh);
  CHECK(gpt2.ln_eps == 1e-5);
  // GPT-2 124M (tied head): 50257*768 + 1024*768 + 12 * 7087872 + 2*768 (not built here: 500 MB).
  CHECK(expected_parameters(gpt2) == 124439808);
  // The count the formula gives is what a built model has.
  manual_seed(1);
  CHECK(GPT(tiny_config()).num_parameters() == expected_parameters(tiny_config()));
  CHECK(expected_parameters(tiny_config()) == 7168);
  GPTConfig wide = tiny_config();
  wide.d_ff = 24, wide.layers = 3;
  CHECK(GPT(wide).num_parameters() == expected_parameters(wide));
  CHECK(GPT(GPTConfig::named("tiny", 50)).num_parameters() == expected_parameters(GPTConfig::named("tiny", 50)));

  CHECK_THROWS_AS(GPTConfig::named("huge", 10), Error);
  CHECK(error_of([] { GPTConfig::named("huge", 10); }).find("unknown config 'huge'") != std::string::npos);
  auto invalid = [](auto change) {
    GPTConfig c = tiny_config();
    change(c);
    return error_of([&] { c.validate(); });
  };
  CHECK(invalid([](GPTConfig& c) { c.vocab = 0; }).find("vocab") != std::string::npos);
  CHECK(invalid([](GPTConfig& c) { c.block_size = 0; }).find("block_size") != std::string::npos);
  CHECK(invalid([](GPTConfig& c) { c.layers = 0; }).find("layers") != std::string::npos);
  CHECK(invalid([](GPTConfig& c) { c.heads = 3; }).find("not divisible by heads 3") != std::string::npos);
  CHECK(invalid([](GPTConfig& c) { c.heads = 0; }).find("heads") != std::string::npos);
  CHECK(invalid([](GPTConfig& c) { c.d_ff = -1; }).find("d_ff") != std::string::npos);
  CHECK(invalid([](GPTConfig& c) { c.dropout = 1.0; }).find("dropout") != std::string::npos);
  CHECK(invalid([](GPTConfig& c) { c.ln_eps = 0; }).find("ln_eps") != std::string::npos);
  CHECK(invalid([](GPTConfig&) {}).empty());
  GPTConfig bad = tiny_config();
  bad.heads = 3;
  CHECK(error_of([&] { GPT m(bad); }).find("not divisible") != std::string::npos);
}

TEST_CASE("GPT: logits, causality, the loss, the tied head and the parameter groups") {
  manual_seed(2);
  GPT model(tiny_config());
  Generator g(3);
  Tensor ids = randint(0, 20, {2, 10}, kInt64, &g);
  Tensor logits = model.forward(ids);
  CHECK(logits.sizes() == Shape{2, 10, 20});
  CHECK(logits.dtype() == kFloat32);
  CHECK(logits.requires_grad());

  // Causality: changing token 6 leaves the logits of positions 0..5 alone, and changes 6.
  Ids changed = ids.to_vector<int64_t>();
  changed[6] = (changed[6] + 7) % 20;
  changed[10 + 6] = (changed[10 + 6] + 3) % 20;
  Tensor logits2 = model.forward(tensor(changed, {2, 10}));
  CHECK(max_diff(logits2.slice(1, 0, 6), logits.slice(1, 0, 6)) <= 1e-6);
  CHECK(max_diff(logits2.slice(1, 6, 7), logits.slice(1, 6, 7)) > 1e-5);

  // loss = cross_entropy of the forward's logits, ignore_index -100 skipping positions.
  Tensor targets = randint(0, 20, {2, 10}, kInt64, &g);
  CHECK(model.loss(ids, targets).item<double>() ==
        doctest::Approx(cross_entropy(logits.reshape({-1, 20}), targets.reshape({-1})).item<double>()).epsilon(1e-6));
  Ids t = targets.to_vector<int64_t>();
  t[0] = t[5] = t[13] = -100;
  Tensor ignored = tensor(t, {2, 10});
  CHECK(model.loss(ids, ignored).item<double>() ==
        doctest::Approx(cross_entropy(logits.reshape({-1, 20}), ignored.reshape({-1}), 0.0, -100).item<double>())
            .epsilon(1e-6));
  // Near log(vocab) at initialization (N(0, 0.02) weights).
  CHECK(std::fabs(model.loss(ids, targets).item<double>() - std::log(20.0)) < 0.5);
  CHECK_THROWS_AS(model.loss(ids, targets.slice(1, 0, 9)), Error);

  // The positions and a key mask: a left-padded row, its positions counted from its first real
  // token, gives the logits of the unpadded sequence.
  Ids real = {3, 1, 4, 1, 5};
  Tensor padded = tensor(Ids{0, 0, 3, 1, 4, 1, 5}, {1, 7});
  Tensor positions = tensor(Ids{0, 0, 0, 1, 2, 3, 4}, {1, 7});
  Tensor pad_mask = ne(tensor(Ids{1, 1, 0, 0, 0, 0, 0}, {1, 1, 1, 7}), 0.0);
  CHECK(max_diff(model.forward(padded, nullptr, positions, pad_mask).slice(1, 2, 7), model.forward(ids_tensor(real))) <=
        1e-5);

  // Bad input is refused.
  CHECK_THROWS_AS(model.forward(ids.to(kFloat32)), Error);
  Tensor flat = randint(0, 20, {10}, kInt64, &g);
  CHECK_THROWS_AS(model.forward(flat), Error);
  Tensor too_long = randint(0, 20, {1, 17}, kInt64, &g);
  CHECK(error_of([&] { model.forward(too_long); }).find("exceed the context of 16") != std::string::npos);
  Tensor out_of_vocab = tensor(Ids{1, 20}, {1, 2});
  CHECK(error_of([&] { model.forward(out_of_vocab); }).find("token ids must be in [0, 20)") != std::string::npos);
  Tensor negative = tensor(Ids{-1, 2}, {1, 2});
  CHECK_THROWS_AS(model.forward(negative), Error);
  Tensor empty_t = zeros({1, 0}, kInt64);
  CHECK_THROWS_AS(model.forward(empty_t), Error);

  // The head is the token embedding: one tensor.
  CHECK(model.head->weight.impl_ptr() == model.wte->weight.impl_ptr());
  CHECK(model.head->weight.storage() == model.wte->weight.storage());
  CHECK_FALSE(model.head->bias.defined());

  // decay: every matrix (dim >= 2, the embeddings too); no_decay: biases and LayerNorms.
  std::vector<Tensor> decay = model.decay_parameters(), no_decay = model.no_decay_parameters();
  for (const Tensor& p : decay) CHECK(p.dim() >= 2);
  for (const Tensor& p : no_decay) CHECK(p.dim() < 2);
  auto d = identities(decay), n = identities(no_decay), all = identities(model.parameters());
  CHECK(d.size() == decay.size());  // no parameter twice (the tied head)
  CHECK(n.size() == no_decay.size());
  for (const TensorImpl* p : d) CHECK(n.count(p) == 0);
  std::set<const TensorImpl*> both = d;
  both.insert(n.begin(), n.end());
  CHECK(both == all);
  CHECK(decay.size() + no_decay.size() == model.parameters().size());
  CHECK(decay.size() == 2 + 2 * 6);      // wte, wpe; q, k, v, o, fc, proj per layer
  CHECK(no_decay.size() == 2 * 10 + 2);  // 2 LayerNorms and 6 biases per layer; ln_f
  CHECK(d.count(model.wte->weight.impl_ptr().get()) == 1);
}

TEST_CASE("GPT: AdamW steps on one batch lower the loss - the float64 model passes gradcheck") {
  manual_seed(4);
  GPT model(tiny_config());
  Generator g(5);
  Tensor ids = randint(0, 20, {4, 12}, kInt64, &g), targets = randint(0, 20, {4, 12}, kInt64, &g);
  optim::AdamWOptions ao;
  ao.lr = 1e-2;
  optim::AdamW opt(std::vector<optim::ParamGroup>{{model.decay_parameters(), std::nullopt, 0.1},
                                                  {model.no_decay_parameters(), std::nullopt, 0.0}},
                   ao);
  double first = 0, last = 0;
  for (int i = 0; i < 25; ++i) {
    opt.zero_grad();
    Tensor loss = model.loss(ids, targets);
    (i == 0 ? first : last) = loss.item<double>();
    loss.backward();
    opt.step();
  }
  CHECK(std::isfinite(last));
  CHECK(last < 0.6 * first);  // PyTorch's twin of this model gets to about 0.27 of the first loss

  manual_seed(6);
  GPT m64(tiny_config());
  m64.to(kFloat64);
  CHECK(m64.wte->weight.dtype() == kFloat64);
  CHECK(m64.head->weight.impl_ptr() == m64.wte->weight.impl_ptr());
  Tensor x = randint(0, 20, {2, 5}, kInt64, &g), y = randint(0, 20, {2, 5}, kInt64, &g);
  CHECK(m64.loss(x, y).dtype() == kFloat64);
  TensorList params = {m64.wte->weight, m64.wpe->weight, m64.blocks->at<models::GPTBlock>(0)->attn->w_q->weight,
                       m64.blocks->at<models::GPTBlock>(1)->mlp->fc->bias, m64.ln_f->weight};
  CHECK(gradcheck([&](const TensorList&) { return m64.loss(x, y); }, params));
}

TEST_CASE("GPT: the KV cache gives the logits of the full forward, one token or a chunk at a time") {
  manual_seed(7);
  GPT model(tiny_config());
  model.eval();
  NoGradGuard no_grad;
  Generator g(8);
  Tensor ids = randint(0, 20, {2, 12}, kInt64, &g);
  Tensor full = model.forward(ids);
  auto part = [&](int64_t a, int64_t b) { return ids.slice(1, a, b).contiguous(); };

  models::GPTCache one;
  CHECK(one.length() == 0);
  for (int64_t t = 0; t < 12; ++t) {
    INFO("position ", t);
    Tensor step = model.forward(part(t, t + 1), &one);
    REQUIRE(step.sizes() == Shape{2, 1, 20});
    CHECK(max_diff(step, full.slice(1, t, t + 1)) <= 1e-5);
    CHECK(one.length() == t + 1);
  }
  CHECK(one.layers.size() == 2);

  models::GPTCache prefilled;
  CHECK(max_diff(model.forward(part(0, 5), &prefilled), full.slice(1, 0, 5)) <= 1e-5);
  CHECK(prefilled.length() == 5);
  for (int64_t t = 5; t < 12; ++t) {
    INFO("position ", t);
    CHECK(max_diff(model.forward(part(t, t + 1), &prefilled), full.slice(1, t, t + 1)) <= 1e-5);
  }

  // Chunks of several new tokens after cached ones: the causal mask offset by the cache length.
  models::GPTCache chunked;
  const std::vector<std::pair<int64_t, int64_t>> chunks = {{0, 4}, {4, 9}, {9, 10}, {10, 12}};
  for (const auto& ch : chunks) {
    const int64_t a = ch.first, b = ch.second;
    INFO("chunk ", a, "..", b);
    CHECK(max_diff(model.forward(part(a, b), &chunked), full.slice(1, a, b)) <= 1e-5);
  }
  CHECK(chunked.length() == 12);
  // The cache counts toward the context.
  CHECK(error_of([&] { model.forward(part(0, 5), &chunked); }).find("exceed the context") != std::string::npos);
  CHECK(chunked.length() == 12);
  model.forward(part(0, 4), &chunked);
  CHECK(chunked.length() == 16);
}

TEST_CASE("generate: greedy equals the uncached argmax continuation, for each prompt of a left-padded batch") {
  manual_seed(9);
  GPT model(tiny_config());
  model.eval();
  models::SampleOptions o;
  o.greedy = true;
  o.max_new = 8;
  const std::vector<Ids> prompts = {random_ids(3, 20, 1), random_ids(6, 20, 2), random_ids(1, 20, 3),
                                    random_ids(5, 20, 4)};
  std::vector<Ids> alone;
  for (const Ids& p : prompts) {
    std::vector<Ids> out = models::generate(model, {p}, o);
    REQUIRE(out.size() == 1);
    CHECK(out[0].size() == 8);
    CHECK(out[0] == greedy_reference(model, p, 8));
    alone.push_back(out[0]);
  }
  CHECK(models::generate(model, prompts, o) == alone);
  o.pad = 7;  // any pad id: it is masked out
  CHECK(models::generate(model, prompts, o) == alone);

  // on_token sees each row's tokens in order.
  std::vector<Ids> streamed(prompts.size());
  models::generate(model, prompts, o, [&](size_t row, int64_t token) { streamed.at(row).push_back(token); });
  CHECK(streamed == alone);

  // max_new is respected, 0 included; training mode comes back.
  model.train();
  o.max_new = 3;
  for (const Ids& out : models::generate(model, prompts, o)) CHECK(out.size() == 3);
  CHECK(model.is_training());
  o.max_new = 0;
  for (const Ids& out : models::generate(model, prompts, o)) CHECK(out.empty());
  model.eval();

  // eos ends a row (the eos token included); the other rows go on.
  o.max_new = 8;
  const int64_t eos = alone[0][2];
  o.eos = eos;
  std::vector<Ids> stopped = models::generate(model, prompts, o);
  for (size_t r = 0; r < prompts.size(); ++r) {
    INFO("row ", r);
    Ids want = alone[r];
    auto it = std::find(want.begin(), want.end(), eos);
    if (it != want.end()) want.erase(it + 1, want.end());
    CHECK(stopped[r] == want);
  }
  CHECK(stopped[0].size() <= 3);
  o.eos = -1;

  // Past the context (block 16) the window slides: every row gets all the tokens asked for, each
  // from its last 16 tokens, in a batch as alone; a prompt longer than the context keeps its end.
  Ids p14 = random_ids(14, 20, 5), p16 = random_ids(16, 20, 6), p17 = random_ids(17, 20, 7);
  o.max_new = 24;
  const Ids want14 = greedy_reference(model, p14, 24), want16 = greedy_reference(model, p16, 24);
  CHECK(models::generate(model, {p14}, o)[0] == want14);
  CHECK(models::generate(model, {p16}, o)[0] == want16);
  CHECK(models::generate(model, {p16, p14, random_ids(2, 20, 8)}, o) ==
        std::vector<Ids>{want16, want14, greedy_reference(model, random_ids(2, 20, 8), 24)});
  CHECK(models::generate(model, {p17}, o)[0] == greedy_reference(model, p17, 24));
  o.eos = want14[20];  // a row that ends after the window slid
  Ids until_eos(want14.begin(), std::find(want14.begin(), want14.end(), o.eos) + 1);
  CHECK(models::generate(model, {p14}, o)[0] == until_eos);
  o.eos = -1;
  o.max_new = 10;

  // Errors.
  CHECK(error_of([&] { models::generate(model, std::vector<Ids>{}, o); }).find("no prompts") != std::string::npos);
  std::vector<Ids> with_empty = {Ids{1, 2}, Ids{}};
  CHECK(error_of([&] { models::generate(model, with_empty, o); }).find("prompt 1 is empty") != std::string::npos);
  o.max_new = -1;
  CHECK_THROWS_AS(models::generate(model, prompts, o), Error);
  o.max_new = 4;
  Ids bad_token = {3, 25};
  CHECK_THROWS_AS(models::generate(model, {bad_token}, o), Error);
}

TEST_CASE("generate: sampling is seeded") {
  manual_seed(10);
  GPT model(tiny_config());
  const std::vector<Ids> prompts = {random_ids(4, 20, 11), random_ids(2, 20, 12)};
  models::SampleOptions o;
  o.max_new = 12;
  o.seed = 5;
  std::vector<Ids> a = models::generate(model, prompts, o), b = models::generate(model, prompts, o);
  CHECK(a == b);
  for (const Ids& row : a) {
    CHECK(row.size() == 12);
    for (int64_t t : row) CHECK((t >= 0 && t < 20));
  }
  o.seed = 6;
  CHECK(models::generate(model, prompts, o) != a);
  // With top-k and top-p too.
  o.top_k = 5, o.top_p = 0.9, o.temperature = 0.8;
  std::vector<Ids> c = models::generate(model, prompts, o);
  CHECK(c == models::generate(model, prompts, o));
  // The default generator is not used.
  manual_seed(1);
  std::vector<Ids> d = models::generate(model, prompts, o);
  manual_seed(2);
  CHECK(models::generate(model, prompts, o) == d);
}

TEST_CASE("sample_next: greedy, top-k, top-p, temperature") {
  Generator gen(20);
  Tensor logits = randn({3, 20}, {}, &gen);
  const std::vector<double> best = values(argmax(logits, 1, true));
  models::SampleOptions o;
  o.greedy = true;
  Tensor greedy = models::sample_next(logits, o, gen);
  CHECK(greedy.sizes() == Shape{3, 1});
  CHECK(greedy.dtype() == kInt64);
  CHECK(values(greedy) == best);
  o.greedy = false;
  o.top_k = 1;
  for (int i = 0; i < 10; ++i) CHECK(values(models::sample_next(logits, o, gen)) == best);
  o.top_k = 0;
  o.top_p = 1e-6;
  for (int i = 0; i < 10; ++i) CHECK(values(models::sample_next(logits, o, gen)) == best);
  o.top_p = 1.0;
  o.temperature = 1e-6;
  for (int i = 0; i < 10; ++i) CHECK(values(models::sample_next(logits, o, gen)) == best);
  o.temperature = 1.0;
  CHECK(values(models::sample_next(logits.to(kFloat64), o, gen)).size() == 3);  // float64 logits too

  // top_k = 2: only the two largest are ever drawn, and both are.
  Tensor row = tensor({0.0f, 1.0f, 3.0f, 2.9f, -1.0f, 0.5f}, {1, 6});
  o.top_k = 2;
  std::set<int64_t> seen;
  for (int64_t t : models::sample_next(row.expand({400, 6}).contiguous(), o, gen).to_vector<int64_t>()) seen.insert(t);
  CHECK(seen == std::set<int64_t>{2, 3});
  // Without top_k, the others come up too (the rarest has probability 0.008).
  o.top_k = 0;
  seen.clear();
  for (int64_t t : models::sample_next(row.expand({3000, 6}).contiguous(), o, gen).to_vector<int64_t>()) seen.insert(t);
  CHECK(seen.size() == 6);

  // top_p: probabilities 0.6, 0.3, 0.05, 0.05. Mass 0.85 keeps the first two; 0.5 the first.
  Tensor p = tensor(std::vector<float>{std::log(0.3f), std::log(0.05f), std::log(0.6f), std::log(0.05f)}, {1, 4});
  o.top_p = 0.85;
  seen.clear();
  for (int64_t t : models::sample_next(p.expand({400, 4}).contiguous(), o, gen).to_vector<int64_t>()) seen.insert(t);
  CHECK(seen == std::set<int64_t>{0, 2});
  o.top_p = 0.5;
  seen.clear();
  for (int64_t t : models::sample_next(p.expand({100, 4}).contiguous(), o, gen).to_vector<int64_t>()) seen.insert(t);
  CHECK(seen == std::set<int64_t>{2});

  // The same generator state gives the same draws.
  o.top_p = 1.0;
  Generator g1(33), g2(33);
  CHECK(values(models::sample_next(logits, o, g1)) == values(models::sample_next(logits, o, g2)));

  // Errors.
  o = models::SampleOptions{};
  o.temperature = 0;
  CHECK(error_of([&] { models::sample_next(logits, o, gen); }).find("temperature") != std::string::npos);
  o.temperature = -1;
  CHECK_THROWS_AS(models::sample_next(logits, o, gen), Error);
  o.greedy = true;  // greedy ignores the temperature
  CHECK(values(models::sample_next(logits, o, gen)) == best);
  o = models::SampleOptions{};
  o.top_k = -1;
  CHECK_THROWS_AS(models::sample_next(logits, o, gen), Error);
  o.top_k = 0;
  o.top_p = 0;
  CHECK_THROWS_AS(models::sample_next(logits, o, gen), Error);
  o.top_p = 1.5;
  CHECK_THROWS_AS(models::sample_next(logits, o, gen), Error);
  o.top_p = 1;
  Tensor flat = randn({20});
  CHECK_THROWS_AS(models::sample_next(flat, o, gen), Error);
}

TEST_CASE("load_gpt2_hf: a checkpoint in Hugging Face's layout gives the same logits") {
  manual_seed(12);
  GPT original(tiny_config());
  original.eval();
  NoGradGuard no_grad;
  Generator g(13);
  Tensor ids = randint(0, 20, {2, 9}, kInt64, &g);
  Tensor want = original.forward(ids);

  const std::string path = temp_path("gpt2_hf.safetensors");
  nn::NamedTensors state = hf_state(original, "transformer.");
  nn::save_safetensors(path, state);
  std::shared_ptr<GPT> loaded = models::load_gpt2_hf(path, 2);
  REQUIRE(loaded);
  CHECK(loaded->config.vocab == 20);
  CHECK(loaded->config.block_size == 16);
  CHECK(loaded->config.layers == 2);
  CHECK(loaded->config.heads == 2);
  CHECK(loaded->config.d_model == 16);
  CHECK(loaded->config.ff_dim() == 64);
  CHECK(loaded->config.gelu_tanh);
  CHECK(loaded->head->weight.impl_ptr() == loaded->wte->weight.impl_ptr());
  loaded->eval();
  CHECK(max_diff(loaded->forward(ids), want) <= 1e-6);
  // The weights themselves, name by name, exactly.
  nn::NamedTensors want_state = original.state_dict(), got_state = loaded->state_dict();
  REQUIRE(got_state.size() == want_state.size());
  for (size_t i = 0; i < want_state.size(); ++i) {
    const std::string name = want_state[i].first;
    INFO(name);
    CHECK(got_state[i].first == name);
    CHECK(values(got_state[i].second) == values(want_state[i].second));
  }
  // Without the prefix and without lm_head (GPT2Model's layout).
  const std::string bare = temp_path("gpt2_hf_bare.safetensors");
  nn::save_safetensors(bare, hf_state(original, "", false));
  std::shared_ptr<GPT> loaded_bare = models::load_gpt2_hf(bare, 2);
  loaded_bare->eval();
  CHECK(max_diff(loaded_bare->forward(ids), want) <= 1e-6);

  // A missing key is named.
  nn::NamedTensors missing;
  for (auto& [name, t] : state)
    if (name != "transformer.h.1.mlp.c_proj.bias") missing.emplace_back(name, t);
  nn::save_safetensors(path, missing);
  std::string msg = error_of([&] { models::load_gpt2_hf(path, 2); });
  CHECK(msg.find("transformer.h.1.mlp.c_proj.bias") != std::string::npos);
  CHECK(msg.find("missing") != std::string::npos);
  // A Conv1D weight stored as Linear's [out, in] is refused, naming it.
  nn::NamedTensors transposed;
  for (auto& [name, t] : state)
    transposed.emplace_back(name, name == "transformer.h.0.attn.c_attn.weight" ? t.transpose(0, 1).contiguous() : t);
  nn::save_safetensors(path, transposed);
  msg = error_of([&] { models::load_gpt2_hf(path, 2); });
  CHECK(msg.find("transformer.h.0.attn.c_attn.weight") != std::string::npos);
  // Heads that do not divide the width; a file that is not GPT-2 at all.
  nn::save_safetensors(path, state);
  CHECK(error_of([&] { models::load_gpt2_hf(path, 3); }).find("not divisible by heads 3") != std::string::npos);
  nn::save_safetensors(path, nn::NamedTensors{{"weight", ones({2, 2})}});
  CHECK_THROWS_AS(models::load_gpt2_hf(path, 2), Error);
  std::remove(path.c_str());
  std::remove(bare.c_str());
}
