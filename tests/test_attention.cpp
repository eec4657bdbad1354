// The fused scaled_dot_product_attention (ops/cpu/attention.cpp, autograd/ops_attention.cpp)
// against the composite it replaces, softmax(masked_fill(q k^T * scale, mask, -1e9)) v: values
// and the gradients of q, k and v, over masks, causality, shapes that cross the kernel's blocks
// (64 query rows x 128 keys), strided and expanded inputs, dropout with the same seed, float32,
// gradchecks and errors. Then MultiHeadAttention's is_causal and gelu's tanh form.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>

#include "tests/helpers.h"

using namespace tapestry;
using namespace tapestry::testing;

namespace {

// The composite reference, in plain ops: scores, the explicit mask and the causal one set to
// -1e9, softmax, optional dropout of the probabilities, then v.
Tensor reference(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal,
                 std::optional<double> scale = std::nullopt, double p = 0.0, Generator* gen = nullptr) {
  const double s = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  Tensor scores = matmul(q, k.transpose(-1, -2)) * s;
  if (mask.defined()) scores = masked_fill(scores, mask, -1e9);
  if (causal) scores = masked_fill(scores, nn::causal_mask(q.size(-2), k.size(-2)), -1e9);
  Tensor attn = softmax(scores, -1);
  if (p > 0) attn = dropout(attn, p, true, gen);
  return matmul(attn, v);
}

// Builds q, k, v from the leaves (views of them, or the leaves themselves).
using Build = std::function<TensorList(const TensorList&)>;
const Build kIdentity = [](const TensorList& t) { return t; };
using Attend = std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)>;

struct Run {
  Tensor out;
  TensorList grads;  // of the leaves
};

// Fresh leaves copied from `inputs`, through build and attend, then backward with the upstream
// gradient `upstream`.
Run run(const TensorList& inputs, const Build& build, const Attend& attend, const Tensor& upstream) {
  TensorList leaves;
  for (const Tensor& t : inputs) {
    Tensor l = t.detach().clone();
    l.requires_grad_();
    leaves.push_back(l);
  }
  TensorList qkv = build(leaves);
  Tensor out = attend(qkv[0], qkv[1], qkv[2]);
  (out * upstream).sum().backward();
  Run r{out.detach(), {}};
  for (const Tensor& l : leaves) r.grads.push_back(l.grad().defined() ? l.grad() : zeros_like(l));
  return r;
}

// A random upstream gradient shaped as the output [..., Tq, Ev].
Tensor upstream_for(const TensorList& inputs, const Build& build, uint64_t seed = 17) {
  TensorList qkv = build(inputs);
  Shape s = qkv[0].sizes();
  s.back() = qkv[2].size(-1);
  Generator g(seed);
  return randn(s, inputs[0].dtype(), &g);
}

TensorList random_inputs(const Shape& q, const Shape& k, const Shape& v, uint64_t seed, DType dtype = kFloat64) {
  Generator g(seed);
  return {randn(q, dtype, &g), randn(k, dtype, &g), randn(v, dtype, &g)};
}

Attend fused(const Tensor& mask, bool causal, std::optional<double> scale = std::nullopt) {
  return [mask, causal, scale](const Tensor& q, const Tensor& k, const Tensor& v) {
    return scaled_dot_product_attention_masked_out(q, k, v, mask, causal, 0.0, scale);
  };
}

// The fused op equals the composite in float64: the output and every leaf's gradient.
void check_matches_reference(const char* what, const TensorList& inputs, const Build& build, const Tensor& mask,
                             bool causal, std::optional<double> scale = std::nullopt, double tol = 1e-9) {
  INFO(what);
  Tensor g = upstream_for(inputs, build);
  Run a = run(inputs, build, fused(mask, causal, scale), g);
  Run b = run(
      inputs, build,
      [&](const Tensor& q, const Tensor& k, const Tensor& v) { return reference(q, k, v, mask, causal, scale); }, g);
  CHECK(a.out.sizes() == b.out.sizes());
  CHECK(a.out.dtype() == b.out.dtype());
  CHECK(max_diff(a.out, b.out) <= tol);
  for (size_t i = 0; i < inputs.size(); ++i) {
    INFO("the gradient of input ", i);
    CHECK(a.grads[i].sizes() == inputs[i].sizes());
    CHECK(max_diff(a.grads[i], b.grads[i]) <= tol);
  }
}

// The fused op in float32 against itself in float64 (which the test above ties to the composite).
void check_float32(const char* what, const TensorList& inputs64, const Build& build, const Tensor& mask, bool causal,
                   double tol = 1e-5) {
  INFO(what);
  Tensor g = upstream_for(inputs64, build);
  Run a = run(inputs64, build, fused(mask, causal), g);
  TensorList inputs32;
  for (const Tensor& t : inputs64) inputs32.push_back(t.to(kFloat32));
  Run b = run(inputs32, build, fused(mask, causal), g.to(kFloat32));
  CHECK(b.out.dtype() == kFloat32);
  CHECK(max_diff(b.out, a.out) <= tol);
  for (size_t i = 0; i < inputs64.size(); ++i) {
    INFO("the gradient of input ", i);
    CHECK(b.grads[i].dtype() == kFloat32);
    CHECK(max_diff(b.grads[i], a.grads[i]) <= tol);
  }
}

