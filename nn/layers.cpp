// Layer implementations (see layers.h).
#include "tapestry/nn/layers.h"

#include <cmath>

namespace tapestry::nn {

Linear::Linear(int64_t in, int64_t out, bool with_bias) {
  TP_CHECK(in > 0 && out > 0, "Linear: features must be positive, got in={} out={}", in, out);
  double bound = 1.0 / std::sqrt(static_cast<double>(in));
  register_parameter("weight", weight, empty({out, in}).uniform_(-bound, bound));
  if (with_bias) register_parameter("bias", bias, empty({out}).uniform_(-bound, bound));
}

Tensor Linear::forward(const Tensor& x) const {
  TP_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), "Linear: input of shape {} does not end in in_features={}",
           x.sizes(), weight.size(1));
  const bool records = GradMode::is_enabled() &&
                       (x.requires_grad() || weight.requires_grad() || (bias.defined() && bias.requires_grad()));
  Tensor y;
  if (!is_training() && weight.device().is_cpu() && weight.dtype() == DType::Float32 &&
      x.dtype() == DType::Float32 && x.numel() > 0) {
    // Eval mode multiplies by W^T laid out [in, out] whether or not gradients are recorded, so an
    // eval output never depends on which tensors require grad; only inference reuses the copy.
    Shape out_shape = x.sizes();
    out_shape.back() = weight.size(0);
    y = matmul(x.reshape({-1, weight.size(1)}), records ? weight.t().contiguous() : transposed_weight());
    if (bias.defined()) {
      if (records) y = add(y, bias);
      else y.add_(bias);
    }
    y = y.reshape(out_shape);
  } else {
    {  // training (or another device) frees the copy, and the old weight it holds
      std::lock_guard<std::mutex> lock(wt_cache_->mutex);
      wt_cache_->wt = wt_cache_->of = Tensor();
    }
    y = linear(x, weight, bias);
  }
  if (!lora_A) return y;
  const Tensor in = lora_dropout > 0 ? dropout(x, lora_dropout, is_training()) : x;
  return add(y, mul(lora_B->forward(lora_A->forward(in)), lora_scale));
}

Tensor Linear::transposed_weight() const {
  std::lock_guard<std::mutex> lock(wt_cache_->mutex);  // forward is const: callers may share a module
  TransposedCache& c = *wt_cache_;
  if (!c.wt.defined() || c.of.storage() != weight.storage() || c.of.offset() != weight.offset() ||
      c.of.sizes() != weight.sizes() || c.of.strides() != weight.strides() || c.version != weight.version()) {
    NoGradGuard no_grad;
    c.wt = weight.t().contiguous();
    c.of = weight, c.version = weight.version();
  }
  return c.wt;
}

Embedding::Embedding(int64_t num, int64_t dim, std::optional<int64_t> padding) {
  if (padding) padding_idx = normalize_padding_idx("Embedding", *padding, num);
  Tensor w = randn({num, dim});
  if (padding_idx) w.select(0, *padding_idx).zero_();
  register_parameter("weight", weight, w);
}

Tensor Embedding::forward(const Tensor& ids) const { return embedding(weight, ids, padding_idx); }

LayerNorm::LayerNorm(int64_t dim, double eps_) : eps(eps_) {
  register_parameter("weight", weight, ones({dim}));
  register_parameter("bias", bias, zeros({dim}));
}

Tensor LayerNorm::forward(const Tensor& x) const { return layer_norm(x, {weight.size(0)}, weight, bias, eps); }

RMSNorm::RMSNorm(int64_t dim, std::optional<double> eps_) : eps(eps_) { register_parameter("weight", weight, ones({dim})); }

Tensor RMSNorm::forward(const Tensor& x) const { return rms_norm(x, {weight.size(0)}, weight, eps); }

Dropout::Dropout(double p_) : p(p_) {
  TP_CHECK(p >= 0 && p < 1, "Dropout: probability must be in [0, 1), got {}", p);
}

Tensor Dropout::forward(const Tensor& x) const { return dropout(x, p, is_training()); }

