// The encoder-only text model of bert.h. Init as BERT's: N(0, 0.02) for the embeddings and every
// Linear weight, zero biases, LayerNorm at (1, 0); the pad row of the token embedding at zero.
#include "tapestry/models/bert.h"

#include <algorithm>
#include <random>

#include "tapestry/autograd/functions.h"
#include "tapestry/nn/init.h"

namespace tapestry::models {

BertConfig BertConfig::named(const std::string& name, int64_t vocab) {
  BertConfig c;
  c.vocab = vocab;
  if (name == "tiny") {
    c.layers = 2, c.heads = 2, c.d_model = 32, c.d_ff = 64;
  } else if (name == "mini") {
    c.layers = 4, c.heads = 4, c.d_model = 128, c.d_ff = 512;
  } else if (name == "small") {
    c.layers = 6, c.heads = 8, c.d_model = 256, c.d_ff = 1024;
  } else {
    TP_CHECK(false, "BertConfig: unknown config '{}' (expected one of tiny, mini, small)", name);
  }
  return c;
}

std::vector<std::string> BertConfig::names() { return {"tiny", "mini", "small"}; }

void BertConfig::validate() const {
  TP_CHECK(vocab > 0 && max_len > 0 && classes > 0, "BertConfig: vocab {}, max_len {} and classes {} must be positive",
           vocab, max_len, classes);
  TP_CHECK(d_model > 0 && heads > 0 && d_model % heads == 0, "BertConfig: heads {} must divide d_model {}", heads,
           d_model);
  TP_CHECK(layers >= 0 && d_ff > 0, "BertConfig: layers {} must be >= 0 and d_ff {} positive", layers, d_ff);
  TP_CHECK(dropout >= 0 && dropout < 1, "BertConfig: dropout {} must be in [0, 1)", dropout);
  TP_CHECK(pad_id >= 0 && pad_id < vocab, "BertConfig: pad_id {} is outside the vocabulary of {}", pad_id, vocab);
}

Bert::Bert(const BertConfig& c) : config(c) {
  c.validate();
  tok_embed = register_module("tok_embed", std::make_shared<nn::Embedding>(c.vocab, c.d_model, c.pad_id));
  pos_embed = register_module("pos_embed", std::make_shared<nn::Embedding>(c.max_len, c.d_model));
  embed_norm = register_module("embed_norm", std::make_shared<nn::LayerNorm>(c.d_model, c.ln_eps));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(c.dropout));
  nn::TransformerEncoderLayerOptions layer(c.d_model, c.heads);
  layer.batch_first = true;
  layer.dim_feedforward = c.d_ff;
  layer.dropout = c.dropout;
  layer.activation = "gelu";
  layer.layer_norm_eps = c.ln_eps;
  layer.norm_first = c.norm_first;
  encoder = register_module("encoder", std::make_shared<nn::TransformerEncoder>(layer, c.layers, c.norm_first));
  mlm_dense = register_module("mlm_dense", std::make_shared<nn::Linear>(c.d_model, c.d_model));
  mlm_norm = register_module("mlm_norm", std::make_shared<nn::LayerNorm>(c.d_model, c.ln_eps));
  register_parameter("mlm_bias", mlm_bias, zeros({c.vocab}));
  classifier = register_module("classifier", std::make_shared<nn::Linear>(c.d_model, c.classes));

  NoGradGuard no_grad;
  apply([](nn::Module& m) {
    if (auto* linear = dynamic_cast<nn::Linear*>(&m)) {
      nn::init::normal_(linear->weight, 0.0, 0.02);
      if (linear->bias.defined()) nn::init::zeros_(linear->bias);
    } else if (auto* emb = dynamic_cast<nn::Embedding*>(&m)) {
      nn::init::normal_(emb->weight, 0.0, 0.02);
      if (emb->padding_idx) emb->weight.select(0, *emb->padding_idx).zero_();
    }
  });
}

