// The encoder-decoder Transformer of "Attention Is All You Need" (../shared/transformer-spec.md):
// post-norm by default (pre-norm by config), embeddings scaled by sqrt(d_model) plus sinusoidal
// positions, tied source/target/generator weights when the vocabulary is shared. Parameter names
// match tools/reference/transformer_ref.py exactly.
// Shapes: B sentences, S source length, T target length, D d_model, V vocabulary.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "tapestry/nn/layers.h"

namespace tapestry::models {

struct TransformerConfig {
  int64_t src_vocab = 0, tgt_vocab = 0;
  int64_t d_model = 512, heads = 8, d_ff = 2048, enc_layers = 6, dec_layers = 6;
  double dropout = 0.1;
  bool pre_norm = false;          // x + Dropout(Sublayer(LayerNorm(x))), plus a final LayerNorm per stack
  bool share_embeddings = false;  // one matrix for source, target and generator (needs src_vocab == tgt_vocab)
  int64_t pad_id = 0;

  // "base" and "big" (the paper), "small" (256, 3+3 layers, 8 heads, 1024), "tiny" (64, 2+2, 4, 128).
  static TransformerConfig named(const std::string& name, int64_t src_vocab, int64_t tgt_vocab);
  static std::vector<std::string> names();  // what named() takes, smallest first
  void validate() const;  // throws tapestry::Error naming the bad field
};

// The encoder block is nn::TransformerEncoderLayer (the zoo's one encoder block), configured from
// the TransformerConfig: ReLU, post-norm unless pre_norm.
using EncoderLayer = nn::TransformerEncoderLayer;
nn::TransformerEncoderLayerOptions encoder_layer_options(const TransformerConfig& c);

// Per-layer caches for incremental decoding.
struct DecoderCache {
  std::vector<nn::KVCache> self_attn, src_attn;
};

class DecoderLayer : public nn::Module {
 public:
  DecoderLayer(const TransformerConfig& c);
  Tensor forward(const Tensor& x, const Tensor& memory, const Tensor& src_mask, const Tensor& tgt_mask,
                 nn::KVCache* self_cache = nullptr, nn::KVCache* src_cache = nullptr);
  std::shared_ptr<nn::MultiHeadAttention> self_attn, src_attn;
  std::shared_ptr<nn::PositionwiseFeedForward> ff;
  std::shared_ptr<nn::LayerNorm> norm1, norm2, norm3;
  std::shared_ptr<nn::Dropout> dropout;
  bool pre_norm;
};

class Transformer : public nn::Module {
 public:
  explicit Transformer(const TransformerConfig& config);

  // src [B, S] int64 -> the padding mask [B, 1, 1, S], true at padding.
  Tensor source_mask(const Tensor& src) const;
  // tgt [B, T] -> [B, 1, T, T]: true where a key is padding or lies in the future.
  Tensor target_mask(const Tensor& tgt) const;
  Tensor encode(const Tensor& src, const Tensor& src_mask);  // -> memory [B, S, D]
  // tgt [B, T] (the tokens at positions offset .. offset+T-1) -> hidden [B, T, D]. With a cache,
  // earlier positions come from it and tgt holds only the new ones.
  Tensor decode(const Tensor& tgt, const Tensor& memory, const Tensor& src_mask, const Tensor& tgt_mask,
                DecoderCache* cache = nullptr, int64_t offset = 0);
  Tensor generate(const Tensor& hidden);  // -> logits [B, T, V]
  Tensor forward(const Tensor& src, const Tensor& tgt_in);  // -> logits [B, T, V]
  // Label-smoothed cross-entropy of forward(src, tgt_in) against tgt_out, mean over non-pad tokens.
  Tensor loss(const Tensor& src, const Tensor& tgt_in, const Tensor& tgt_out, double label_smoothing);

  TransformerConfig config;
  std::shared_ptr<nn::Embedding> src_embed, tgt_embed;
  std::shared_ptr<nn::PositionalEncoding> pos;
  std::shared_ptr<nn::ModuleList> encoder_layers, decoder_layers;
  std::shared_ptr<nn::LayerNorm> encoder_norm, decoder_norm;  // pre-norm only
  std::shared_ptr<nn::Linear> generator;                      // no bias; weight tied when shared

 private:
  Tensor embed(const nn::Embedding& table, const Tensor& ids, int64_t offset);
  void check_ids(const char* what, const Tensor& ids, int64_t vocab) const;
};

// ---- decoding (decode.cpp)
struct Hypothesis {
  std::vector<int64_t> tokens;  // without bos; ends with eos unless cut at max length
  double score = 0;             // sum of token log-probs (greedy) or length-normalized (beam)
};

struct DecodeOptions {
  int64_t bos = 1, eos = 2;
  int64_t max_extra = 50;  // max output length = source length + max_extra
  bool use_cache = true;   // false: re-run the whole prefix each step (the reference for tests)
};

// Greedy decoding of a batch of sources [B, S] (padded with pad_id); runs in eval mode.
std::vector<Hypothesis> greedy_decode(Transformer& model, const Tensor& src, const DecodeOptions& opt = {});

// Beam search with the paper's length penalty lp = ((5 + len) / 6)^alpha; the score is
// log P / lp. Batched over sentences. Stops a sentence early once no live hypothesis can beat
// its beam_size finished ones.
std::vector<Hypothesis> beam_search(Transformer& model, const Tensor& src, int64_t beam_size = 4, double alpha = 0.6,
                                    const DecodeOptions& opt = {});

}  // namespace tapestry::models