Tensor Sequential::forward(Tensor x) const {
  for (const auto& f : steps_) x = f(x);
  return x;
}

MultiHeadAttention::MultiHeadAttention(int64_t d_model_, int64_t heads_, double p)
    : d_model(d_model_), heads(heads_) {
  TP_CHECK(heads > 0 && d_model % heads == 0, "MultiHeadAttention: d_model {} is not divisible by {} heads", d_model,
           heads);
  d_k = d_model / heads;
  w_q = register_module("w_q", std::make_shared<Linear>(d_model, d_model));
  w_k = register_module("w_k", std::make_shared<Linear>(d_model, d_model));
  w_v = register_module("w_v", std::make_shared<Linear>(d_model, d_model));
  w_o = register_module("w_o", std::make_shared<Linear>(d_model, d_model));
  dropout = register_module("dropout", std::make_shared<Dropout>(p));
}

bool KVCache::in_room() const {
  auto starts = [](const Tensor& view, const Tensor& room) {
    // Storage and offset, not raw_data(): on a device the host may not touch its memory.
    return room.defined() && view.storage() == room.storage() && view.offset() == room.offset() &&
           view.strides() == room.strides() && view.size(0) == room.size(0) && view.size(2) <= room.size(2);
  };
  return starts(k, k_room) && starts(v, v_room);
}

void KVCache::append(Tensor& k_new, Tensor& v_new) {
  if (!k.defined()) {  // the first keys are kept as they come (a cross-attention's never grow)
    k = k_new, v = v_new;
    return;
  }
  if (GradMode::is_enabled() && (k.requires_grad() || v.requires_grad() || k_new.requires_grad() ||
                                 v_new.requires_grad())) {
    k_room = v_room = Tensor();
    k = k_new = cat({k, k_new}, 2);
    v = v_new = cat({v, v_new}, 2);
    return;
  }
  const int64_t T = k.size(2), n = k_new.size(2);
  if (!in_room() || T + n > k_room.size(2)) {
    auto grow = [&](const Tensor& held) {
      Shape shape = held.sizes();
      shape[2] = std::max<int64_t>(2 * (T + n), 16);
      Tensor room = empty(shape, held.options());  // positions past T are written before they are read
      room.narrow(2, 0, T).copy_(held);
      return room;
    };
    k_room = grow(k), v_room = grow(v);
  }
  k_room.narrow(2, T, n).copy_(k_new);
  v_room.narrow(2, T, n).copy_(v_new);
  k = k_new = k_room.narrow(2, 0, T + n);
  v = v_new = v_room.narrow(2, 0, T + n);
}

namespace {
// Whether keeping rows `rows` (row i of the result is row rows[i]) can move rows within the tensor:
// every moved row comes from past the kept ones, so copying in increasing i never overwrites a row
// still to be read. A batch whose finished rows were filled from its end has this shape.
// (Any index out of range is left to index_select, which names it.)
bool rows_movable_in_place(const std::vector<int64_t>& rows, int64_t size) {
  const int64_t n = static_cast<int64_t>(rows.size());
  for (int64_t i = 0; i < n; ++i)
    if (rows[i] < 0 || rows[i] >= size || (rows[i] != i && rows[i] < n)) return false;
  return true;
}
}  // namespace

