// What the zoo's decoder-only language models (models::GPT, models::Llama) share, so that one
// training task, one evaluation and one generation loop serve them all: forward with a KV cache,
// position ids and a key mask; the next-token loss; the context length; the weight-decay split;
// and sampling (temperature, top-k, top-p) with batched, left-padded prompts (causal_lm.cpp).
// Shapes: B sequences, T positions, V vocabulary.
#pragma once
#include <functional>
#include <vector>

#include "tapestry/nn/layers.h"

namespace tapestry::models {

// Per-layer caches for incremental decoding: [B, heads, T, head dim] keys and values (a model with
// grouped-query attention keeps its key/value heads only).
struct LMCache {
  std::vector<nn::KVCache> layers;
  int64_t length() const { return layers.empty() || !layers[0].k.defined() ? 0 : layers[0].k.size(2); }
};

class CausalLM : public nn::Module {
 public:
  // ids [B, T] int64 -> logits [B, T, V]. positions: [B, T] int64 position ids (undefined: 0..T-1,
  // or continuing the cache). masked_out: keys to mask out, [B, 1, 1, Tk] bool (true = masked
  // out; e.g. left padding in a batch of prompts). With a cache, ids hold only the new tokens and
  // the attention covers the cached ones too.
  virtual Tensor forward(const Tensor& ids, LMCache* cache = nullptr, const Tensor& positions = Tensor(),
                         const Tensor& masked_out = Tensor()) = 0;
  // Mean cross-entropy of forward(ids) against targets [B, T] (ignore_index -100 skips a position).
  Tensor loss(const Tensor& ids, const Tensor& targets);
  virtual int64_t context_length() const = 0;  // the most positions one forward may see
  virtual int64_t vocab_size() const = 0;
  // The trainable parameters that get weight decay (matrices: dim >= 2, the embeddings included)
  // and those that do not (biases and norm weights), as GPT-2, nanoGPT and Llama's recipes split
  // them; frozen ones (a LoRA base) are in neither.
  std::vector<Tensor> decay_parameters() const;
  std::vector<Tensor> no_decay_parameters() const;

 protected:
  // The checks of forward's ids: int64 [B, T] with T > 0, past + T within context_length() (the
  // error names `context_field` and suggests `remedy`), ids in [0, vocab_size()) (on the CPU; on a
  // GPU the embedding's kernel checks the range). `model` starts each message.
  void check_ids(const Tensor& ids, int64_t past, const char* model, const char* context_field,
                 const char* remedy) const;
  // The attention's key mask for T new tokens after `past` cached ones: `masked_out` with the
  // future keys of each new query added (range: 0 .. context_length()-1 on the model's device). Without
  // cached keys the fused kernel's causal flag serves and one new query needs none: then
  // masked_out itself.
  static Tensor mask_after_cache(const Tensor& range, const Tensor& masked_out, int64_t past, int64_t T);
};

// ---- sampling
struct SampleOptions {
  int64_t max_new = 100;
  double temperature = 1.0;  // > 0; ignored when greedy
  int64_t top_k = 0;         // 0: off
  double top_p = 1.0;        // 1: off (nucleus sampling keeps the smallest set with mass >= top_p)
  bool greedy = false;
  uint64_t seed = 0;
  int64_t eos = -1;          // stop a sequence at this token (-1: never)
  int64_t pad = 0;           // fills the left of shorter prompts (any id; it is masked out)
  bool use_cache = true;     // false: every step runs the whole window again (for checking the cache)
};

// Continues each prompt (token ids; any lengths, left-padded into one batch) with the KV cache,
// in eval mode and without gradients. on_token(row, token) is called as each token is chosen,
// in order, so callers can stream the text. Returns max_new new tokens for each row (fewer only
// where eos came: the row ends with it). The same seed gives the same tokens. The model sees each
// row's last context_length() tokens: past the context the window slides (the cache is rebuilt
// from the window, positions from 0, as nanoGPT crops), and a longer prompt keeps its end.
std::vector<std::vector<int64_t>> generate(CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                                           const SampleOptions& options,
                                           const std::function<void(size_t, int64_t)>& on_token = {});

// One sampling step on logits [B, V]: temperature, top-k, top-p, then a seeded multinomial draw
// (or argmax when greedy). Exposed for tests.
Tensor sample_next(const Tensor& logits, const SampleOptions& options, Generator& gen);

}  // namespace tapestry::models