Tensor bool_mask(std::initializer_list<int> bits, const Shape& shape) { return ne(tensor(bits, shape), 0.0); }

Tensor random_mask(const Shape& shape, double p, uint64_t seed) {
  Generator g(seed);
  return lt(rand(shape, {}, &g), p);
}

}  // namespace

TEST_CASE("scaled_dot_product_attention equals the composite: plain, masks, causal, fully masked rows") {
  check_matches_reference("plain [2, 3, 5, 4]", random_inputs({2, 3, 5, 4}, {2, 3, 5, 4}, {2, 3, 5, 4}, 1), kIdentity,
                          Tensor(), false);
  // Key padding [B, 1, 1, Tk]: row 0 pads its last two keys, row 1 its first three (left padding).
  Tensor pad = bool_mask({0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0}, {2, 1, 1, 7});
  check_matches_reference("key padding [2, 1, 1, 7]", random_inputs({2, 3, 5, 4}, {2, 3, 7, 4}, {2, 3, 7, 4}, 2),
                          kIdentity, pad, false);
  Tensor qk_mask = random_mask({5, 7}, 0.3, 3);
  check_matches_reference("mask [Tq, Tk]", random_inputs({2, 3, 5, 4}, {2, 3, 7, 4}, {2, 3, 7, 4}, 4), kIdentity,
                          qk_mask, false);
  check_matches_reference("mask [B, H, Tq, Tk]", random_inputs({2, 3, 5, 4}, {2, 3, 7, 4}, {2, 3, 7, 4}, 5), kIdentity,
                          random_mask({2, 3, 5, 7}, 0.4, 6), false);
  check_matches_reference("is_causal", random_inputs({2, 3, 6, 4}, {2, 3, 6, 4}, {2, 3, 6, 4}, 7), kIdentity, Tensor(),
                          true);
  check_matches_reference("is_causal, Tq < Tk", random_inputs({2, 2, 7, 4}, {2, 2, 11, 4}, {2, 2, 11, 4}, 8), kIdentity,
                          Tensor(), true);
  check_matches_reference("is_causal, Tq > Tk", random_inputs({2, 2, 11, 4}, {2, 2, 7, 4}, {2, 2, 7, 4}, 9), kIdentity,
                          Tensor(), true);
  check_matches_reference("mask and is_causal", random_inputs({2, 3, 5, 4}, {2, 3, 7, 4}, {2, 3, 7, 4}, 10), kIdentity,
                          pad, true);
  check_matches_reference("Tq != Tk (7 vs 11)", random_inputs({2, 3, 7, 4}, {2, 3, 11, 4}, {2, 3, 11, 4}, 11),
                          kIdentity, Tensor(), false);
  check_matches_reference("custom scale", random_inputs({2, 3, 5, 4}, {2, 3, 6, 4}, {2, 3, 6, 4}, 12), kIdentity,
                          Tensor(), true, 0.37);
  check_matches_reference("Ev != E", random_inputs({2, 3, 5, 4}, {2, 3, 6, 4}, {2, 3, 6, 7}, 13), kIdentity,
                          pad.slice(3, 0, 6), false);
  check_matches_reference("3-D inputs", random_inputs({3, 5, 4}, {3, 6, 4}, {3, 6, 5}, 14), kIdentity, Tensor(), true);
  check_matches_reference("3-D inputs with a mask", random_inputs({3, 5, 4}, {3, 6, 4}, {3, 6, 5}, 15), kIdentity,
                          random_mask({3, 1, 6}, 0.3, 16), false);
  check_matches_reference("2-D inputs", random_inputs({5, 4}, {6, 4}, {6, 3}, 17), kIdentity,
                          random_mask({5, 6}, 0.3, 18), true);

  // A fully masked row attends evenly to every key (no NaN), as the composite does.
  Tensor full_row = bool_mask({0, 1, 0, 0, 0, 0, 0,  //
                               0, 0, 0, 0, 0, 0, 0,  //
                               1, 1, 1, 1, 1, 1, 1,  //
                               0, 0, 0, 1, 0, 0, 0,  //
                               0, 0, 0, 0, 0, 0, 1},
                              {5, 7});
  TensorList in = random_inputs({2, 3, 5, 4}, {2, 3, 7, 4}, {2, 3, 7, 4}, 19);
  check_matches_reference("a fully masked row", in, kIdentity, full_row, false);
  Tensor out = scaled_dot_product_attention_masked_out(in[0], in[1], in[2], full_row);
  CHECK(max_diff(out.select(2, 2), mean(in[2], {2})) <= 1e-12);
  // ... with causality too: row 2 stays fully masked, the others keep their earlier keys.
  check_matches_reference("a fully masked row, causal", in, kIdentity, full_row, true);
}

