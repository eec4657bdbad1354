// A Llama-style decoder (Llama 2/3, TinyLlama, SmolLM and others share its blocks): token
// embedding; pre-norm blocks of RMSNorm -> causal self-attention with rotary positions and
// grouped-query attention -> RMSNorm -> SwiGLU MLP; a final RMSNorm; an output head, tied to the
// embedding or not. No biases anywhere. Parameter names are Hugging Face's LlamaForCausalLM's
// without the "model." prefix (embed_tokens, layers.N.self_attn.q_proj, ..., norm, lm_head).
// Shapes: B sequences, T positions, D hidden size, H query heads, G key/value heads, K head dim.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tapestry/models/causal_lm.h"
#include "tapestry/nn/layers.h"

namespace tapestry::models {

struct LlamaConfig {
  int64_t vocab = 0;            // vocab_size
  int64_t d_model = 128;        // hidden_size
  int64_t layers = 4;           // num_hidden_layers
  int64_t heads = 4;            // num_attention_heads
  int64_t kv_heads = 2;         // num_key_value_heads: divides heads; kv head j serves query heads j*r .. j*r+r-1
  int64_t d_ff = 352;           // intermediate_size
  int64_t max_positions = 256;  // max_position_embeddings: the rotary table's length
  double rope_theta = 10000.0;
  double rms_eps = 1e-5;        // rms_norm_eps
  bool tie_embeddings = false;  // tie_word_embeddings
  double dropout = 0.0;         // on each block's attention and MLP outputs while training (not in
                                // Hugging Face's Llama, which has none: 0 keeps it so)

  // "tiny" (2 layers, 4 heads, 2 kv heads, 64, d_ff 176, 64 positions, untied head) and "mini"
  // (4, 4, 2, 128, d_ff 384, 128 positions, tied head, as SmolLM's small models: within 1% of the
  // GPT's mini's parameters at the same vocabulary, for the side-by-side in docs/training.md).
  static LlamaConfig named(const std::string& name, int64_t vocab);
  static std::vector<std::string> names();
  int64_t head_dim() const { return d_model / heads; }
  void validate() const;  // throws tapestry::Error naming the bad field
};

// Hugging Face's rotary tables in float32 (LlamaRotaryEmbedding): for position p and pair i,
// angle = p * (1 / theta^(2i / K)), each step rounded to float32 as there. Returns {cos, sin},
// each [positions, K / 2].
std::pair<Tensor, Tensor> rotary_tables(int64_t positions, int64_t head_dim, double theta);

// Its caches hold the G key/value heads: [B, G, T, K].
using LlamaCache = LMCache;

class LlamaAttention : public nn::Module {
 public:
  explicit LlamaAttention(const LlamaConfig& c);
  // x [B, T, D]; cos, sin broadcast to [B, 1, T, K/2]; masked_out broadcast to [B, 1, T, Tk]
  // (true = masked out) or undefined; causal: the kernel's top-left causal mask.
  Tensor forward(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& masked_out, bool causal,
                 nn::KVCache* cache) const;
  std::shared_ptr<nn::Linear> q_proj, k_proj, v_proj, o_proj;
  int64_t heads, kv_heads, head_dim;
};

// down(silu(gate(x)) * up(x))
class LlamaMLP : public nn::Module {
 public:
  LlamaMLP(int64_t d_model, int64_t d_ff);
  Tensor forward(const Tensor& x) const;
  std::shared_ptr<nn::Linear> gate_proj, up_proj, down_proj;
};

// x + Attn(RMSNorm(x)), then x + MLP(RMSNorm(x)).
class LlamaBlock : public nn::Module {
 public:
  explicit LlamaBlock(const LlamaConfig& c);
  Tensor forward(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& masked_out, bool causal,
                 nn::KVCache* cache) const;
  std::shared_ptr<nn::RMSNorm> input_layernorm, post_attention_layernorm;
  std::shared_ptr<LlamaAttention> self_attn;
  std::shared_ptr<LlamaMLP> mlp;
  std::shared_ptr<nn::Dropout> dropout;  // on both branches' outputs (config.dropout)
};

class Llama : public CausalLM {
 public:
  explicit Llama(const LlamaConfig& config);

  // See CausalLM::forward.
  Tensor forward(const Tensor& ids, LMCache* cache = nullptr, const Tensor& positions = Tensor(),
                 const Tensor& masked_out = Tensor()) override;
  int64_t context_length() const override { return config.max_positions; }
  int64_t vocab_size() const override { return config.vocab; }

  LlamaConfig config;
  std::shared_ptr<nn::Embedding> embed_tokens;
  std::shared_ptr<nn::ModuleList> layers;
  std::shared_ptr<nn::RMSNorm> norm;
  std::shared_ptr<nn::Linear> lm_head;  // weight tied to embed_tokens when config.tie_embeddings

 private:
  // The rotary tables [max_positions, K/2] and 0 .. max_positions-1, on the model's device and
  // in its dtype, made once (and again after a move or a cast).
  void ensure_tables(Device device, DType dtype);
  Tensor cos_, sin_, range_;
};

// Reads a Llama-family checkpoint directory as Hugging Face stores it: config.json (model_type
// "llama"; hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
// num_key_value_heads, max_position_embeddings, rope_theta, rms_norm_eps, tie_word_embeddings,
// vocab_size) and the weights, model.safetensors or the shards that model.safetensors.index.json
// lists, with keys "model.embed_tokens.weight", "model.layers.{i}.self_attn.q_proj.weight", ...,
// "model.norm.weight", "lm_head.weight" (absent when tied), stored as float32, bfloat16 or float16
// and converted to float32. A missing file or tensor, a tensor whose shape disagrees with
// config.json, a dtype the reader does not read, and config features this model does not have
// (rope_scaling, attention or MLP biases, another activation) throw one tapestry::Error naming the
// file and the field or tensor.
std::shared_ptr<Llama> load_llama_hf(const std::string& dir);
// The same with config.json already read (read_llama_hf_config).
std::shared_ptr<Llama> load_llama_hf(const std::string& dir, const LlamaConfig& config);

// The config a Hugging Face config.json describes (as load_llama_hf reads it).
LlamaConfig read_llama_hf_config(const std::string& config_json_path);

}  // namespace tapestry::models