void KVCache::select_rows(const Tensor& index) {
  if (!k.defined()) return;
  // Rows moved in place (Note [Rows leaving a batch]) where the cache alone holds its tensors (a
  // view handed out earlier would see the move) and nothing records gradients.
  const int64_t holders = in_room() ? 2 : 1;  // the room and its view, or the tensor alone
  if (index.device().is_cpu() && !k.requires_grad() && !v.requires_grad() &&
      k.impl().storage.use_count() == holders && v.impl().storage.use_count() == holders &&
      k.impl_ptr().use_count() == 1 && v.impl_ptr().use_count() == 1) {
    const std::vector<int64_t> rows = index.to_vector<int64_t>();
    if (rows_movable_in_place(rows, k.size(0))) {
      NoGradGuard no_grad;
      const int64_t n = static_cast<int64_t>(rows.size());
      for (int64_t i = 0; i < n; ++i)
        if (rows[i] != i) {
          k.select(0, i).copy_(k.select(0, rows[i]));
          v.select(0, i).copy_(v.select(0, rows[i]));
        }
      k = k.narrow(0, 0, n), v = v.narrow(0, 0, n);
      if (holders == 2) k_room = k_room.narrow(0, 0, n), v_room = v_room.narrow(0, 0, n);
      return;
    }
  }
  if (in_room() && index.numel() <= k_room.size(0) && !k.requires_grad() && !v.requires_grad() &&
      k_room.impl().storage.use_count() == 2 && v_room.impl().storage.use_count() == 2 &&
      k.impl_ptr().use_count() == 1 && v.impl_ptr().use_count() == 1) {
    // Any device (a GPU's index is not read on the host): the live rows are gathered, then
    // written back at the head of the room, which keeps its storage. Only the T filled positions
    // move, not the room's whole length, and no new room is allocated.
    NoGradGuard no_grad;
    const int64_t n = index.numel(), T = k.size(2);
    const Tensor picked_k = index_select(k, 0, index), picked_v = index_select(v, 0, index);
    k_room = k_room.narrow(0, 0, n), v_room = v_room.narrow(0, 0, n);
    k = k_room.narrow(2, 0, T), v = v_room.narrow(2, 0, T);
    k.copy_(picked_k), v.copy_(picked_v);
    return;
  }
  if (in_room()) {  // the room moves with its rows, so the next steps still write in place
    const int64_t T = k.size(2);
    k_room = index_select(k_room, 0, index), v_room = index_select(v_room, 0, index);
    k = k_room.narrow(2, 0, T), v = v_room.narrow(2, 0, T);
    return;
  }
  k = index_select(k, 0, index), v = index_select(v, 0, index);
}

Tensor causal_mask(int64_t tq, int64_t tk, Device device) {
  // Made on the device, a fill and a triangle: ranges made on the host would be copied up every
  // forward, a synchronisation each on a GPU.
  return triu(full({tq, tk}, 1.0, TensorOptions(DType::Bool, device)), 1);
}

Tensor MultiHeadAttention::split_heads(const Tensor& x) const {
  return x.view({x.size(0), x.size(1), heads, d_k}).transpose(1, 2);
}

// The mask must be Bool (true = masked out) and broadcast to the scores [B, H, Tq, Tk]; a wrong
// one is named here, with the layer, rather than deep inside masked_fill.
void MultiHeadAttention::check_mask(const Tensor& mask, int64_t batch, int64_t tq, int64_t tk) const {
  TP_CHECK(mask.dtype() == DType::Bool, "{}: the mask must be Bool (true = masked out), got {} {}; for an additive "
           "float mask use mask != 0 or a comparison", describe("MultiHeadAttention"), mask.dtype(), mask.sizes());
  const Shape want = {batch, heads, tq, tk};
  bool fits = mask.dim() <= 4;
  for (int64_t i = 1; fits && i <= mask.dim(); ++i) {
    const int64_t m = mask.size(mask.dim() - i), w = want[static_cast<size_t>(4 - i)];
    fits = m == w || m == 1;
  }
  TP_CHECK(fits, "{}: the mask {} does not broadcast to the attention scores [B, H, Tq, Tk] = {}",
           describe("MultiHeadAttention"), mask.sizes(), want);
}