Tensor Bert::encode(const Tensor& ids_in) {
  const Tensor ids = ids_in.to(tok_embed->weight.device());
  TP_CHECK(ids.dtype() == DType::Int64 && ids.dim() == 2 && ids.size(1) > 0,
           "Bert: expected token ids int64 [B, T] with T > 0, got {} {}", ids.dtype(), ids.sizes());
  const int64_t B = ids.size(0), T = ids.size(1);
  TP_CHECK(T <= config.max_len, "Bert: {} positions exceed max_len {}; truncate the input", T, config.max_len);
  Tensor positions = arange(T, TensorOptions(DType::Int64, ids.device()));
  Tensor x = dropout->forward(embed_norm->forward(tok_embed->forward(ids) + pos_embed->forward(positions)));
  Tensor pad = eq(ids, static_cast<double>(config.pad_id)).reshape({B, 1, 1, T});  // true = masked out
  return encoder->forward(x, pad);
}

Tensor Bert::mlm_logits(const Tensor& hidden) {
  Tensor h = mlm_norm->forward(gelu(mlm_dense->forward(hidden)));
  return matmul(h, tok_embed->weight.t()) + mlm_bias;
}

Tensor Bert::mlm_loss(const Tensor& ids, const Tensor& labels_in) {
  Tensor logits = mlm_logits(encode(ids));
  const Tensor labels = labels_in.to(logits.device());
  TP_CHECK(labels.sizes() == ids.sizes(), "Bert: labels {} must match the ids {}", labels.sizes(), ids.sizes());
  return cross_entropy(logits.reshape({-1, config.vocab}), labels.reshape({-1}));
}

Tensor Bert::classify(const Tensor& ids) { return classifier->forward(dropout->forward(encode(ids).select(1, 0))); }

Tensor Bert::class_loss(const Tensor& ids, const Tensor& labels) {
  Tensor logits = classify(ids);
  return cross_entropy(logits, labels.to(logits.device()));
}

MaskedTokens mask_tokens(const Tensor& ids_in, int64_t mask_id, int64_t vocab, int64_t first_normal,
                         const std::vector<int64_t>& special, Generator& gen, double prob) {
  TP_CHECK(ids_in.dtype() == DType::Int64 && ids_in.dim() == 2, "mask_tokens: expected int64 ids [B, T], got {} {}",
           ids_in.dtype(), ids_in.sizes());
  TP_CHECK(prob > 0 && prob <= 1, "mask_tokens: prob must be in (0, 1], got {}", prob);
  TP_CHECK(first_normal >= 0 && first_normal < vocab, "mask_tokens: first_normal {} is outside the vocabulary of {}",
           first_normal, vocab);
  std::vector<int64_t> ids = ids_in.contiguous().to(Device::CPU).to_vector<int64_t>();
  const int64_t B = ids_in.size(0), T = ids_in.size(1);
  std::vector<int64_t> labels(ids.size(), -100);
  std::mt19937_64& engine = gen.engine();
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::uniform_int_distribution<int64_t> random_token(first_normal, vocab - 1);
  auto is_special = [&](int64_t t) { return std::find(special.begin(), special.end(), t) != special.end(); };
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int64_t> candidates;
    bool any = false;
    for (int64_t t = 0; t < T; ++t) {
      const size_t i = static_cast<size_t>(b * T + t);
      if (is_special(ids[i])) continue;
      candidates.push_back(t);
      if (u(engine) < prob) labels[i] = ids[i], any = true;
    }
    if (!any && !candidates.empty()) {  // a sequence with no target teaches nothing: pick one
      std::uniform_int_distribution<size_t> pick(0, candidates.size() - 1);
      const size_t i = static_cast<size_t>(b * T + candidates[pick(engine)]);
      labels[i] = ids[i];
    }
    for (int64_t t = 0; t < T; ++t) {
      const size_t i = static_cast<size_t>(b * T + t);
      if (labels[i] == -100) continue;
      const double r = u(engine);
      if (r < 0.8) {
        ids[i] = mask_id;
      } else if (r < 0.9) {
        ids[i] = random_token(engine);
      }  // else: the token stays, and is still predicted
    }
  }
  return {tensor(ids, ids_in.sizes()).to(ids_in.device()), tensor(labels, ids_in.sizes()).to(ids_in.device())};
}

}  // namespace tapestry::models