TEST_CASE("scaled_dot_product_attention equals the composite across the kernel's blocks (64 rows x 128 keys)") {
  // 150 query rows (three row blocks, the last partial) against 300 keys (three key blocks):
  // causal, where whole key blocks in a row block's future are skipped.
  TensorList big = random_inputs({1, 2, 150, 16}, {1, 2, 300, 16}, {1, 2, 300, 16}, 20);
  check_matches_reference("Tq 150, Tk 300, causal", big, kIdentity, Tensor(), true);
  check_matches_reference("Tq 150, Tk 300, mask [Tq, Tk]", big, kIdentity, random_mask({150, 300}, 0.2, 21), false);
  // The first 20 keys masked, with causality: rows 0..19 are then fully masked and attend evenly
  // to all 300 keys (every score is -1e9), so no key block may be skipped for them.
  check_matches_reference("Tq 150, Tk 300, key padding and causal", big, kIdentity,
                          lt(arange(300), 20.0).view({1, 1, 1, 300}), true);
  check_matches_reference("Tq = Tk = 200, causal", random_inputs({2, 1, 200, 8}, {2, 1, 200, 8}, {2, 1, 200, 8}, 22),
                          kIdentity, Tensor(), true);
  // Leading keys masked for a whole key block (left padding longer than 128): the online softmax
  // must forget the first block when real keys come.
  Tensor left = lt(arange(300), 200.0).view({1, 1, 1, 300});
  check_matches_reference("the first 200 keys masked", big, kIdentity, left, false);
}

TEST_CASE("scaled_dot_product_attention: strided, offset and expanded inputs") {
  const int64_t B = 2, T = 5, H = 3, K = 4, D = H * K;
  // MultiHeadAttention's split_heads: x.view({B, T, H, K}).transpose(1, 2), rows strided by D.
  Build split_heads = [=](const TensorList& x) {
    TensorList out;
    for (const Tensor& t : x) out.push_back(t.view({B, t.size(1), H, K}).transpose(1, 2));
    return out;
  };
  check_matches_reference("split_heads views", random_inputs({B, T, D}, {B, 7, D}, {B, 7, D}, 30), split_heads,
                          Tensor(), true);
  check_matches_reference("split_heads views, key padding", random_inputs({B, T, D}, {B, 7, D}, {B, 7, D}, 31),
                          split_heads, bool_mask({0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0}, {2, 1, 1, 7}), false);
  // The last dim not unit-stride: q and k stored as [..., E, T] and transposed.
  Build transposed = [](const TensorList& x) {
    return TensorList{x[0].transpose(-1, -2), x[1].transpose(-1, -2), x[2]};
  };
  check_matches_reference("transposed q and k (last dim strided)",
                          random_inputs({2, 3, 4, 5}, {2, 3, 4, 6}, {2, 3, 6, 4}, 32), transposed, Tensor(), true);
  // q, k, v as column thirds of one fused projection [B, T, 3D] (Hugging Face's c_attn): k and v
  // start at an offset into the storage. The extra batch row keeps any misread inside the storage.
  Build fused_qkv = [=](const TensorList& x) {
    TensorList parts = chunk(x[0].slice(0, 0, B), 3, -1);
    return split_heads(TensorList{parts[0], parts[1], parts[2]});
  };
  check_matches_reference("chunks of a fused qkv (offset views)", {randn({B + 1, T, 3 * D}, kFloat64)}, fused_qkv,
                          Tensor(), true);
  // Contiguous views at an offset: batch 1 of stacked tensors.
  Build selected = [](const TensorList& x) {
    return TensorList{x[0].select(0, 1), x[1].select(0, 1), x[2].select(0, 1)};
  };
  check_matches_reference("contiguous views at an offset (select)",
                          random_inputs({3, 2, 3, 5, 4}, {3, 2, 3, 6, 4}, {3, 2, 3, 6, 4}, 33), selected, Tensor(),
                          true);
  // A mask that is itself a view at an offset.
  Tensor mask_storage = random_mask({16, 7}, 0.3, 34);
  check_matches_reference("a mask at an offset", random_inputs({2, 3, 5, 4}, {2, 3, 7, 4}, {2, 3, 7, 4}, 35), kIdentity,
                          mask_storage.slice(0, 3, 8), false);
  // Keys and values shared by every head: expanded with stride 0 over the head dim.
  Build expanded = [](const TensorList& x) {
    return TensorList{x[0], x[1].expand({2, 3, 6, 4}), x[2].expand({2, 3, 6, 5})};
  };
  check_matches_reference("k and v expanded over heads", random_inputs({2, 3, 5, 4}, {2, 1, 6, 4}, {2, 1, 6, 5}, 36),
                          expanded, Tensor(), true);
}

TEST_CASE("scaled_dot_product_attention: k and v expanded over their rows (row stride 0)") {
  // One key and value row repeated for every position: the kernel must not take the row stride
  // of 0 for a packed matrix. The rows come from a bigger tensor so that a misread stays inside
  // its storage (and shows as wrong values).
  Build rows = [](const TensorList& x) {
    return TensorList{x[0], x[1].slice(2, 0, 1).expand({2, 3, 6, 4}), x[2].slice(2, 0, 1).expand({2, 3, 6, 5})};
  };
  check_matches_reference("k and v expanded over Tk", random_inputs({2, 3, 5, 4}, {2, 3, 6, 4}, {2, 3, 6, 5}, 40), rows,
                          Tensor(), false);
}

