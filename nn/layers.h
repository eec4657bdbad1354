// The layers of the Transformer, libtorch-style: each is a Module whose constructor registers
// its parameters under the names the PyTorch reference uses, and whose forward() is plain
// autograd code. Shapes: B batch, T time (tokens), D d_model, H heads, K = D / H per head.
#pragma once
#include <array>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tapestry/nn/module.h"

namespace tapestry::nn {

// y = x W^T + b; weight [out, in], bias [out]; init U(-1/sqrt(in), 1/sqrt(in)) as PyTorch's.
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& x) const;  // (..., in) -> (..., out)
  Tensor weight, bias;
  // A LoRA adapter, when nn::add_lora attached one (nn/lora.h): forward adds
  // lora_scale * lora_B(lora_A(dropout(x, lora_dropout))), lora_A [rank, in], lora_B [out, rank].
  std::shared_ptr<Linear> lora_A, lora_B;
  double lora_scale = 0, lora_dropout = 0;

 private:
  // In eval mode, on a float32 CPU weight, forward multiplies by W^T laid out [in, out], and
  // where no gradient is recorded (inference) it keeps that copy until the weight changes (another
  // storage or offset, or an in-place write, which bumps its version). oneDNN runs x W^T up to
  // 5.7x faster from that layout than from W's [out, in] at decoding's 8-256 rows, and within 4%
  // where it does not gain (`tapestry bench --layouts`, docs/benchmarks.md). The sums run in
  // another order: eval outputs equal train mode's to rounding.
  Tensor transposed_weight() const;
  struct TransposedCache {
    std::mutex mutex;
    Tensor wt, of;  // of: the weight it was made from (held, so its storage is never reused)
    uint64_t version = 0;
  };
  std::shared_ptr<TransposedCache> wt_cache_ = std::make_shared<TransposedCache>();
};

// Lookup table [num, dim], init N(0, 1). The padding row starts at zero and the lookup sends it
// no gradient (a weight tied elsewhere, as the generator's, may still move it, as in PyTorch).
class Embedding : public Module {
 public:
  // padding_idx as PyTorch's: unset for none, a negative one counts from the end (-1: the last row).
  Embedding(int64_t num_embeddings, int64_t dim, std::optional<int64_t> padding_idx = std::nullopt);
  Tensor forward(const Tensor& ids) const;  // int64 (...) -> (..., dim)
  Tensor weight;
  std::optional<int64_t> padding_idx;  // the row, in [0, num_embeddings), when there is one
};

class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5);
  Tensor forward(const Tensor& x) const;
  Tensor weight, bias;
  double eps;
};

// torch.nn.RMSNorm (PyTorch 2.4) over the last dim, with a weight of ones; Llama's norm. eps as
// rms_norm's: unset, the dtype's machine epsilon; Llama checkpoints set theirs (rms_norm_eps).
class RMSNorm : public Module {
 public:
  explicit RMSNorm(int64_t dim, std::optional<double> eps = std::nullopt);
  Tensor forward(const Tensor& x) const;
  Tensor weight;
  std::optional<double> eps;
};

class Dropout : public Module {
 public:
  explicit Dropout(double p);
  Tensor forward(const Tensor& x) const;  // identity in eval()
  double p;
};

// Holds submodules registered as "0", "1", ...; Sequential also chains their forward().
class ModuleList : public Module {
 public:
  template <class M> std::shared_ptr<M> push_back(std::shared_ptr<M> m) {
    register_module(std::to_string(items_.size()), m);
    items_.push_back(m);
    return m;
  }
  size_t size() const { return items_.size(); }
  const std::shared_ptr<Module>& operator[](size_t i) const { return items_.at(i); }
  template <class M> std::shared_ptr<M> at(size_t i) const { return std::dynamic_pointer_cast<M>(items_.at(i)); }

 private:
  std::vector<std::shared_ptr<Module>> items_;
};

