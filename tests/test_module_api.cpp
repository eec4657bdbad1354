// What a model writer uses beyond the layers: weight tying, Module::to(dtype) for whole-model
// gradchecks, load_state_dict(strict = false), errors that name the layer, and the custom
// autograd function API (record() + SavedTensor).
#include "examples/swish.h"
#include "tests/helpers.h"

using namespace tapestry;
using namespace tapestry::testing;

namespace {

// An embedding and an output projection sharing one matrix, as a language model ties them.
struct TiedLM : nn::Module {
  TiedLM(int64_t vocab, int64_t dim) {
    embed = register_module("embed", std::make_shared<nn::Embedding>(vocab, dim));
    out = register_module("out", std::make_shared<nn::Linear>(dim, vocab, false));
    out->tie_parameter("weight", embed->weight);
  }
  Tensor logits(const Tensor& ids) const { return out->forward(embed->forward(ids)); }
  std::shared_ptr<nn::Embedding> embed;
  std::shared_ptr<nn::Linear> out;
};

// A module that registers a parameter without binding its member: tying it must be refused.
struct Unbound : nn::Module {
  Unbound() { weight = register_parameter("weight", ones({2, 2})); }
  Tensor weight;
};

models::TransformerConfig tiny_config() {
  models::TransformerConfig c;
  c.src_vocab = c.tgt_vocab = 7;
  c.d_model = 8, c.heads = 2, c.d_ff = 12, c.enc_layers = c.dec_layers = 1;
  c.dropout = 0, c.share_embeddings = true, c.pad_id = 0;
  return c;
}

}  // namespace

TEST_CASE("tie_parameter: one tensor, computed with, updated once by the optimizer") {
  manual_seed(3);
  TiedLM m(5, 4);
  CHECK(m.out->weight.impl_ptr() == m.embed->weight.impl_ptr());  // the layer computes with the shared tensor
  CHECK(m.parameters().size() == 1);
  CHECK(m.state_dict().size() == 1);
  CHECK(m.state_dict()[0].first == "embed.weight");

  Tensor ids = tensor({1, 3, 4, 1}, {4});
  Tensor target = tensor({3, 4, 1, 2}, {4});
  optim::SGDOptions so;
  so.lr = 0.5;
  optim::SGD sgd(m.parameters(), so);
  Tensor before = m.embed->weight.detach().clone();
  Tensor loss = cross_entropy(m.logits(ids), target);
  loss.backward();
  // Both uses send their gradient to the one tensor: compare with an untied twin sharing values.
  Tensor w = before.clone().requires_grad_();
  Tensor twin_loss = cross_entropy(matmul(index_select(w, 0, ids), w.transpose(0, 1)), target);
  twin_loss.backward();
  check_values(m.embed->weight.grad(), values(w.grad()), 1e-5);
  sgd.step();
  // The tensor moved, once (lr * grad), and the projection computes with the moved tensor.
  check_values(m.embed->weight.detach(), values(before - w.grad() * 0.5), 1e-5);
  check_values(m.out->forward(ones({1, 4})).detach(), values(matmul(ones({1, 4}), m.embed->weight.detach().transpose(0, 1))));
}

TEST_CASE("tie_parameter refuses what would go wrong, naming the layer") {
  Unbound u;
  CHECK(error_of([&] { u.tie_parameter("weight", ones({2, 2}).requires_grad_()); }).find("registered without its member") !=
        std::string::npos);
  TiedLM m(5, 4);
  CHECK(error_of([&] { m.out->tie_parameter("weight", zeros({4, 5}).requires_grad_()); }).find("Module 'out': tie_parameter('weight')") !=
        std::string::npos);
  CHECK(error_of([&] { m.out->tie_parameter("weight", zeros({4, 5}).requires_grad_()); }).find("[4, 5]") !=
        std::string::npos);
  CHECK(error_of([&] { m.out->tie_parameter("nope", m.embed->weight); }).find("no parameter named 'nope'") !=
        std::string::npos);
}

TEST_CASE("the Transformer's shared embeddings are one tensor through an Adam step") {
  manual_seed(1);
  models::Transformer t(tiny_config());
  CHECK(t.generator->weight.impl_ptr() == t.src_embed->weight.impl_ptr());
  CHECK(t.tgt_embed->weight.impl_ptr() == t.src_embed->weight.impl_ptr());
  optim::Adam adam(t.parameters(), optim::AdamOptions{});
  Tensor before = t.src_embed->weight.detach().clone();
  Tensor src = tensor({1, 2, 3, 4, 5, 6}, {2, 3}), tgt = tensor({1, 3, 5, 2, 4, 6}, {2, 3});
  t.loss(src, tgt, tgt, 0.1).backward();
  adam.step();
  CHECK(values(t.generator->weight.detach()) == values(t.src_embed->weight.detach()));
  CHECK(values(t.src_embed->weight.detach()) != values(before));
}