TEST_CASE("scaled_dot_product_attention in float32 matches float64") {
  check_float32("plain", random_inputs({2, 3, 5, 4}, {2, 3, 7, 4}, {2, 3, 7, 6}, 50), kIdentity, Tensor(), false);
  check_float32("mask and causal", random_inputs({2, 3, 7, 4}, {2, 3, 7, 4}, {2, 3, 7, 4}, 51), kIdentity,
                random_mask({2, 1, 1, 7}, 0.3, 52), true);
  check_float32("across blocks, causal", random_inputs({1, 2, 150, 16}, {1, 2, 300, 16}, {1, 2, 300, 16}, 53),
                kIdentity, Tensor(), true);
  // A fully masked row: every score is -1e9, which float32 cannot tell from -1e9 + log(Tk).
  check_float32("a fully masked row", random_inputs({2, 3, 5, 4}, {2, 3, 7, 4}, {2, 3, 7, 4}, 54), kIdentity,
                bool_mask({0, 0, 0, 0, 0, 0, 0,  //
                           1, 1, 1, 1, 1, 1, 1,  //
                           0, 0, 1, 0, 0, 0, 0,  //
                           0, 0, 0, 0, 0, 0, 0,  //
                           0, 0, 0, 0, 0, 1, 1},
                          {5, 7}),
                false);
}

TEST_CASE("scaled_dot_product_attention: decoding's few query rows (float32's direct path) match float64") {
  // float32 without dropout takes direct loops for up to 8 query rows against up to 128 keys
  // (Note [A few query rows]); float64 takes the block path, which the tests above tie to the
  // composite. The boundaries on both sides, dims below, at and above one 16-lane vector, masks
  // of both shapes, causality, a fully masked row and strided views; backward reads the path's
  // saved row statistics.
  const Tensor none;
  for (int64_t tq : {1, 4, 8, 9})
    for (int64_t tk : {1, 20, 128, 129}) {
      INFO("Tq ", tq, ", Tk ", tk);
      check_float32("plain", random_inputs({3, 2, tq, 32}, {3, 2, tk, 32}, {3, 2, tk, 32}, 60), kIdentity, none,
                    false);
      check_float32("key padding", random_inputs({3, 2, tq, 40}, {3, 2, tk, 40}, {3, 2, tk, 20}, 61), kIdentity,
                    random_mask({3, 1, 1, tk}, 0.3, 62), false);
      check_float32("a full mask", random_inputs({2, 2, tq, 7}, {2, 2, tk, 7}, {2, 2, tk, 64}, 63), kIdentity,
                    random_mask({2, 2, tq, tk}, 0.5, 64), false);
    }
  check_float32("causal, Tq = Tk", random_inputs({2, 3, 6, 16}, {2, 3, 6, 16}, {2, 3, 6, 16}, 65), kIdentity, none,
                true);
  check_float32("causal, Tq < Tk", random_inputs({2, 3, 3, 16}, {2, 3, 9, 16}, {2, 3, 9, 16}, 66), kIdentity, none,
                true);
  check_float32("a fully masked row", random_inputs({2, 1, 2, 16}, {2, 1, 3, 16}, {2, 1, 3, 16}, 67), kIdentity,
                bool_mask({0, 1, 0, 1, 1, 1}, {2, 1, 1, 3}), false);
  // Keys masked at a row's end are skipped (cross-attention over padded sentences), but not when
  // no score rises above the masked value: at scores near -2e10 the weight stays on the masked
  // keys, as in the block path.
  TensorList low = random_inputs({2, 1, 1, 16}, {2, 1, 5, 16}, {2, 1, 5, 16}, 70);
  low[0] = low[0].abs() * 1e5, low[1] = low[1].abs() * -1e5;
  check_float32("trailing masked keys, scores below the masked value", low, kIdentity,
                bool_mask({0, 0, 0, 1, 1, 0, 1, 0, 0, 1}, {2, 1, 1, 5}), false);
  const int64_t B = 4, H = 8, K = 32, D = H * K;  // a decoding step's split_heads views
  Build split_heads = [=](const TensorList& x) {
    TensorList out;
    for (const Tensor& t : x) out.push_back(t.view({B, t.size(1), H, K}).transpose(1, 2));
    return out;
  };
  check_float32("split_heads views, one query row", random_inputs({B, 1, D}, {B, 11, D}, {B, 11, D}, 68), split_heads,
                random_mask({B, 1, 1, 11}, 0.2, 69), false);

  // NaN in one query row makes that row NaN and no other; no key at all gives zeros.
  Tensor q = randn({2, 2, 3, 16}), k = randn({2, 2, 5, 16}), v = randn({2, 2, 5, 16});
  q.select(0, 1).select(0, 0).select(0, 2).select(0, 4).fill_(std::nan(""));
  Tensor out = scaled_dot_product_attention(q, k, v);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t r = 0; r < 3; ++r) {
        const std::vector<double> row = values(out.select(0, b).select(0, h).select(0, r));
        const bool poisoned = b == 1 && h == 0 && r == 2;
        CHECK(std::all_of(row.begin(), row.end(), [&](double x) { return poisoned ? std::isnan(x) : std::isfinite(x); }));
      }
  Tensor q1 = randn({2, 2, 1, 16}).requires_grad_(), k0 = zeros({2, 2, 0, 16}), v0 = zeros({2, 2, 0, 16});
  Tensor out0 = scaled_dot_product_attention(q1, k0, v0);
  CHECK(values(out0) == std::vector<double>(2 * 2 * 16, 0.0));
  out0.sum().backward();
  CHECK(values(q1.grad()) == std::vector<double>(2 * 2 * 16, 0.0));
}