class Sequential : public Module {
 public:
  using Forward = std::function<Tensor(const Tensor&)>;
  template <class M> Sequential& add(std::shared_ptr<M> m) {
    register_module(std::to_string(steps_.size()), m);
    steps_.push_back([m](const Tensor& x) { return m->forward(x); });
    return *this;
  }
  Tensor forward(Tensor x) const;

 private:
  std::vector<Forward> steps_;
};

// [tq, tk] Bool, true where key j lies in the future of query i (j > i).
Tensor causal_mask(int64_t tq, int64_t tk, Device device = Device::CPU);

// Cached keys and values of one attention layer for incremental decoding: [B, H, T, K].
// Without gradients the cache keeps room to grow (twice what it holds), and k, v are views of its
// first T positions, so a step writes only its own keys instead of copying the whole cache again
// (a cat per step is quadratic in the length). With gradients it concatenates, so the graph sees it.
struct KVCache {
  Tensor k, v;
  // Appends the new steps' keys and values (along T) and sets k_new, v_new, k and v to the whole:
  // cached then new.
  void append(Tensor& k_new, Tensor& v_new);
  // Keeps the rows `index` (int64, on the cache's device) in that order: a beam's reordering, or
  // finished sentences leaving a batch.
  void select_rows(const Tensor& index);

 private:
  bool in_room() const;   // k and v are the first T positions of the buffers below
  Tensor k_room, v_room;  // [B, H, capacity, K]
};

// The positions of a padded batch [B, T, D] that a key padding mask [B, 1, 1, T] keeps, for the
// encoder's eval path that computes those rows alone (Note [Packed rows] in layers.cpp). Packed
// tensors hold the kept rows in order, [N, D].
struct PackedRows {
  // Undefined rows (see defined()) where packing does not apply: not on the CPU, no padding,
  // another mask shape, or a sentence that is all padding.
  static PackedRows of(const Tensor& x, const Tensor& key_padding_mask);
  bool defined() const { return rows.defined(); }
  Tensor pack(const Tensor& padded) const;    // [B, T, D] -> [N, D]
  Tensor unpack(const Tensor& packed) const;  // [N, D] -> [B, T, D], zeros at the padded positions
  Tensor rows;    // int64 [N]: the flat positions b * T + t kept
  Tensor spread;  // int64 [B * T]: a packed row for every position (its own, else its sentence's first)
  Tensor place;   // int64 [B * T]: each position's packed row, N (a zero row) where padded
  int64_t batch = 0, length = 0;
};

// softmax(Q K^T / sqrt(K)) V over H heads, then W_o. The mask is bool with true = masked out, as
// torch.nn.MultiheadAttention's attn_mask and key_padding_mask (the opposite of the functional
// scaled_dot_product_attention's), broadcastable to [B, H, Tq, Tk] (a key padding mask is
// [B, 1, 1, Tk], a causal one [Tq, Tk]).
class MultiHeadAttention : public Module {
 public:
  MultiHeadAttention(int64_t d_model, int64_t heads, double dropout = 0.0);
  // query [B, Tq, D], key/value [B, Tk, D] -> [B, Tq, D]. With a cache: static_kv (the encoder
  // memory of cross-attention) projects key/value once and reuses them; otherwise the new keys
  // and values are appended to the cache, so each decoding step costs one position.
  // is_causal adds the causal mask (key j > query i masked), without materializing it.
  // key/value may hold one row per G query rows ([B / G, Tk, D]): query rows g*G .. g*G + G - 1
  // attend to key row g (a beam search's K rows to their sentence's memory, never repeated); the
  // mask then broadcasts to [B / G, H, G * Tq, Tk], and is_causal is refused.
  // The attention runs through the fused scaled_dot_product_attention.
  Tensor forward(const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& mask = Tensor(),
                 KVCache* cache = nullptr, bool static_kv = false, bool is_causal = false);
  // An attention hook sees the weights [B, H, Tq, Tk] of every forward (the softmax of the scaled,
  // masked scores, before dropout), for inspection and pictures. The fused kernel never forms
  // them: they are recomputed, without gradients, only while a hook is set. An empty function
  // removes the hook.
  using AttentionHook = std::function<void(const Tensor& weights)>;
  void set_attention_hook(AttentionHook hook) { attention_hook_ = std::move(hook); }
  // Self-attention of a padded batch given packed, x [N, D] -> [N, D]: the projections compute
  // the kept rows alone; the attention itself runs padded, under `mask` (Note [Packed rows]).
  Tensor forward_packed(const Tensor& x, const PackedRows& packed, const Tensor& mask);

