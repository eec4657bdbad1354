// The encoder-only text model: BERT's masking (rates, specials, labels, seeds), shapes, padding
// that changes nothing, the tied MLM head, gradcheck, and a small-data run whose loss falls.
#include <set>

#include "tests/helpers.h"

using namespace tapestry;
using namespace tapestry::testing;

TEST_CASE("mask_tokens: BERT's 15% with 80/10/10, never a special token, labels only where chosen") {
  // 200 sequences of 100: [CLS]=2, 98 ordinary tokens in [5, 50), [SEP]=3.
  const int64_t B = 200, T = 100, vocab = 50, mask_id = 4;
  Generator g(1);
  Tensor ids = randint(5, vocab, {B, T}, kInt64, &g);
  ids.select(1, 0).fill_(2);
  ids.select(1, T - 1).fill_(3);
  Generator m1(9), m2(9);
  models::MaskedTokens m = models::mask_tokens(ids, mask_id, vocab, 5, {0, 1, 2, 3, 4}, m1);
  CHECK(values(m.ids) == values(models::mask_tokens(ids, mask_id, vocab, 5, {0, 1, 2, 3, 4}, m2).ids));
  std::vector<int64_t> orig = ids.to_vector<int64_t>(), in = m.ids.to_vector<int64_t>(), lab = m.labels.to_vector<int64_t>();
  int64_t chosen = 0, masked = 0, random = 0, kept = 0;
  for (size_t i = 0; i < orig.size(); ++i) {
    const int64_t t = static_cast<int64_t>(i) % T;
    if (t == 0 || t == T - 1) {  // specials: never chosen, never changed
      CHECK(lab[i] == -100);
      CHECK(in[i] == orig[i]);
      continue;
    }
    if (lab[i] == -100) {
      CHECK(in[i] == orig[i]);
      continue;
    }
    ++chosen;
    CHECK(lab[i] == orig[i]);
    if (in[i] == mask_id) ++masked;
    else if (in[i] == orig[i]) ++kept;
    else ++random;
    CHECK((in[i] == mask_id || (in[i] >= 5 && in[i] < vocab)));
  }
  const double n = static_cast<double>(B * (T - 2));
  CHECK(chosen / n == doctest::Approx(0.15).epsilon(0.1));  // 2940 expected, sd ~50
  CHECK(masked / static_cast<double>(chosen) == doctest::Approx(0.8).epsilon(0.05));
  // A random token equals the original 1 time in 45, counted as kept: 10% + 10%/45 against 10% - 10%/45.
  CHECK(random / static_cast<double>(chosen) == doctest::Approx(0.1 * 44 / 45).epsilon(0.25));
  CHECK(kept / static_cast<double>(chosen) == doctest::Approx(0.1 + 0.1 / 45).epsilon(0.25));

  // A short sequence still gets one target; one of specials only gets none.
  Tensor shortseq = tensor({2, 7, 3, 0, 2, 3, 0, 0}, {2, 4});
  Generator m3(3);
  models::MaskedTokens s = models::mask_tokens(shortseq, mask_id, vocab, 5, {0, 1, 2, 3, 4}, m3, 0.01);
  CHECK(values(s.labels) == std::vector<double>{-100, 7, -100, -100, -100, -100, -100, -100});
  CHECK(error_of([&] { models::mask_tokens(shortseq, 4, vocab, 5, {}, m3, 0.0); }) ==
        "mask_tokens: prob must be in (0, 1], got 0");
  CHECK(error_of([&] { models::mask_tokens(shortseq.reshape({8}), 4, vocab, 5, {}, m3); }) ==
        "mask_tokens: expected int64 ids [B, T], got int64 [8]");
}

TEST_CASE("Bert: shapes, padding changes nothing, the MLM head is tied, gradcheck") {
  manual_seed(2);
  models::BertConfig c = models::BertConfig::named("tiny", 20);
  c.max_len = 8, c.classes = 3, c.dropout = 0.0, c.d_model = 8, c.heads = 2, c.d_ff = 16, c.layers = 1;
  for (bool pre : {true, false}) {
    c.norm_first = pre;
    models::Bert bert(c);
    Tensor ids = tensor({2, 7, 9, 3}, {1, 4}), padded = tensor({2, 7, 9, 3, 0, 0}, {1, 6});
    Tensor h = bert.encode(ids), hp = bert.encode(padded);
    CHECK(h.sizes() == Shape{1, 4, 8});
    CHECK(max_diff(hp.slice(1, 0, 4), h) < 1e-5);  // padding is never attended to
    CHECK(max_diff(bert.classify(padded), bert.classify(ids)) < 1e-5);
    CHECK(bert.mlm_logits(h).sizes() == Shape{1, 4, 20});
    CHECK(bert.classify(ids).sizes() == Shape{1, 3});
    CHECK(error_of([&] { bert.encode(zeros({1, 9}, kInt64)); }) == "Bert: 9 positions exceed max_len 8; truncate the input");
  }
  models::Bert bert(c);
  bool has_decoder = false;
  for (auto& [name, t] : bert.named_parameters()) has_decoder = has_decoder || name.find("decoder") != std::string::npos;
  CHECK(!has_decoder);  // the MLM output matrix is the token embedding itself
  bert.to(kFloat64);
  Tensor ids = tensor({2, 7, 4, 3, 0, 2, 5, 6, 11, 3}, {2, 5}), labels = tensor({-100, 8, 4, -100, -100, -100, 5, -100, -100, -100}, {2, 5});
  Tensor y = tensor({1, 2});
  CHECK(gradcheck([&](const TensorList&) { return bert.mlm_loss(ids, labels) + bert.class_loss(ids, y); },
                  bert.parameters()));
  CHECK(error_of([] { models::BertConfig::named("huge", 10); }) ==
        "BertConfig: unknown config 'huge' (expected one of tiny, mini, small)");
}

TEST_CASE("Bert: a small-data run's classification loss falls") {
  // Class 1 when the sequence holds token 9, else class 0.
  manual_seed(4);
  models::BertConfig c = models::BertConfig::named("tiny", 16);
  c.max_len = 8, c.dropout = 0.0;
  models::Bert bert(c);
  Generator g(2);
  Tensor ids = randint(5, 16, {48, 6}, kInt64, &g);
  ids.select(1, 0).fill_(2);
  Tensor labels = gt(eq(ids, 9.0).to(kFloat32).sum(std::vector<int64_t>{1}), 0.0).to(kInt64);
  const std::pair<double, double> losses = first_and_last_loss(bert.parameters(), [&] { return bert.class_loss(ids, labels); }, 80);
  const double first = losses.first, last = losses.second;
  INFO("loss ", first, " -> ", last);
  CHECK(last < 0.3 * first);
}
