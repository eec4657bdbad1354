// nn/: the encoder block every encoder in the zoo shares (TransformerEncoderLayer and
// TransformerEncoder, PyTorch's names), the activation modules, Functional, Module::apply and
// nn::init.
#include <algorithm>
#include <cmath>
#include <set>

#include "tapestry/models/transformer.h"
#include "tapestry/nn/init.h"
#include "tapestry/nn/layers.h"
#include "tests/helpers.h"

using namespace tapestry;
using namespace tapestry::testing;

namespace {
nn::TransformerEncoderLayerOptions small_layer(bool norm_first, const std::string& act) {
  nn::TransformerEncoderLayerOptions o(8, 2);
  o.batch_first = true;
  o.dim_feedforward = 12, o.dropout = 0.0, o.norm_first = norm_first, o.activation = act;
  return o;
}

std::vector<std::string> names_of(const nn::Module& m) {
  std::vector<std::string> names;
  for (auto& [name, t] : m.named_parameters()) names.push_back(name);
  return names;
}
}  // namespace

TEST_CASE("TransformerEncoder: PyTorch's names, post- and pre-norm, masks, gradients of every parameter") {
  for (bool norm_first : {true, false}) {
  CAPTURE(norm_first);
  manual_seed(1);
  nn::TransformerEncoder enc(small_layer(norm_first, norm_first ? "gelu" : "relu"), 2, /*final_norm=*/norm_first);
  const auto names = names_of(enc);
  CHECK(names.front() == "layers.0.self_attn.w_q.weight");
  const size_t stack = names.size() - (norm_first ? 2 : 0);  // without the final norm
  CHECK(names.back() == (norm_first ? "norm.bias" : "layers.1.norm2.bias"));
  CHECK(std::count_if(names.begin(), names.end(), [](const std::string& n) { return n.rfind("layers.1.", 0) == 0; }) ==
        static_cast<long>(stack / 2));
  enc.to(kFloat64);
  Tensor x = randn({2, 3, 8}, kFloat64);
  Tensor pad = tensor(std::vector<int64_t>{0, 0, 1, 0, 0, 0}, {2, 1, 1, 3}).to(DType::Bool);
  for (bool causal : {false, true}) {
    Tensor y = enc.forward(x, pad, causal);
    CHECK(y.sizes() == Shape{2, 3, 8});
    // The input and every parameter, in float64 against finite differences.
    TensorList inputs = {x.detach().requires_grad_()};
    for (Tensor& p : enc.parameters()) inputs.push_back(p);
    CHECK(gradcheck(
        [&](const TensorList& in) {
          return enc.forward(in[0], pad, causal);
        },
        inputs));
  }
  // A masked-out key changes nothing: replacing it gives the same output for the other rows.
  Tensor x2 = x.clone();
  x2.select(0, 0).select(0, 2).fill_(7.0);
  CHECK(max_diff(enc.forward(x, pad).select(0, 0), enc.forward(x2, pad).select(0, 0).detach()) > 0);  // its own row moves
  Tensor y1 = enc.forward(x, pad).select(0, 0).narrow(0, 0, 2), y2 = enc.forward(x2, pad).select(0, 0).narrow(0, 0, 2);
  CHECK(max_diff(y1, y2) < 1e-12);
  }
}

TEST_CASE("TransformerEncoderLayer: batch_first is PyTorch's, false by default: [T, B, D] in and out") {
  CHECK_FALSE(nn::TransformerEncoderLayerOptions(8, 2).batch_first);
  nn::TransformerEncoderLayerOptions seq_first = small_layer(false, "relu"), batch_first = seq_first;
  seq_first.batch_first = false;
  manual_seed(3);
  nn::TransformerEncoder a(seq_first, 2);
  manual_seed(3);
  nn::TransformerEncoder b(batch_first, 2);
  a.to(kFloat64), b.to(kFloat64);
  a.eval(), b.eval();  // no dropout
  Tensor x = randn({2, 3, 8}, kFloat64);  // [B, T, D]
  Tensor pad = tensor(std::vector<int64_t>{0, 0, 1, 0, 0, 0}, {2, 1, 1, 3}).to(DType::Bool);
  for (bool causal : {false, true}) {
    Tensor want = b.forward(x, pad, causal);
    Tensor got = a.forward(x.transpose(0, 1), pad, causal);  // [T, B, D], as torch's default
    CHECK(got.sizes() == Shape{3, 2, 8});
    CHECK(max_diff(got.transpose(0, 1), want) < 1e-12);
  }
  // Gradients flow through the layout change.
  a.train();
  Tensor xs = randn({3, 2, 8}, kFloat64).requires_grad_();
  CHECK(gradcheck([&](const TensorList& in) { return a.forward(in[0], pad); }, {xs}));
  CHECK(error_of([&] { a.forward(randn({3, 8}, kFloat64)); }).find("[T, B, D]") != std::string::npos);
}