Tensor MultiHeadAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& mask,
                                   KVCache* cache, bool static_kv, bool is_causal) {
  TP_CHECK(query.dim() == 3 && key.dim() == 3 && value.dim() == 3 && query.size(2) == d_model &&
               key.size(2) == d_model && value.size(2) == d_model && key.size(1) == value.size(1) &&
               key.size(0) == value.size(0) && key.size(0) > 0 && query.size(0) % key.size(0) == 0,
           "{}: expected query [B, Tq, {}] and key/value [B, Tk, {}] (or [B / G, Tk, {}]: G query rows per key "
           "row), got {}, {}, {}", describe("MultiHeadAttention"), d_model, d_model, d_model, query.sizes(), key.sizes(),
           value.sizes());
  Tensor q = split_heads(w_q->forward(query));  // [B, H, Tq, K]
  Tensor k, v;                                  // [B / G, H, Tk, K]
  if (cache && static_kv && cache->k.defined()) {
    k = cache->k;
    v = cache->v;
  } else {
    k = split_heads(w_k->forward(key));
    v = split_heads(w_v->forward(value));
    if (cache) cache->append(k, v);
  }
  TP_CHECK(!cache || !cache->k.defined() || cache->k.size(0) == key.size(0),
           "{}: the cache holds {} rows of keys, the key input has {}", describe("MultiHeadAttention"),
           cache && cache->k.defined() ? cache->k.size(0) : 0, key.size(0));
  TP_CHECK(query.size(0) == key.size(0) || !is_causal,
           "{}: is_causal needs one key row per query row, got query {} and key {}", describe("MultiHeadAttention"),
           query.sizes(), key.sizes());
  return w_o->forward(attend(q, k, v, mask, is_causal, query.size(0), query.size(1)));
}

Tensor MultiHeadAttention::attend(Tensor q, const Tensor& k, const Tensor& v, const Tensor& mask, bool is_causal,
                                  int64_t B, int64_t Tq) {
  // G query rows per key row (a beam's rows against their sentence's memory): the G rows' queries
  // become G * Tq queries of one key row, so keys and values are never repeated G times.
  const int64_t G = B / k.size(0);
  if (G > 1) q = q.reshape({B / G, G, heads, Tq, d_k}).permute({0, 2, 1, 3, 4}).reshape({B / G, heads, G * Tq, d_k});
  if (mask.defined()) check_mask(mask, q.size(0), q.size(2), k.size(2));
  TP_CHECK(!is_causal || q.size(2) == k.size(2) || q.size(2) == 1,
           "{}: is_causal needs as many queries as keys (or one query, which sees every key), got Tq {} and Tk {}",
           describe("MultiHeadAttention"), q.size(2), k.size(2));
  // One query against a cache sees every key: nothing of it lies in the future.
  const bool causal = is_causal && q.size(2) > 1;
  if (attention_hook_) {
    // The fused kernel never forms the weights; recompute them for the hook, without gradients.
    NoGradGuard no_grad;
    Tensor scores = matmul(q, k.transpose(-1, -2)) * (1.0 / std::sqrt(static_cast<double>(d_k)));
    if (mask.defined()) scores = masked_fill(scores, mask, -1e9);
    if (causal) scores = masked_fill(scores, causal_mask(q.size(2), k.size(2), q.device()), -1e9);
    Tensor weights = softmax(scores, -1);  // [B / G, H, G * Tq, Tk]: the hook sees [B, H, Tq, Tk]
    if (G > 1)
      weights = weights.reshape({B / G, heads, G, Tq, k.size(2)}).permute({0, 2, 1, 3, 4}).reshape({B, heads, Tq, k.size(2)});
    attention_hook_(weights);
  }
  const double p = is_training() ? dropout->p : 0.0;
  Tensor ctx = scaled_dot_product_attention_masked_out(q, k, v, mask, causal, p);  // [B / G, H, G * Tq, K]
  if (G > 1) ctx = ctx.reshape({B / G, heads, G, Tq, d_k}).permute({0, 2, 1, 3, 4}).reshape({B, heads, Tq, d_k});
  return ctx.transpose(1, 2).reshape({B, Tq, d_model});
}