TEST_CASE("scaled_dot_product_attention: dropout equals dropout(softmax(...)) with the same seed") {
  auto check_dropout = [](const char* what, const TensorList& in, const Tensor& mask, bool causal, double p) {
    INFO(what);
    Tensor g = upstream_for(in, kIdentity);
    Generator gen_a(42), gen_b(42);
    Run a = run(
        in, kIdentity,
        [&](const Tensor& q, const Tensor& k, const Tensor& v) {
          return scaled_dot_product_attention_masked_out(q, k, v, mask, causal, p, std::nullopt, &gen_a);
        },
        g);
    Run b = run(
        in, kIdentity,
        [&](const Tensor& q, const Tensor& k, const Tensor& v) {
          return reference(q, k, v, mask, causal, std::nullopt, p, &gen_b);
        },
        g);
    CHECK(max_diff(a.out, b.out) <= 1e-9);
    for (size_t i = 0; i < 3; ++i) {
      INFO("the gradient of input ", i);
      CHECK(max_diff(a.grads[i], b.grads[i]) <= 1e-9);
    }
    // It did drop something: the output differs from the one without dropout.
    Tensor plain = scaled_dot_product_attention_masked_out(in[0], in[1], in[2], mask, causal);
    CHECK(max_diff(a.out, plain) > 1e-3);
    // Each generator gave one draw.
    CHECK(gen_a.engine()() == gen_b.engine()());
  };
  check_dropout("masked", random_inputs({2, 2, 6, 8}, {2, 2, 9, 8}, {2, 2, 9, 8}, 60),
                random_mask({2, 1, 1, 9}, 0.3, 61), false, 0.3);
  check_dropout("causal across blocks", random_inputs({1, 2, 70, 8}, {1, 2, 140, 8}, {1, 2, 140, 4}, 62), Tensor(),
                true, 0.2);
  // Without a generator, both draw from the default one.
  TensorList in = random_inputs({2, 2, 4, 8}, {2, 2, 5, 8}, {2, 2, 5, 8}, 63);
  manual_seed(9);
  Tensor a = scaled_dot_product_attention_masked_out(in[0], in[1], in[2], Tensor(), false, 0.5);
  manual_seed(9);
  Tensor b = reference(in[0], in[1], in[2], Tensor(), false, std::nullopt, 0.5);
  CHECK(max_diff(a, b) <= 1e-12);
  // dropout_p = 0 draws nothing.
  Generator g1(5), g2(5);
  scaled_dot_product_attention_masked_out(in[0], in[1], in[2], Tensor(), false, 0.0, std::nullopt, &g1);
  CHECK(g1.engine()() == g2.engine()());
}

TEST_CASE("scaled_dot_product_attention: gradcheck with causality, a mask and dropout") {
  Generator g(70);
  Tensor q = randn({1, 2, 4, 3}, kFloat64, &g).requires_grad_();
  Tensor k = randn({1, 2, 5, 3}, kFloat64, &g).requires_grad_();
  Tensor v = randn({1, 2, 5, 2}, kFloat64, &g).requires_grad_();
  Tensor k4 = randn({1, 2, 4, 3}, kFloat64, &g).requires_grad_();
  Tensor v4 = randn({1, 2, 4, 2}, kFloat64, &g).requires_grad_();
  CHECK(gradcheck([](const TensorList& x) { return scaled_dot_product_attention_masked_out(x[0], x[1], x[2], Tensor(), true); },
                  {q, k4, v4}));
  CHECK(gradcheck([](const TensorList& x) { return scaled_dot_product_attention_masked_out(x[0], x[1], x[2], Tensor(), true); },
                  {q, k, v}));
  Tensor mask = bool_mask({0, 0, 1, 0, 1, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1, 1}, {1, 1, 4, 5});
  CHECK(gradcheck([mask](const TensorList& x) { return scaled_dot_product_attention_masked_out(x[0], x[1], x[2], mask); },
                  {q, k, v}));
  CHECK(gradcheck(
      [mask](const TensorList& x) { return scaled_dot_product_attention_masked_out(x[0], x[1], x[2], mask, true, 0.0, 0.7); },
      {q, k, v}));
  CHECK(gradcheck(
      [](const TensorList& x) {
        Generator gen(123);  // the same dropout mask on every evaluation
        return scaled_dot_product_attention_masked_out(x[0], x[1], x[2], Tensor(), false, 0.3, std::nullopt, &gen);
      },
      {q, k, v}));
  CHECK(gradcheck(
      [mask](const TensorList& x) {
        Generator gen(124);
        return scaled_dot_product_attention_masked_out(x[0], x[1], x[2], mask, true, 0.25, std::nullopt, &gen);
      },
      {q, k, v}));
  // Non-contiguous inputs.
  Tensor qt = randn({1, 2, 3, 4}, kFloat64, &g).requires_grad_();  // [.., E, Tq]
  CHECK(gradcheck(
      [](const TensorList& x) {
        return scaled_dot_product_attention_masked_out(x[0].transpose(-1, -2), x[1], x[2], Tensor(), true);
      },
      {qt, k4, v4}));
}

