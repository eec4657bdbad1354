// Transformer implementation (see transformer.h).
#include "tapestry/models/transformer.h"

#include <cmath>

namespace tapestry::models {

TransformerConfig TransformerConfig::named(const std::string& name, int64_t src_vocab, int64_t tgt_vocab) {
  TransformerConfig c;
  c.src_vocab = src_vocab;
  c.tgt_vocab = tgt_vocab;
  if (name == "base") {
    // the defaults
  } else if (name == "big") {
    c.d_model = 1024, c.heads = 16, c.d_ff = 4096, c.dropout = 0.3;
  } else if (name == "small") {
    c.d_model = 256, c.heads = 8, c.d_ff = 1024, c.enc_layers = 3, c.dec_layers = 3;
  } else if (name == "tiny") {
    c.d_model = 64, c.heads = 4, c.d_ff = 128, c.enc_layers = 2, c.dec_layers = 2;
  } else {
    throw Error(fmt::format("TransformerConfig: unknown config '{}' (expected one of {})", name, fmt::join(names(), ", ")));
  }
  return c;
}

std::vector<std::string> TransformerConfig::names() { return {"tiny", "small", "base", "big"}; }

void TransformerConfig::validate() const {
  TP_CHECK(src_vocab > 0 && tgt_vocab > 0, "TransformerConfig: vocabulary sizes must be positive, got {} and {}",
           src_vocab, tgt_vocab);
  TP_CHECK(d_model > 0 && heads > 0 && d_model % heads == 0,
           "TransformerConfig: d_model {} is not divisible by heads {}", d_model, heads);
  TP_CHECK(d_ff > 0 && enc_layers > 0 && dec_layers > 0, "TransformerConfig: d_ff and layer counts must be positive");
  TP_CHECK(dropout >= 0 && dropout < 1, "TransformerConfig: dropout must be in [0, 1), got {}", dropout);
  TP_CHECK(!share_embeddings || src_vocab == tgt_vocab,
           "TransformerConfig: share_embeddings needs one vocabulary, got {} and {}", src_vocab, tgt_vocab);
  TP_CHECK(pad_id >= 0 && pad_id < std::min(src_vocab, tgt_vocab), "TransformerConfig: pad_id {} is not a token id",
           pad_id);
}

nn::TransformerEncoderLayerOptions encoder_layer_options(const TransformerConfig& c) {
  nn::TransformerEncoderLayerOptions o(c.d_model, c.heads);
  o.batch_first = true;
  o.dim_feedforward = c.d_ff, o.dropout = c.dropout, o.norm_first = c.pre_norm;
  return o;
}

DecoderLayer::DecoderLayer(const TransformerConfig& c) : pre_norm(c.pre_norm) {
  self_attn = register_module("self_attn", std::make_shared<nn::MultiHeadAttention>(c.d_model, c.heads, c.dropout));
  src_attn = register_module("src_attn", std::make_shared<nn::MultiHeadAttention>(c.d_model, c.heads, c.dropout));
  ff = register_module("ff", std::make_shared<nn::PositionwiseFeedForward>(c.d_model, c.d_ff, c.dropout));
  norm1 = register_module("norm1", std::make_shared<nn::LayerNorm>(c.d_model));
  norm2 = register_module("norm2", std::make_shared<nn::LayerNorm>(c.d_model));
  norm3 = register_module("norm3", std::make_shared<nn::LayerNorm>(c.d_model));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(c.dropout));
}

Tensor DecoderLayer::forward(const Tensor& x, const Tensor& memory, const Tensor& src_mask, const Tensor& tgt_mask,
                             nn::KVCache* self_cache, nn::KVCache* src_cache) {
  if (pre_norm) {
    Tensor h = norm1->forward(x);
    Tensor y = x + dropout->forward(self_attn->forward(h, h, h, tgt_mask, self_cache));
    h = norm2->forward(y);
    y = y + dropout->forward(src_attn->forward(h, memory, memory, src_mask, src_cache, true));
    return y + dropout->forward(ff->forward(norm3->forward(y)));
  }
  Tensor y = norm1->forward(x + dropout->forward(self_attn->forward(x, x, x, tgt_mask, self_cache)));
  y = norm2->forward(y + dropout->forward(src_attn->forward(y, memory, memory, src_mask, src_cache, true)));
  return norm3->forward(y + dropout->forward(ff->forward(y)));
}

namespace {
// Xavier/Glorot uniform, as the Annotated Transformer initializes every matrix.
void xavier_uniform(Tensor w) {
  double bound = std::sqrt(6.0 / static_cast<double>(w.size(0) + w.size(1)));
  NoGradGuard no_grad;
  w.uniform_(-bound, bound);
}
}  // namespace

Transformer::Transformer(const TransformerConfig& c) : config(c) {
  c.validate();
  src_embed = register_module("src_embed", std::make_shared<nn::Embedding>(c.src_vocab, c.d_model, c.pad_id));
  tgt_embed = c.share_embeddings
                  ? register_module("tgt_embed", src_embed)
                  : register_module("tgt_embed", std::make_shared<nn::Embedding>(c.tgt_vocab, c.d_model, c.pad_id));
  pos = register_module("pos", std::make_shared<nn::PositionalEncoding>(c.d_model, c.dropout));
  encoder_layers = register_module("encoder", std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < c.enc_layers; ++i) encoder_layers->push_back(std::make_shared<EncoderLayer>(encoder_layer_options(c)));
  decoder_layers = register_module("decoder", std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < c.dec_layers; ++i) decoder_layers->push_back(std::make_shared<DecoderLayer>(c));
  if (c.pre_norm) {
    encoder_norm = register_module("encoder_norm", std::make_shared<nn::LayerNorm>(c.d_model));
    decoder_norm = register_module("decoder_norm", std::make_shared<nn::LayerNorm>(c.d_model));
  }
  generator = std::make_shared<nn::Linear>(c.d_model, c.tgt_vocab, false);
  // Tied: one tensor under three names; state_dict() lists it once, as src_embed.weight.
  if (c.share_embeddings) generator->tie_parameter("weight", tgt_embed->weight);
  generator = register_module("generator", generator);

  for (auto& [name, p] : named_parameters())
    if (p.dim() == 2 && name.find("embed") == std::string::npos) xavier_uniform(p);
  NoGradGuard no_grad;
  for (const auto& e : {src_embed, tgt_embed}) {
    Tensor w = e->weight;
    w.normal_(0.0, std::pow(static_cast<double>(c.d_model), -0.5));
    w.select(0, c.pad_id).zero_();
  }
}