// Note [Packed rows]: an encoder batch of sentences of unequal length is mostly padding (about
// half of a batch of 64 consecutive test sentences of Multi30k), and every position-wise part of
// the block (the four projections, the feed-forward network, residuals and norms: all of its
// multiplications but the attention's own) would compute rows nobody reads. In eval mode on the
// CPU with a key padding mask, those parts run on the kept rows alone, gathered into [N, D]. The attention
// runs padded: q, k and v are spread back to [B, T, D] by a row gather that fills a padded
// position with a copy of a kept row of its sentence (its key is masked and its query's output
// dropped, so any finite row serves). The block's output rows at padded positions are zeros, as
// PyTorch's fast path gives (its nested tensors come back padded with 0); nothing reads them:
// padded keys are masked in every later attention. A sentence that is all padding turns packing
// off, since its queries attend evenly and a later cross-attention reads them. Training never
// packs: its batches group similar lengths, and its outputs stay those of the plain path.
PackedRows PackedRows::of(const Tensor& x, const Tensor& mask) {
  PackedRows p;
  // CPU tensors only: on a GPU the padded rows run in parallel with the rest, and reading the mask
  // would be a synchronisation per layer.
  if (!x.device().is_cpu() || !mask.defined() || x.dim() != 3 || mask.dim() != 4 || mask.dtype() != DType::Bool)
    return p;
  const int64_t B = x.size(0), T = x.size(1);
  if (mask.size(0) != B || mask.size(1) != 1 || mask.size(2) != 1 || mask.size(3) != T) return p;
  const std::vector<bool> masked = mask.to_vector<bool>();
  std::vector<int64_t> rows, spread(static_cast<size_t>(B * T)), place(static_cast<size_t>(B * T));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t first = static_cast<int64_t>(rows.size());
    for (int64_t t = 0; t < T; ++t)
      if (!masked[static_cast<size_t>(b * T + t)]) rows.push_back(b * T + t);
    if (static_cast<int64_t>(rows.size()) == first) return p;
    for (int64_t t = 0, next = first; t < T; ++t) {
      const size_t i = static_cast<size_t>(b * T + t);
      spread[i] = masked[i] ? first : next;
      place[i] = masked[i] ? -1 : next++;
    }
  }
  const int64_t N = static_cast<int64_t>(rows.size());
  if (N == B * T) return p;
  for (int64_t& i : place) i = i < 0 ? N : i;  // the zero row unpack appends
  p.rows = tensor(rows), p.spread = tensor(spread), p.place = tensor(place);
  p.batch = B, p.length = T;
  return p;
}

Tensor PackedRows::pack(const Tensor& padded) const {
  return index_select(padded.reshape({batch * length, padded.size(-1)}), 0, rows);
}

Tensor PackedRows::unpack(const Tensor& packed) const {
  // A gather of row copies (a scatter would go element by element), differentiable: eval mode may
  // record gradients.
  const Tensor with_zero_row = cat({packed, zeros({1, packed.size(1)}, {packed.dtype(), packed.device()})}, 0);
  return index_select(with_zero_row, 0, place).view({batch, length, packed.size(1)});
}

Tensor MultiHeadAttention::forward_packed(const Tensor& x, const PackedRows& packed, const Tensor& mask) {
  TP_CHECK(x.dim() == 2 && x.size(1) == d_model && x.size(0) == packed.rows.size(0),
           "{}: expected packed rows [{}, {}], got {}", describe("MultiHeadAttention"), packed.rows.size(0), d_model,
           x.sizes());
  const int64_t B = packed.batch, T = packed.length;
  auto spread = [&](const Tensor& t) { return split_heads(index_select(t, 0, packed.spread).view({B, T, d_model})); };
  const Tensor ctx = attend(spread(w_q->forward(x)), spread(w_k->forward(x)), spread(w_v->forward(x)), mask, false, B, T);
  return w_o->forward(packed.pack(ctx));
}

namespace {
const char* const kActivations = "relu, gelu, gelu_tanh, silu, tanh";
}  // namespace

void check_activation(const char* layer, const std::string& name) {
  TP_CHECK(name == "relu" || name == "gelu" || name == "gelu_tanh" || name == "silu" || name == "tanh",
           "{}: unknown activation '{}' (expected one of {})", layer, name, kActivations);
}