TEST_CASE("scaled_dot_product_attention: a computed score equal to -1e9 keeps its gradient (the mask decides, not the value)") {
  // Issue 44: the backward took every score equal to the masked value for a masked one. PyTorch's
  // answer in float64: q.grad 0.19661, k.grad [-0.19661, 0.19661] (p = [1, e] / (1 + e)).
  const double e = std::exp(1.0), p0 = 1 / (1 + e), p1 = e / (1 + e), out = p0 + 2 * p1;
  const double ds0 = p0 * (1 - out), ds1 = p1 * (2 - out);
  Tensor q = tensor({1.0}, {1, 1}, kFloat64).requires_grad_(), k = tensor({-1e9, -1e9 + 1}, {2, 1}, kFloat64).requires_grad_();
  Tensor v = tensor({1.0, 2.0}, {2, 1}, kFloat64).requires_grad_();
  scaled_dot_product_attention(q, k, v, Tensor(), false, 0.0, 1.0).sum().backward();
  check_values(q.grad(), {ds0 * -1e9 + ds1 * (-1e9 + 1)}, 1e-5);  // 0.19661, from terms of 2e8
  check_values(k.grad(), {ds0, ds1}, 1e-9);
  check_values(v.grad(), {p0, p1}, 1e-12);
  // float32: -1e9 + 1 rounds to -1e9, so both scores are -1e9 and the weights are even; both keys
  // still get their gradient, as in PyTorch.
  Tensor q32 = tensor({1.0f}, {1, 1}).requires_grad_(), k32 = tensor({-1e9f, -1e9f}, {2, 1}).requires_grad_();
  Tensor v32 = tensor({1.0f, 2.0f}, {2, 1});
  scaled_dot_product_attention(q32, k32, v32, Tensor(), false, 0.0, 1.0).sum().backward();
  check_values(k32.grad(), {-0.25, 0.25}, 1e-6);
  check_values(q32.grad(), {0.0}, 1e-3);
  // A score masked by the mask still gets none, whatever its value.
  Tensor qm = tensor({1.0}, {1, 1}, kFloat64).requires_grad_(), km = tensor({0.5, -1.0}, {2, 1}, kFloat64).requires_grad_();
  scaled_dot_product_attention(qm, km, v.detach(), tensor({1, 0}, {1, 2}).gt(0.0), false, 0.0, 1.0)
      .sum()
      .backward();
  check_values(km.grad(), {0.0, 0.0}, 1e-12);  // one visible key: its weight is 1, whatever its score
}

TEST_CASE("scaled_dot_product_attention: errors, and empty sizes") {
  Tensor q = randn({2, 5, 4}), k = randn({2, 6, 4}), v = randn({2, 6, 3});
  CHECK(scaled_dot_product_attention(q, k, v).sizes() == Shape{2, 5, 3});
  Tensor k_e = randn({2, 6, 3});
  CHECK_THROWS_AS(scaled_dot_product_attention(q, k_e, v), Error);  // E differs
  Tensor k_b = randn({3, 6, 4}), v_b = randn({3, 6, 3});
  CHECK_THROWS_AS(scaled_dot_product_attention(q, k_b, v_b), Error);  // leading dims differ
  Tensor v_t = randn({2, 7, 3});
  CHECK_THROWS_AS(scaled_dot_product_attention(q, k, v_t), Error);  // v's Tk differs from k's
  Tensor k4 = randn({1, 2, 6, 4});
  CHECK_THROWS_AS(scaled_dot_product_attention(q, k4, v), Error);  // different numbers of dims
  Tensor q1 = randn({4});
  CHECK_THROWS_AS(scaled_dot_product_attention(q1, q1, q1), Error);  // 1-D
  Tensor float_mask = zeros({5, 6});
  CHECK_THROWS_AS(scaled_dot_product_attention(q, k, v, float_mask), Error);
  CHECK(error_of([&] { scaled_dot_product_attention(q, k, v, float_mask); }).find("must be Bool") != std::string::npos);
  Tensor bad_mask = zeros({5, 5}, kBool);
  CHECK_THROWS_AS(scaled_dot_product_attention(q, k, v, bad_mask), Error);
  CHECK(error_of([&] { scaled_dot_product_attention(q, k, v, bad_mask); }).find("does not broadcast") !=
        std::string::npos);
  Tensor batch_mask = zeros({3, 5, 6}, kBool), deep_mask = zeros({1, 2, 5, 6}, kBool);
  CHECK_THROWS_AS(scaled_dot_product_attention(q, k, v, batch_mask), Error);
  CHECK_THROWS_AS(scaled_dot_product_attention(q, k, v, deep_mask), Error);  // more dims than the scores
  Tensor k64 = randn({2, 6, 4}, kFloat64);
  CHECK_THROWS_AS(scaled_dot_product_attention(q, k64, v), Error);  // dtypes differ
  Tensor qi = zeros({2, 5, 4}, kInt64), ki = zeros({2, 6, 4}, kInt64), vi = zeros({2, 6, 3}, kInt64);
  CHECK_THROWS_AS(scaled_dot_product_attention(qi, ki, vi), Error);  // not floating
  CHECK_THROWS_AS(scaled_dot_product_attention(q, k, v, Tensor(), false, 1.0), Error);
  CHECK_THROWS_AS(scaled_dot_product_attention(q, k, v, Tensor(), false, -0.1), Error);
  CHECK(error_of([&] { scaled_dot_product_attention(q, k, v, Tensor(), false, 1.0); }).find("dropout_p") !=
        std::string::npos);

  // Tq = 0: an empty output; k and v get zero gradients.
  Tensor q0 = zeros({2, 3, 0, 4}, kFloat64).requires_grad_();
  Tensor kk = randn({2, 3, 5, 4}, kFloat64).requires_grad_(), vv = randn({2, 3, 5, 6}, kFloat64).requires_grad_();
  Tensor out0 = scaled_dot_product_attention(q0, kk, vv, Tensor(), true);
  CHECK(out0.sizes() == Shape{2, 3, 0, 6});
  out0.sum().backward();
  REQUIRE(kk.grad().defined());
  CHECK(kk.grad().sizes() == kk.sizes());
  CHECK(values(kk.grad()) == std::vector<double>(static_cast<size_t>(kk.numel()), 0.0));
  CHECK(values(vv.grad()) == std::vector<double>(static_cast<size_t>(vv.numel()), 0.0));
  // Tk = 0: nothing to attend to, the output is zeros (and so is q's gradient).
  Tensor qq = randn({2, 3, 5, 4}, kFloat64).requires_grad_();
  Tensor k0 = zeros({2, 3, 0, 4}, kFloat64).requires_grad_(), v0 = zeros({2, 3, 0, 6}, kFloat64).requires_grad_();
  Tensor outk = scaled_dot_product_attention(qq, k0, v0);
  CHECK(outk.sizes() == Shape{2, 3, 5, 6});
  CHECK(values(outk) == std::vector<double>(2 * 3 * 5 * 6, 0.0));
  outk.sum().backward();
  REQUIRE(qq.grad().defined());
  CHECK(values(qq.grad()) == std::vector<double>(2 * 3 * 5 * 4, 0.0));
  // Batch 0.
  Tensor qb = zeros({0, 3, 5, 4}), kb = zeros({0, 3, 6, 4}), vb = zeros({0, 3, 6, 2});
  CHECK(scaled_dot_product_attention(qb, kb, vb, Tensor(), true).sizes() == Shape{0, 3, 5, 2});
  Tensor pad0 = zeros({0, 1, 1, 6}, kBool);
  CHECK(scaled_dot_product_attention(qb, kb, vb, pad0).sizes() == Shape{0, 3, 5, 2});
}