TEST_CASE("Module::to(Float64): the whole Transformer is gradchecked in float64, its ties kept") {
  manual_seed(2);
  models::Transformer t(tiny_config());
  t.to(DType::Float64);
  CHECK(t.src_embed->weight.dtype() == DType::Float64);
  CHECK(t.generator->weight.impl_ptr() == t.src_embed->weight.impl_ptr());
  for (auto& [name, p] : t.named_parameters()) {
    INFO(name);
    CHECK(p.dtype() == DType::Float64);
    CHECK(p.requires_grad());
  }
  Tensor src = tensor({1, 2, 3, 4, 5, 0}, {2, 3}), tgt = tensor({1, 3, 5, 2, 4, 0}, {2, 3});
  // A few parameters as gradcheck's inputs: the loss reads them through the model.
  TensorList params = {t.src_embed->weight, t.encoder_layers->at<models::EncoderLayer>(0)->self_attn->w_q->weight,
                       t.decoder_layers->at<models::DecoderLayer>(0)->ff->w_1->bias};
  CHECK(gradcheck([&](const TensorList&) { return t.loss(src, tgt, tgt, 0.1); }, params));
  CHECK(error_of([&] { t.to(DType::Int64); }).find("not a floating-point dtype") != std::string::npos);
}

TEST_CASE("load_state_dict(strict = false) returns the missing and unexpected names") {
  nn::Linear a(3, 2), b(3, 2, false);
  std::map<std::string, Tensor> state;
  for (auto& [n, t] : a.state_dict()) state[n] = t;
  state["extra"] = ones({1});
  nn::LoadResult r = b.load_state_dict(state, false);
  CHECK(r.missing.empty());
  CHECK(r.unexpected == std::vector<std::string>{"bias", "extra"});
  CHECK(values(b.weight.detach()) == values(a.weight.detach()));
  r = a.load_state_dict({{"weight", zeros({2, 3})}}, false);
  CHECK(r.missing == std::vector<std::string>{"bias"});
  CHECK(r.unexpected.empty());
  CHECK(error_of([&] { a.load_state_dict({{"weight", zeros({2, 3})}}); }).find("missing in checkpoint: bias") !=
        std::string::npos);
}

TEST_CASE("errors inside MultiHeadAttention name the layer") {
  manual_seed(4);
  models::Transformer t(tiny_config());
  auto attn = t.decoder_layers->at<models::DecoderLayer>(0)->src_attn;
  CHECK(attn->path() == "decoder.0.src_attn");
  Tensor x = randn({2, 3, 8});
  std::string e = error_of([&] { attn->forward(x, x, x, zeros({2, 1, 1, 3})); });
  CHECK(e.find("MultiHeadAttention 'decoder.0.src_attn'") != std::string::npos);
  CHECK(e.find("must be Bool") != std::string::npos);
  e = error_of([&] { attn->forward(x, x, x, gt(ones({2, 1, 4, 3}), 0.0)); });
  CHECK(e.find("MultiHeadAttention 'decoder.0.src_attn': the mask [2, 1, 4, 3] does not broadcast") != std::string::npos);
  e = error_of([&] { attn->forward(x, randn({2, 3, 6}), x); });
  CHECK(e.find("MultiHeadAttention 'decoder.0.src_attn': expected query") != std::string::npos);
  // A standalone layer has no path and says its type.
  nn::MultiHeadAttention alone(8, 2);
  CHECK(error_of([&] { alone.forward(x, x, x, zeros({3})); }).rfind("MultiHeadAttention: the mask", 0) == 0);
  // Broadcast masks that fit pass: padding [B, 1, 1, Tk] and causal [Tq, Tk].
  CHECK(attn->forward(x, x, x, gt(zeros({2, 1, 1, 3}), 0.0)).sizes() == Shape{2, 3, 8});
  CHECK(attn->forward(x, x, x, gt(zeros({3, 3}), 0.0)).sizes() == Shape{2, 3, 8});
}

TEST_CASE("custom autograd functions: record() and SavedTensor, gradchecked") {
  manual_seed(5);
  Tensor x = randn({3, 4}, DType::Float64).requires_grad_();
  CHECK(gradcheck([](const TensorList& in) { return swish(in[0]); }, {x}));
  Tensor xt = randn({4, 3}, DType::Float64).requires_grad_();  // a non-contiguous input
  CHECK(gradcheck([](const TensorList& in) { return swish(in[0].transpose(0, 1)); }, {xt}));
  Tensor z = zeros({0, 2}, DType::Float64).requires_grad_();   // empty
  swish(z).sum().backward();
  CHECK(z.grad().sizes() == Shape{0, 2});
  // The node is named on the tape, and its output matches the composed ops.
  Tensor y = swish(x);
  REQUIRE(y.grad_fn());
  CHECK(y.grad_fn()->name == "SwishBackward");
  check_values(y.detach(), values(x.detach() * x.detach().sigmoid()), 1e-12);
  // An input changed in place after it was saved is refused at backward, naming the op.
  Tensor a = randn({3}, DType::Float64).requires_grad_();
  Tensor b = a * 1.0;
  Tensor out = swish(b);
  {
    NoGradGuard no_grad;
    b.add_(1.0);
  }
  CHECK(error_of([&] { out.sum().backward(); }).find("SwishBackward") != std::string::npos);
}