Tensor unfold(const Tensor& x, std::array<int64_t, 2> kernel_size, std::array<int64_t, 2> stride) {
  TP_CHECK(x.dim() == 4, "unfold: input must be [B, C, H, W], got shape {}", x.sizes());
  const auto [kh, kw] = kernel_size;
  const auto [sh, sw] = stride;
  TP_CHECK(kh > 0 && kw > 0 && sh > 0 && sw > 0, "unfold: kernel_size ({}, {}) and stride ({}, {}) must be positive",
           kh, kw, sh, sw);
  TP_CHECK(kh <= x.size(2) && kw <= x.size(3), "unfold: kernel_size ({}, {}) exceeds the image {} of input {}", kh, kw,
           Shape{x.size(2), x.size(3)}, x.sizes());
  // [B, C, oh, ow, kh, kw] -> [B, C, kh, kw, oh, ow] -> [B, C*kh*kw, oh*ow]
  Tensor blocks = x.unfold(2, kh, sh).unfold(3, kw, sw);
  const int64_t B = x.size(0), C = x.size(1), oh = blocks.size(2), ow = blocks.size(3);
  return blocks.permute({0, 1, 4, 5, 2, 3}).reshape({B, C * kh * kw, oh * ow});
}

Tensor activation(const std::string& name, const Tensor& x) {
  if (name == "relu") return relu(x);
  if (name == "gelu") return gelu(x);
  if (name == "gelu_tanh") return gelu(x, "tanh");
  if (name == "silu") return x * sigmoid(x);
  if (name == "tanh") return tanh(x);
  check_activation("activation", name);
  return x;  // not reached
}

PositionwiseFeedForward::PositionwiseFeedForward(int64_t d_model, int64_t d_ff, double p, std::string activation_)
    : activation(std::move(activation_)) {
  check_activation("PositionwiseFeedForward", activation);
  w_1 = register_module("w_1", std::make_shared<Linear>(d_model, d_ff));
  w_2 = register_module("w_2", std::make_shared<Linear>(d_ff, d_model));
  dropout = register_module("dropout", std::make_shared<Dropout>(p));
}

Tensor PositionwiseFeedForward::forward(const Tensor& x) const {
  return w_2->forward(dropout->forward(nn::activation(activation, w_1->forward(x))));
}

TransformerEncoderLayer::TransformerEncoderLayer(const TransformerEncoderLayerOptions& o)
    : norm_first(o.norm_first), batch_first(o.batch_first) {
  TP_CHECK(o.d_model > 0 && o.nhead > 0 && o.dim_feedforward > 0,
           "TransformerEncoderLayer: d_model {}, nhead {} and dim_feedforward {} must be positive", o.d_model, o.nhead,
           o.dim_feedforward);
  self_attn = register_module("self_attn", std::make_shared<MultiHeadAttention>(o.d_model, o.nhead, o.dropout));
  ff = register_module("ff", std::make_shared<PositionwiseFeedForward>(o.d_model, o.dim_feedforward, o.dropout,
                                                                       o.activation));
  norm1 = register_module("norm1", std::make_shared<LayerNorm>(o.d_model, o.layer_norm_eps));
  norm2 = register_module("norm2", std::make_shared<LayerNorm>(o.d_model, o.layer_norm_eps));
  dropout = register_module("dropout", std::make_shared<Dropout>(o.dropout));
}

Tensor TransformerEncoderLayer::forward(const Tensor& x, const Tensor& mask, bool is_causal) {
  TP_CHECK(x.dim() == 3, "TransformerEncoderLayer: expected x {} of shape {}, got {}",
           batch_first ? "(batch_first)" : "(batch_first = false, PyTorch's default)", batch_first ? "[B, T, D]" : "[T, B, D]",
           x.sizes());
  if (batch_first) return forward_batch_first(x, mask, is_causal);
  return forward_batch_first(x.transpose(0, 1).contiguous(), mask, is_causal).transpose(0, 1).contiguous();
}

