// A decoder-only causal language model with GPT-2's architecture: token embedding plus learned
// positions, pre-norm blocks of causal multi-head self-attention (nn::MultiHeadAttention, through
// the fused scaled_dot_product_attention) and a GELU MLP, a final LayerNorm and an output head
// tied to the token embedding. Parameter names match tools/reference/gpt_ref.py; load_gpt2_hf
// reads Hugging Face's GPT-2 layout (see gpt.cpp).
// Shapes: B sequences, T positions, D d_model, V vocabulary.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

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

// Per-layer caches for incremental decoding.
struct GPTCache {
  std::vector<nn::KVCache> layers;
  int64_t length() const { return layers.empty() || !layers[0].k.defined() ? 0 : layers[0].k.size(2); }
};

class GPT : public nn::Module {
 public:
  explicit GPT(const GPTConfig& config);

  // ids [B, T] int64 -> logits [B, T, V]. positions: [B, T] int64 position ids (undefined: 0..T-1,
  // or continuing the cache). mask: extra keys to mask out ([B, 1, 1, Tk], e.g. left padding in
  // a batch of prompts). With a cache, ids hold only the new tokens and the attention covers
  // the cached ones too.
  Tensor forward(const Tensor& ids, GPTCache* cache = nullptr, const Tensor& positions = Tensor(),
                 const Tensor& mask = Tensor());
  // Mean cross-entropy of forward(ids) against targets [B, T] (ignore_index -100 skips a position).
  Tensor loss(const Tensor& ids, const Tensor& targets);
  // The parameters that get weight decay (matrices: dim >= 2, the embeddings included) and those
  // that do not (biases and LayerNorm), as GPT-2 and nanoGPT split them.
  std::vector<Tensor> decay_parameters() const;
  std::vector<Tensor> no_decay_parameters() const;

  GPTConfig config;
  std::shared_ptr<nn::Embedding> wte, wpe;
  std::shared_ptr<nn::Dropout> drop;
  std::shared_ptr<nn::ModuleList> blocks;
  std::shared_ptr<nn::LayerNorm> ln_f;
  std::shared_ptr<nn::Linear> head;  // no bias; weight tied to wte

 private:
  void check_ids(const Tensor& ids, const GPTCache* cache) const;
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

// ---- sampling (gpt_generate.cpp)
struct SampleOptions {
  int64_t max_new = 100;
  double temperature = 1.0;  // > 0; ignored when greedy
  int64_t top_k = 0;         // 0: off
  double top_p = 1.0;        // 1: off (nucleus sampling keeps the smallest set with mass >= top_p)
  bool greedy = false;
  uint64_t seed = 0;
  int64_t eos = -1;          // stop a sequence at this token (-1: never)
  int64_t pad = 0;           // fills the left of shorter prompts (any id; it is masked out)
};

// Continues each prompt (token ids; any lengths, left-padded into one batch) with the KV cache,
// in eval mode and without gradients. on_token(row, token) is called as each token is chosen,
// in order, so callers can stream the text. Returns max_new new tokens for each row (fewer only
// where eos came: the row ends with it). The same seed gives the same tokens. The model sees each
// row's last block_size tokens: past the context the window slides (the cache is rebuilt from
// the window, positions from 0, as nanoGPT crops), and a longer prompt keeps its end.
std::vector<std::vector<int64_t>> generate(GPT& model, const std::vector<std::vector<int64_t>>& prompts,
                                           const SampleOptions& options,
                                           const std::function<void(size_t, int64_t)>& on_token = {});

// One sampling step on logits [B, V]: temperature, top-k, top-p, then a seeded multinomial draw
// (or argmax when greedy). Exposed for tests.
Tensor sample_next(const Tensor& logits, const SampleOptions& options, Generator& gen);

}  // namespace tapestry::models