  std::shared_ptr<Linear> w_q, w_k, w_v, w_o;
  std::shared_ptr<Dropout> dropout;
  int64_t d_model, heads, d_k;

 private:
  AttentionHook attention_hook_;
  Tensor split_heads(const Tensor& x) const;  // [B, T, D] -> [B, H, T, K], a view
  // The heads' attention of q [B, H, Tq, K] over k, v [B / G, H, Tk, K], merged: [B, Tq, D], before w_o.
  Tensor attend(Tensor q, const Tensor& k, const Tensor& v, const Tensor& mask, bool is_causal, int64_t B, int64_t Tq);
  void check_mask(const Tensor& mask, int64_t batch, int64_t tq, int64_t tk) const;
};

// The activations by name, as the layers below and PyTorch's `activation=` take them: "relu",
// "gelu" (erf), "gelu_tanh" (the tanh approximation), "silu" (x * sigmoid(x)), "tanh".
// An unknown name is an Error listing these.
Tensor activation(const std::string& name, const Tensor& x);
void check_activation(const char* layer, const std::string& name);

// Sliding blocks of a batch of images, as torch.nn.functional.unfold (no padding or dilation):
// x [B, C, H, W] -> [B, C * kh * kw, L], L = oh * ow blocks in row-major order, each block's
// values ordered (channel, row, column) as a Conv2d weight [out, C, kh, kw] flattens. With
// stride = kernel these are a ViT's non-overlapping patches (transpose(1, 2): [B, L, C*kh*kw]).
// A composite of Tensor::unfold views, so its gradient comes with them.
Tensor unfold(const Tensor& x, std::array<int64_t, 2> kernel_size, std::array<int64_t, 2> stride);

// FFN(x) = W_2 dropout(act(W_1 x + b_1)) + b_2, act = relu (the paper's) or another activation.
class PositionwiseFeedForward : public Module {
 public:
  PositionwiseFeedForward(int64_t d_model, int64_t d_ff, double dropout = 0.0, std::string activation = "relu");
  Tensor forward(const Tensor& x) const;
  std::shared_ptr<Linear> w_1, w_2;
  std::shared_ptr<Dropout> dropout;
  std::string activation;
};

// ---- activation modules (no parameters), so that Sequential can hold an MLP
class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) const { return relu(x); }
};
class GELU : public Module {
 public:
  explicit GELU(std::string approximate = "none") : approximate(std::move(approximate)) {}
  Tensor forward(const Tensor& x) const { return gelu(x, approximate); }
  std::string approximate;  // "none" (erf) or "tanh", as torch.nn.GELU
};
class SiLU : public Module {
 public:
  Tensor forward(const Tensor& x) const { return activation("silu", x); }
};
class Tanh : public Module {
 public:
  Tensor forward(const Tensor& x) const { return tanh(x); }
};
// Any function of one tensor as a module (libtorch's torch::nn::Functional):
// seq.add(std::make_shared<Functional>([](const Tensor& x) { return x.flatten(1); })).
class Functional : public Module {
 public:
  explicit Functional(std::function<Tensor(const Tensor&)> fn) : fn_(std::move(fn)) {}
  Tensor forward(const Tensor& x) const { return fn_(x); }

