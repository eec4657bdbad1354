// A decoder-only causal language model with GPT-2's architecture: token embedding plus learned
// positions, pre-norm blocks of causal multi-head self-attention (nn::MultiHeadAttention, through
// the fused scaled_dot_product_attention) and a GELU MLP, a final LayerNorm and an output head
// tied to the token embedding. Parameter names match tools/reference/gpt_ref.py; load_gpt2_hf
// reads Hugging Face's GPT-2 layout (see gpt.cpp).
// Shapes: B sequences, T positions, D d_model, V vocabulary.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "tapestry/models/causal_lm.h"
#include "tapestry/nn/layers.h"

namespace tapestry::models {

struct GPTConfig {
  int64_t vocab = 0;          // token ids are 0 .. vocab-1
  int64_t block_size = 256;   // the longest context (learned positions)
  int64_t layers = 4, heads = 4, d_model = 256;
  int64_t d_ff = 0;           // 0: 4 * d_model
  double dropout = 0.1;
  double ln_eps = 1e-5;
  bool gelu_tanh = true;      // GPT-2's tanh approximation of GELU (false: the exact erf form)

  // "tiny" (2 layers, 2 heads, 64, block 64), "mini" (4, 4, 128, 128), "small" (6, 6, 384, 256),
  // "medium" (8, 8, 512, 512) and "gpt2" (12, 12, 768, block 1024: the shapes of GPT-2 124M).
  static GPTConfig named(const std::string& name, int64_t vocab);
  static std::vector<std::string> names();
  int64_t ff_dim() const { return d_ff > 0 ? d_ff : 4 * d_model; }
  void validate() const;  // throws tapestry::Error naming the bad field
};

// GELU(x W_fc + b) W_proj + b, then dropout.
class GPTMLP : public nn::Module {
 public:
  GPTMLP(int64_t d_model, int64_t d_ff, double dropout, bool gelu_tanh = true);
  Tensor forward(const Tensor& x) const;
  std::shared_ptr<nn::Linear> fc, proj;
  std::shared_ptr<nn::Dropout> dropout;
  bool gelu_tanh;
};

// x + Dropout(Attn(LN1(x))), then x + MLP(LN2(x)).
class GPTBlock : public nn::Module {
 public:
  explicit GPTBlock(const GPTConfig& c);
  // mask: as MultiHeadAttention's (true = masked out), or undefined; causal: add the causal mask.
  Tensor forward(const Tensor& x, const Tensor& mask, bool causal, nn::KVCache* cache = nullptr);
  std::shared_ptr<nn::LayerNorm> ln_1, ln_2;
  std::shared_ptr<nn::MultiHeadAttention> attn;
  std::shared_ptr<GPTMLP> mlp;
  std::shared_ptr<nn::Dropout> dropout;  // on the attention branch's output
};

using GPTCache = LMCache;

class GPT : public CausalLM {
 public:
  explicit GPT(const GPTConfig& config);

  // See CausalLM::forward; masked_out: as MultiHeadAttention's mask.
  Tensor forward(const Tensor& ids, LMCache* cache = nullptr, const Tensor& positions = Tensor(),
                 const Tensor& masked_out = Tensor()) override;
  int64_t context_length() const override { return config.block_size; }
  int64_t vocab_size() const override { return config.vocab; }

  GPTConfig config;
  std::shared_ptr<nn::Embedding> wte, wpe;
  std::shared_ptr<nn::Dropout> drop;
  std::shared_ptr<nn::ModuleList> blocks;
  std::shared_ptr<nn::LayerNorm> ln_f;
  std::shared_ptr<nn::Linear> head;  // no bias; weight tied to wte

 private:
  // 0 .. block_size - 1 as int64 on the model's device, made once (and again after a move): a range
  // made on the host every forward would be a copy up, a synchronisation on a GPU.
  const Tensor& position_range(Device device);
  Tensor position_range_;
};

// Reads a GPT-2 checkpoint in Hugging Face's safetensors layout (model.safetensors of
// GPT2LMHeadModel / GPT2Model: keys "wte.weight", "h.0.attn.c_attn.weight", ... with or
// without the "transformer." prefix; Conv1D weights stored [in, out]) into a GPT whose config
// is inferred from the tensor shapes (heads must be given: the file does not say). Throws a
// tapestry::Error naming a missing or misshapen key.
std::shared_ptr<GPT> load_gpt2_hf(const std::string& path, int64_t heads, double dropout = 0.0);

}  // namespace tapestry::models