Tensor TransformerEncoderLayer::forward_batch_first(const Tensor& x, const Tensor& mask, bool is_causal) {
  if (!is_training() && !is_causal) {
    if (PackedRows packed = PackedRows::of(x, mask); packed.defined()) return forward_packed(x, mask, packed);
  }
  if (norm_first) {
    Tensor h = norm1->forward(x);
    Tensor y = x + dropout->forward(self_attn->forward(h, h, h, mask, nullptr, false, is_causal));
    return y + dropout->forward(ff->forward(norm2->forward(y)));
  }
  Tensor y = norm1->forward(x + dropout->forward(self_attn->forward(x, x, x, mask, nullptr, false, is_causal)));
  return norm2->forward(y + dropout->forward(ff->forward(y)));
}

Tensor TransformerEncoderLayer::forward_packed(const Tensor& x, const Tensor& mask, const PackedRows& packed) {
  const Tensor xp = packed.pack(x);  // [N, D]; eval mode: no dropout
  if (norm_first) {
    const Tensor y = xp + self_attn->forward_packed(norm1->forward(xp), packed, mask);
    return packed.unpack(y + ff->forward(norm2->forward(y)));
  }
  const Tensor y = norm1->forward(xp + self_attn->forward_packed(xp, packed, mask));
  return packed.unpack(norm2->forward(y + ff->forward(y)));
}

TransformerEncoder::TransformerEncoder(const TransformerEncoderLayerOptions& layer, int64_t num_layers,
                                       bool final_norm) {
  TP_CHECK(num_layers >= 0, "TransformerEncoder: num_layers must be >= 0, got {}", num_layers);
  layers = register_module("layers", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < num_layers; ++i) layers->push_back(std::make_shared<TransformerEncoderLayer>(layer));
  if (final_norm) norm = register_module("norm", std::make_shared<LayerNorm>(layer.d_model, layer.layer_norm_eps));
}

Tensor TransformerEncoder::forward(const Tensor& x, const Tensor& mask, bool is_causal) {
  Tensor y = x;
  for (size_t i = 0; i < layers->size(); ++i) {
    const std::shared_ptr<TransformerEncoderLayer> layer = layers->at<TransformerEncoderLayer>(i);
    if (checkpoint_blocks())
      y = checkpoint([layer, mask, is_causal](const TensorList& in) { return layer->forward(in[0], mask, is_causal); }, {y});
    else
      y = layer->forward(y, mask, is_causal);
  }
  return norm ? norm->forward(y) : y;
}

PositionalEncoding::PositionalEncoding(int64_t d_model_, double p, int64_t max_len) : d_model(d_model_) {
  dropout = register_module("dropout", std::make_shared<Dropout>(p));
  grow(max_len);
}

void PositionalEncoding::grow(int64_t len) {
  // PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(pos / 10000^(2i/D))
  const Device device = table_.defined() ? table_.device() : Device::CPU;
  table_ = empty({len, d_model});  // written on the host, then moved to where the old table was
  float* p = table_.data_ptr<float>();
  for (int64_t pos = 0; pos < len; ++pos)
    for (int64_t i = 0; i < d_model; i += 2) {
      double angle = static_cast<double>(pos) / std::pow(10000.0, static_cast<double>(i) / d_model);
      p[pos * d_model + i] = static_cast<float>(std::sin(angle));
      if (i + 1 < d_model) p[pos * d_model + i + 1] = static_cast<float>(std::cos(angle));
    }
  table_ = table_.to(device);
}

Tensor PositionalEncoding::forward(const Tensor& x, int64_t offset) {
  TP_CHECK(x.dim() == 3 && x.size(2) == d_model, "PositionalEncoding: expected [B, T, {}], got {}", d_model,
           x.sizes());
  int64_t end = offset + x.size(1);
  if (table_.device() != x.device()) table_ = table_.to(x.device());  // moved once, kept there
  if (end > table_.size(0)) grow(std::max(end, 2 * table_.size(0)));
  Tensor pe = table_.slice(0, offset, end);
  if (x.dtype() != pe.dtype()) pe = pe.to(x.dtype());
  return dropout->forward(x + pe);
}

}  // namespace tapestry::nn