void Transformer::check_ids(const char* what, const Tensor& ids, int64_t vocab) const {
  TP_CHECK(ids.dtype() == DType::Int64 && ids.dim() == 2, "Transformer: {} ids must be int64 [B, T], got {} {}", what,
           ids.dtype(), ids.sizes());
  TP_CHECK(ids.numel() > 0, "Transformer: empty batch ({} shape {})", what, ids.sizes());
  // On a GPU the range is checked by the embedding's kernel (an error flag read at the next
  // synchronisation) instead of a host copy of every batch.
  if (!ids.device().is_cpu()) return;
  for (int64_t v : ids.to_vector<int64_t>())
    TP_CHECK(v >= 0 && v < vocab, "Transformer: {} token id {} is out of range for a vocabulary of {}", what, v, vocab);
}

Tensor Transformer::source_mask(const Tensor& src) const {
  return eq(src, static_cast<double>(config.pad_id)).unsqueeze(1).unsqueeze(1);
}

Tensor Transformer::target_mask(const Tensor& tgt) const {
  const int64_t T = tgt.size(1);
  Tensor future = nn::causal_mask(T, T, tgt.device());  // [T, T]: key j > query i
  return logical_or(source_mask(tgt), future);                          // [B, 1, T, T]
}

Tensor Transformer::embed(const nn::Embedding& table, const Tensor& ids, int64_t offset) {
  Tensor x = table.forward(ids) * std::sqrt(static_cast<double>(config.d_model));
  return pos->forward(x, offset);
}

Tensor Transformer::encode(const Tensor& src, const Tensor& src_mask) {
  check_ids("source", src, config.src_vocab);
  Tensor x = embed(*src_embed, src, 0);
  for (size_t i = 0; i < encoder_layers->size(); ++i) {
    const std::shared_ptr<EncoderLayer> layer = encoder_layers->at<EncoderLayer>(i);
    if (checkpoint_blocks())
      x = checkpoint([layer, src_mask](const TensorList& in) { return layer->forward(in[0], src_mask); }, {x});
    else
      x = layer->forward(x, src_mask);
  }
  return encoder_norm ? encoder_norm->forward(x) : x;
}

Tensor Transformer::decode(const Tensor& tgt, const Tensor& memory, const Tensor& src_mask, const Tensor& tgt_mask,
                           DecoderCache* cache, int64_t offset) {
  check_ids("target", tgt, config.tgt_vocab);
  if (cache) {
    cache->self_attn.resize(decoder_layers->size());
    cache->src_attn.resize(decoder_layers->size());
  }
  Tensor x = embed(*tgt_embed, tgt, offset);
  for (size_t i = 0; i < decoder_layers->size(); ++i) {
    const std::shared_ptr<DecoderLayer> layer = decoder_layers->at<DecoderLayer>(i);
    // Checkpointed, the layer hands memory its gradient from both of its uses (keys and values)
    // already summed: the encoder's gradient then equals the plain one to rounding, not to the bit.
    if (checkpoint_blocks() && !cache)
      x = checkpoint([layer, src_mask, tgt_mask](const TensorList& in) {
        return layer->forward(in[0], in[1], src_mask, tgt_mask, nullptr, nullptr);
      }, {x, memory});
    else
      x = layer->forward(x, memory, src_mask, tgt_mask, cache ? &cache->self_attn[i] : nullptr,
                         cache ? &cache->src_attn[i] : nullptr);
  }
  return decoder_norm ? decoder_norm->forward(x) : x;
}

Tensor Transformer::generate(const Tensor& hidden) { return generator->forward(hidden); }

Tensor Transformer::forward(const Tensor& src_in, const Tensor& tgt_in_any) {
  // Token ids may come from the host: they go to the model's device (one copy per batch).
  const Device device = src_embed->weight.device();
  const Tensor src = src_in.to(device), tgt_in = tgt_in_any.to(device);
  TP_CHECK(src.dim() == 2 && tgt_in.dim() == 2 && src.size(0) == tgt_in.size(0),
           "Transformer: source {} and target {} must be [B, S] and [B, T] with the same B", src.sizes(),
           tgt_in.sizes());
  Tensor src_mask = source_mask(src);
  Tensor memory = encode(src, src_mask);
  return generate(decode(tgt_in, memory, src_mask, target_mask(tgt_in)));
}

Tensor Transformer::loss(const Tensor& src, const Tensor& tgt_in, const Tensor& tgt_out, double label_smoothing) {
  TP_CHECK(tgt_out.sizes() == tgt_in.sizes(), "Transformer::loss: tgt_out {} must match tgt_in {}", tgt_out.sizes(),
           tgt_in.sizes());
  Tensor logits = forward(src, tgt_in);
  return cross_entropy(logits.reshape({-1, config.tgt_vocab}), tgt_out.to(logits.device()).reshape({-1}),
                       label_smoothing, config.pad_id);
}

}  // namespace tapestry::models