TEST_CASE("scaled_dot_product_attention's mask means where to attend, as PyTorch's - _masked_out the opposite") {
  manual_seed(83);
  Tensor q = randn({2, 2, 4, 3}, kFloat64).requires_grad_(), k = randn({2, 2, 5, 3}, kFloat64).requires_grad_(),
         v = randn({2, 2, 5, 2}, kFloat64).requires_grad_();
  // Key 1 of batch 0 and keys 3, 4 of batch 1 may not be attended to.
  Tensor attend = tensor({1, 0, 1, 1, 1, 1, 1, 1, 0, 0}, {2, 1, 1, 5}).gt(0.0);
  Tensor out = scaled_dot_product_attention(q, k, v, attend);
  // PyTorch 2's definition, written out: masked scores -inf before the softmax.
  Tensor scores = matmul(q, k.transpose(-1, -2)) * (1.0 / std::sqrt(3.0));
  Tensor want = matmul(softmax(masked_fill(scores, logical_not(attend), -INFINITY), -1), v);
  CHECK(max_diff(out, want) < 1e-12);
  CHECK(max_diff(out, scaled_dot_product_attention_masked_out(q, k, v, logical_not(attend))) == 0);
  // With causality and a mask together, and through the backward.
  Tensor g = randn({2, 2, 4, 2}, kFloat64);
  sum(mul(scaled_dot_product_attention(q, k, v, attend, true), g)).backward();
  const Tensor dq = q.grad().clone(), dk = k.grad().clone();
  q.zero_grad(), k.zero_grad(), v.zero_grad();
  sum(mul(scaled_dot_product_attention_masked_out(q, k, v, logical_not(attend), true), g)).backward();
  CHECK(max_diff(dq, q.grad()) == 0);
  CHECK(max_diff(dk, k.grad()) == 0);
  CHECK(gradcheck([&](const TensorList& in) { return scaled_dot_product_attention(in[0], in[1], in[2], attend); },
                  {q.detach().requires_grad_(), k.detach().requires_grad_(), v.detach().requires_grad_()}));
  // nn::MultiHeadAttention keeps torch.nn.MultiheadAttention's meaning: true = masked out.
  nn::MultiHeadAttention mha(6, 2);
  Tensor x = randn({2, 5, 6});
  Tensor pad = logical_not(attend);
  Tensor y = mha.forward(x, x, x, pad);
  Tensor y2 = mha.forward(x, x, x, logical_not(pad).logical_not());
  CHECK(max_diff(y, y2) == 0);
  Tensor seen;
  mha.set_attention_hook([&seen](const Tensor& w) { seen = w; });
  mha.forward(x, x, x, pad);
  CHECK(sum(seen.select(0, 0).select(-1, 1)).item<float>() == 0.0f);  // batch 0 never looks at key 1
  // A float mask is refused with PyTorch's meaning spelled out.
  CHECK(error_of([&] { scaled_dot_product_attention(q, k, v, zeros({4, 5})); }).find("true where a query may attend") !=
        std::string::npos);
}