TEST_CASE("TransformerEncoder in eval mode skips padded rows: each sentence as alone, zeros at padding, gradients") {
  for (bool norm_first : {false, true}) {
    CAPTURE(norm_first);
    manual_seed(4);
    nn::TransformerEncoder enc(small_layer(norm_first, "relu"), 2);
    enc.to(kFloat64);
    enc.eval();
    const std::vector<int64_t> lens = {3, 1, 4};  // T = 4: two sentences padded (Note [Packed rows])
    const int64_t B = 3, T = 4;
    std::vector<int64_t> masked;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) masked.push_back(t >= lens[b]);
    Tensor pad = tensor(masked, {B, 1, 1, T}).to(DType::Bool);
    Tensor x = randn({B, T, 8}, kFloat64);
    Tensor y = enc.forward(x, pad);
    for (int64_t b = 0; b < B; ++b) {
      CAPTURE(b);
      // Alone and unpadded, no row is skipped: the plain path.
      Tensor alone = enc.forward(x.narrow(0, b, 1).narrow(1, 0, lens[b]), zeros({1, 1, 1, lens[b]}, DType::Bool));
      CHECK(max_diff(y.narrow(0, b, 1).narrow(1, 0, lens[b]), alone) < 1e-12);
      if (lens[b] < T) {
        Tensor padded = y.narrow(0, b, 1).narrow(1, lens[b], T - lens[b]);
        CHECK(max_diff(padded, zeros_like(padded)) == 0.0);
      }
    }
    // Eval mode may record gradients through the skipped rows: input and every parameter.
    TensorList inputs = {x.detach().requires_grad_()};
    for (Tensor& p : enc.parameters()) inputs.push_back(p);
    CHECK(gradcheck([&](const TensorList& in) { return enc.forward(in[0], pad); }, inputs));
    // A sentence that is all padding turns packing off (its evenly spread attention is still
    // read downstream): the output is then the plain path's, as in training mode.
    Tensor empty_row = tensor(std::vector<int64_t>{0, 0, 1, 1, 1, 1}, {2, 1, 1, 3}).to(DType::Bool);
    Tensor x2 = randn({2, 3, 8}, kFloat64);
    Tensor eval_out = enc.forward(x2, empty_row);
    enc.train();  // dropout is 0: the same function, never packed
    CHECK(max_diff(eval_out, enc.forward(x2, empty_row)) < 1e-12);
    Tensor padded_row = eval_out.select(0, 0).select(0, 2);
    CHECK(max_diff(padded_row, zeros_like(padded_row)) > 0);  // the padded row was computed
  }
}

TEST_CASE("The translation Transformer's encoder is nn::TransformerEncoderLayer with its config") {
  models::TransformerConfig c = models::TransformerConfig::named("tiny", 11, 11);
  c.pre_norm = true;
  models::Transformer t(c);
  auto layer = t.encoder_layers->at<nn::TransformerEncoderLayer>(0);
  REQUIRE(layer != nullptr);
  CHECK(layer->norm_first);
  CHECK(layer->ff->activation == "relu");
  CHECK(layer->ff->w_1->weight.sizes() == Shape{c.d_ff, c.d_model});
}

TEST_CASE("TransformerEncoderLayer: bad options are Errors naming them") {
  nn::TransformerEncoderLayerOptions o(8, 3);  // 8 is not divisible by 3 heads
  CHECK(error_of([&] { nn::TransformerEncoderLayer layer(o); }).find("3") != std::string::npos);
  o = small_layer(false, "swish");
  const std::string e = error_of([&] { nn::TransformerEncoderLayer layer(o); });
  CHECK(e.find("unknown activation 'swish'") != std::string::npos);
  CHECK(e.find("silu") != std::string::npos);
  CHECK(!error_of([] { nn::TransformerEncoder enc(small_layer(false, "relu"), -1); }).empty());
}

TEST_CASE("Activation modules and Functional make an MLP in Sequential") {
  manual_seed(2);
  nn::Sequential mlp;
  mlp.add(std::make_shared<nn::Linear>(4, 6))
      .add(std::make_shared<nn::GELU>())
      .add(std::make_shared<nn::Linear>(6, 6))
      .add(std::make_shared<nn::SiLU>())
      .add(std::make_shared<nn::Linear>(6, 6))
      .add(std::make_shared<nn::ReLU>())
      .add(std::make_shared<nn::Tanh>())
      .add(std::make_shared<nn::Functional>([](const Tensor& x) { return x.sum({-1}); }));
  Tensor x = randn({3, 4});
  CHECK(mlp.forward(x).sizes() == Shape{3});
  Tensor v = tensor(std::vector<double>{-2, -0.5, 0, 0.5, 3}, {5}, kFloat64);
  CHECK(max_diff(nn::SiLU().forward(v), v * sigmoid(v)) == 0);
  CHECK(max_diff(nn::GELU("tanh").forward(v), gelu(v, "tanh")) == 0);
  CHECK(max_diff(nn::ReLU().forward(v), relu(v)) == 0);
  CHECK(max_diff(nn::activation("gelu_tanh", v), gelu(v, "tanh")) == 0);
  CHECK(gradcheck([](const TensorList& in) { return nn::activation("silu", in[0]); },
                  {tensor(std::vector<double>{-3, -0.1, 0.2, 4}, {4}, kFloat64).requires_grad_()}));
}