 private:
  std::function<Tensor(const Tensor&)> fn_;
};

// ---- the Transformer encoder block, one class for every encoder in the zoo (the translation
// Transformer's, the BERT-style text encoder's, the ViT's), under PyTorch's class names (its
// parameters keep the translation Transformer's names: see below).
// Fields and defaults as torch.nn.TransformerEncoderLayer's, batch_first included: inputs are
// [T, B, D] unless it is set (the zoo's models set it).
struct TransformerEncoderLayerOptions {
  TransformerEncoderLayerOptions(int64_t d_model, int64_t nhead) : d_model(d_model), nhead(nhead) {}
  int64_t d_model, nhead;
  int64_t dim_feedforward = 2048;
  double dropout = 0.1;
  std::string activation = "relu";  // see activation()
  double layer_norm_eps = 1e-5;
  bool norm_first = false;  // pre-norm: x + Dropout(Sublayer(LayerNorm(x)))
  bool batch_first = false;  // PyTorch's default: x [T, B, D]; true: [B, T, D]
};

// Self-attention then the feed-forward network, each with dropout, a residual and a LayerNorm
// (after, as the paper; before with norm_first). Parameters: self_attn.{w_q,w_k,w_v,w_o}, ff.{w_1,w_2},
// norm1, norm2 (the translation Transformer's names, which its checkpoints and its PyTorch twin use).
class TransformerEncoderLayer : public Module {
 public:
  explicit TransformerEncoderLayer(const TransformerEncoderLayerOptions& options);
  // x [B, T, D] -> [B, T, D] with batch_first, else [T, B, D] -> [T, B, D]. mask: bool, true = masked
  // out (a key padding mask [B, 1, 1, T], an attention mask [T, T], in either layout), as
  // torch.nn.TransformerEncoderLayer's src_mask; is_causal masks the future.
  // In eval mode on the CPU with a key padding mask, everything but the attention itself skips the padded
  // rows, whose outputs are then zeros, as PyTorch's fast path (Note [Packed rows] in layers.cpp).
  Tensor forward(const Tensor& x, const Tensor& mask = Tensor(), bool is_causal = false);
  std::shared_ptr<MultiHeadAttention> self_attn;
  std::shared_ptr<PositionwiseFeedForward> ff;
  std::shared_ptr<LayerNorm> norm1, norm2;
  std::shared_ptr<Dropout> dropout;
  bool norm_first, batch_first;

 private:
  Tensor forward_batch_first(const Tensor& x, const Tensor& mask, bool is_causal);
  Tensor forward_packed(const Tensor& x, const Tensor& mask, const PackedRows& packed);
};

// num_layers blocks, registered as layers.0, layers.1, ..., then an optional final LayerNorm
// ("norm": a pre-norm stack needs one), as torch.nn.TransformerEncoder(layer, num_layers, norm).
class TransformerEncoder : public Module {
 public:
  TransformerEncoder(const TransformerEncoderLayerOptions& layer, int64_t num_layers, bool final_norm = false);
  Tensor forward(const Tensor& x, const Tensor& mask = Tensor(), bool is_causal = false);
  std::shared_ptr<ModuleList> layers;
  std::shared_ptr<LayerNorm> norm;  // null without final_norm
};

// x + PE[offset : offset + T], then dropout. The table grows on demand, so any length works.
class PositionalEncoding : public Module {
 public:
  PositionalEncoding(int64_t d_model, double dropout = 0.0, int64_t max_len = 512);
  Tensor forward(const Tensor& x, int64_t offset = 0);  // [B, T, D]
  std::shared_ptr<Dropout> dropout;
  int64_t d_model;

 private:
  Tensor table_;  // [max_len, D], float32; not state: it is a function of d_model
  void grow(int64_t len);
};

}  // namespace tapestry::nn