TEST_CASE("MultiHeadAttention: is_causal equals the causal mask - the attention hook sees the weights") {
  CHECK(nn::causal_mask(3, 5).to_vector<bool>() == std::vector<bool>{false, true, true, true, true, false, false, true,
                                                                     true, true, false, false, false, true, true});
  CHECK(nn::causal_mask(3, 5).dtype() == kBool);
  manual_seed(80);
  nn::MultiHeadAttention mha(16, 4);
  const int64_t T = 6;
  Tensor x = randn({2, T, 16}, {}, nullptr);
  Tensor xa = x.clone().requires_grad_(), xb = x.clone().requires_grad_();
  Tensor seen;
  mha.set_attention_hook([&seen](const Tensor& w) { seen = w; });
  Tensor a = mha.forward(xa, xa, xa, Tensor(), nullptr, false, true);
  Tensor wa = seen;
  Tensor b = mha.forward(xb, xb, xb, nn::causal_mask(T, T));
  Tensor wb = seen;
  CHECK(max_diff(a, b) <= 1e-6);
  Tensor g = randn({2, T, 16});
  (a * g).sum().backward();
  (b * g).sum().backward();
  CHECK(max_diff(xa.grad(), xb.grad()) <= 1e-5);
  // The weights: [B, H, T, T], rows summing to 1, nothing above the diagonal.
  REQUIRE(wa.sizes() == Shape{2, 4, T, T});
  CHECK(max_diff(wa, wb) <= 1e-6);
  check_values(sum(wa, {-1}), std::vector<double>(2 * 4 * T, 1.0), 1e-5);
  CHECK(sum(masked_fill(wa, logical_not(nn::causal_mask(T, T)), 0.0)).item<double>() == 0.0);
  CHECK_FALSE(wa.requires_grad());
  // With a key padding mask as well: the padded keys get no weight either.
  Tensor pad = bool_mask({0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0}, {2, 1, 1, T});
  Tensor c = mha.forward(x, x, x, pad, nullptr, false, true);
  Tensor d = mha.forward(x, x, x, logical_or(pad, nn::causal_mask(T, T)));
  CHECK(max_diff(c, d) <= 1e-6);
  // Float64 agrees with the unfused composite as well.
  mha.to(kFloat64);
  Tensor x64 = x.to(kFloat64);
  Tensor e = mha.forward(x64, x64, x64, Tensor(), nullptr, false, true);
  {
    NoGradGuard no_grad;
    auto heads = [&](const Tensor& t) { return t.view({2, T, 4, 4}).transpose(1, 2); };
    Tensor q = heads(mha.w_q->forward(x64)), k = heads(mha.w_k->forward(x64)), v = heads(mha.w_v->forward(x64));
    Tensor ctx = reference(q, k, v, Tensor(), true).transpose(1, 2).reshape({2, T, 16});
    CHECK(max_diff(e, mha.w_o->forward(ctx)) <= 1e-10);
  }
  // A cache: one query sees every cached key; several new queries against more keys are refused.
  nn::KVCache cache;
  Tensor prefix = x64.slice(1, 0, 3).contiguous(), one = x64.slice(1, 3, 4).contiguous();
  Tensor p_out = mha.forward(prefix, prefix, prefix, Tensor(), &cache, false, true);
  Tensor o_out = mha.forward(one, one, one, Tensor(), &cache, false, true);
  CHECK(max_diff(cat({p_out, o_out}, 1), e.slice(1, 0, 4)) <= 1e-10);
  Tensor two = x64.slice(1, 4, 6).contiguous();
  CHECK(error_of([&] { mha.forward(two, two, two, Tensor(), &cache, false, true); }).find("is_causal") !=
        std::string::npos);
}

TEST_CASE("gelu(approximate = \"tanh\"): GPT-2's formula, gradcheck, errors") {
  const std::vector<double> xs = {-4.0, -2.5, -1.0, -0.3, 0.0, 0.2, 0.9, 1.7, 3.0, 6.0};
  Tensor x = tensor(xs, {static_cast<int64_t>(xs.size())}, kFloat64);
  std::vector<double> want;
  const double c = std::sqrt(2.0 / std::acos(-1.0));
  for (double v : xs) want.push_back(0.5 * v * (1.0 + std::tanh(c * (v + 0.044715 * v * v * v))));
  check_values(gelu(x, "tanh"), want, 1e-12);
  check_values(gelu(x.to(kFloat32), "tanh"), want, 1e-6);
  // Close to, but not the same as, the exact erf form.
  CHECK(max_diff(gelu(x, "tanh"), gelu(x)) < 1e-3);
  CHECK(max_diff(gelu(x, "tanh"), gelu(x, "none")) > 1e-6);
  Tensor a = randn({3, 4}, kFloat64).requires_grad_();
  CHECK(gradcheck([](const TensorList& in) { return gelu(in[0], "tanh"); }, {a}));
  Tensor at = randn({4, 3}, kFloat64).requires_grad_();
  CHECK(gradcheck([](const TensorList& in) { return gelu(in[0].transpose(0, 1), "tanh"); }, {at}));
  CHECK_THROWS_AS(gelu(x, "foo"), Error);
  CHECK(error_of([&] { gelu(x, "foo"); }).find("'foo'") != std::string::npos);
}