TEST_CASE("Module::apply visits children before parents, a shared module once") {
  models::TransformerConfig c = models::TransformerConfig::named("tiny", 11, 11);
  c.share_embeddings = true;
  models::Transformer t(c);
  std::vector<const nn::Module*> order;
  t.apply([&](nn::Module& m) { order.push_back(&m); });
  CHECK(order.back() == &t);
  CHECK(std::set<const nn::Module*>(order.begin(), order.end()).size() == order.size());
  CHECK(std::count(order.begin(), order.end(), static_cast<const nn::Module*>(t.src_embed.get())) == 1);
  // Initialise every Linear's bias to zero, as a user's init function would.
  t.apply([](nn::Module& m) {
    if (auto* lin = dynamic_cast<nn::Linear*>(&m); lin && lin->bias.defined()) nn::init::zeros_(lin->bias);
  });
  auto layer = t.encoder_layers->at<nn::TransformerEncoderLayer>(0);
  CHECK(layer->ff->w_1->bias.abs().sum().item<double>() == 0);
  CHECK(layer->ff->w_1->bias.requires_grad());
}

TEST_CASE("nn::init: bounds, spreads and fans as torch.nn.init's") {
  manual_seed(3);
  Tensor w = empty({300, 200});
  nn::init::xavier_uniform_(w);
  const double xb = std::sqrt(6.0 / 500.0);
  CHECK(max(w.abs()).item<double>() <= xb * (1 + 1e-6));  // float32 rounding of a draw near the bound
  CHECK(max(w.abs()).item<double>() > 0.99 * xb);
  nn::init::xavier_normal_(w, 2.0);
  CHECK(std::abs(w.pow(2.0).mean().item<double>() / (4.0 * 2.0 / 500.0) - 1.0) < 0.05);
  nn::init::kaiming_uniform_(w, 0.0, "fan_in", "relu");  // bound sqrt(3) * sqrt(2) / sqrt(200)
  const double kb = std::sqrt(3.0) * std::sqrt(2.0) / std::sqrt(200.0);
  CHECK(max(w.abs()).item<double>() <= kb * (1 + 1e-6));
  CHECK(max(w.abs()).item<double>() > 0.99 * kb);
  nn::init::kaiming_normal_(w, 0.0, "fan_out", "relu");  // std sqrt(2 / 300)
  CHECK(std::abs(w.pow(2.0).mean().item<double>() / (2.0 / 300.0) - 1.0) < 0.05);
  nn::init::trunc_normal_(w, 0.0, 0.02, -0.04, 0.04);
  CHECK(max(w.abs()).item<double>() <= 0.04);
  CHECK(std::abs(w.mean().item<double>()) < 1e-3);
  nn::init::normal_(w, 1.0, 0.0);
  CHECK(w.eq(1.0).to(kFloat32).mean().item<double>() == 1.0);
  nn::init::ones_(w);
  CHECK(w.sum().item<double>() == 60000);
  // Convolution-shaped weights count the receptive field.
  auto f = nn::init::fans(empty({8, 4, 3, 3}), "fans");
  CHECK(f.fan_in == 36);
  CHECK(f.fan_out == 72);
  CHECK(nn::init::calculate_gain("leaky_relu", 0.2) == doctest::Approx(std::sqrt(2.0 / 1.04)));
  // Errors name the function and the problem.
  CHECK(error_of([] { nn::init::xavier_uniform_(empty({5})); }).find("xavier_uniform_: fan in and fan out need") !=
        std::string::npos);
  CHECK(error_of([] { nn::init::kaiming_uniform_(empty({3, 3}), 0, "fan_middle"); }).find("fan_in or fan_out") !=
        std::string::npos);
  CHECK(error_of([] { nn::init::normal_(zeros({2}, DType::Int64)); }).find("floating-point") != std::string::npos);
  CHECK(error_of([] { nn::init::calculate_gain("swish"); }).find("unknown nonlinearity 'swish'") != std::string::npos);
  // In place on a parameter that requires grad, recording nothing.
  Tensor p = empty({4, 4}).requires_grad_();
  nn::init::xavier_uniform_(p);
  CHECK(p.is_leaf());
  CHECK(p.requires_grad());
}
