// An encoder-only text model in BERT's shape (Devlin et al. 2019): token embeddings plus learned
// positions, a LayerNorm and dropout, the zoo's encoder blocks (nn::TransformerEncoder) over
// the unpadded tokens, and two heads: a masked-LM head (dense, GELU, LayerNorm, then the token
// embedding's transpose plus a bias: tied) and a classifier on the first token, [CLS].
// Parameter names match tools/reference/bert_ref.py.
// Shapes: B sequences, T positions, D d_model, V vocabulary, K classes.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "tapestry/nn/layers.h"

namespace tapestry::models {

struct BertConfig {
  int64_t vocab = 0, max_len = 256, classes = 2;
  int64_t layers = 4, heads = 4, d_model = 128, d_ff = 512;
  double dropout = 0.1;
  double ln_eps = 1e-5;
  bool norm_first = true;   // pre-norm blocks (and a final LayerNorm); false: BERT's post-norm
  int64_t pad_id = 0;       // never attended to; its embedding row gets no gradient

  // "tiny" (2 layers, 2 heads, 32, d_ff 64), "mini" (4, 4, 128, 512), "small" (6, 8, 256, 1024).
  static BertConfig named(const std::string& name, int64_t vocab);
  static std::vector<std::string> names();
  void validate() const;  // throws tapestry::Error naming the bad field
};

class Bert : public nn::Module {
 public:
  explicit Bert(const BertConfig& config);
  // ids int64 [B, T], T <= max_len -> hidden states [B, T, D]; pad_id positions are masked out
  // as keys (their own outputs are computed but mean nothing).
  Tensor encode(const Tensor& ids);
  // Hidden states -> vocabulary logits [B, T, V] (the MLM head).
  Tensor mlm_logits(const Tensor& hidden);
  // Mean cross-entropy over the positions whose label is not -100 (BERT's masked tokens).
  Tensor mlm_loss(const Tensor& ids, const Tensor& labels);
  // ids [B, T] -> class logits [B, K], from the first position ([CLS]).
  Tensor classify(const Tensor& ids);
  Tensor class_loss(const Tensor& ids, const Tensor& labels);

  BertConfig config;
  std::shared_ptr<nn::Embedding> tok_embed, pos_embed;
  std::shared_ptr<nn::LayerNorm> embed_norm;
  std::shared_ptr<nn::Dropout> dropout;
  std::shared_ptr<nn::TransformerEncoder> encoder;
  std::shared_ptr<nn::Linear> mlm_dense;       // D -> D, then GELU and mlm_norm
  std::shared_ptr<nn::LayerNorm> mlm_norm;
  Tensor mlm_bias;                             // [V]; the weight is tok_embed's
  std::shared_ptr<nn::Linear> classifier;      // D -> K on [CLS]
};

// BERT's masking of a batch for the masked-LM objective: each position that is not special is
// chosen with probability `prob`; a chosen token becomes mask_id (80%), a random token of
// [first_normal, vocab) (10%), or stays (10%); its label is the original token, -100 elsewhere.
// At least one position per sequence is chosen when it has any ordinary token.
struct MaskedTokens {
  Tensor ids, labels;  // int64 [B, T]
};
MaskedTokens mask_tokens(const Tensor& ids, int64_t mask_id, int64_t vocab, int64_t first_normal,
                         const std::vector<int64_t>& special, Generator& gen, double prob = 0.15);

}  // namespace tapestry::models
