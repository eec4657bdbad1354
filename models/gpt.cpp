// GPT implementation (see gpt.h).
#include "tapestry/models/gpt.h"

#include <cmath>

#include "tapestry/nn/safetensors.h"

namespace tapestry::models {

GPTConfig GPTConfig::named(const std::string& name, int64_t vocab) {
  GPTConfig c;
  c.vocab = vocab;
  if (name == "tiny") {
    c.layers = 2, c.heads = 2, c.d_model = 64, c.block_size = 64;
  } else if (name == "mini") {
    c.layers = 4, c.heads = 4, c.d_model = 128, c.block_size = 128;
  } else if (name == "small") {
    c.layers = 6, c.heads = 6, c.d_model = 384, c.block_size = 256, c.dropout = 0.2;
  } else if (name == "medium") {
    c.layers = 8, c.heads = 8, c.d_model = 512, c.block_size = 512;
  } else if (name == "gpt2") {
    c.layers = 12, c.heads = 12, c.d_model = 768, c.block_size = 1024;
  } else {
    throw Error(fmt::format("GPTConfig: unknown config '{}' (expected one of {})", name, fmt::join(names(), ", ")));
  }
  return c;
}

std::vector<std::string> GPTConfig::names() { return {"tiny", "mini", "small", "medium", "gpt2"}; }

void GPTConfig::validate() const {
  TP_CHECK(vocab > 0, "GPTConfig: vocab must be positive, got {}", vocab);
  TP_CHECK(block_size > 0 && layers > 0, "GPTConfig: block_size and layers must be positive, got {} and {}",
           block_size, layers);
  TP_CHECK(d_model > 0 && heads > 0 && d_model % heads == 0, "GPTConfig: d_model {} is not divisible by heads {}",
           d_model, heads);
  TP_CHECK(d_ff >= 0, "GPTConfig: d_ff must be non-negative (0: 4 * d_model), got {}", d_ff);
  TP_CHECK(dropout >= 0 && dropout < 1, "GPTConfig: dropout must be in [0, 1), got {}", dropout);
  TP_CHECK(ln_eps > 0, "GPTConfig: ln_eps must be positive, got {}", ln_eps);
}

GPTMLP::GPTMLP(int64_t d_model, int64_t d_ff, double p, bool tanh) : gelu_tanh(tanh) {
  fc = register_module("fc", std::make_shared<nn::Linear>(d_model, d_ff));
  proj = register_module("proj", std::make_shared<nn::Linear>(d_ff, d_model));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(p));
}

Tensor GPTMLP::forward(const Tensor& x) const {
  return dropout->forward(proj->forward(gelu(fc->forward(x), gelu_tanh ? "tanh" : "none")));
}

GPTBlock::GPTBlock(const GPTConfig& c) {
  ln_1 = register_module("ln_1", std::make_shared<nn::LayerNorm>(c.d_model, c.ln_eps));
  attn = register_module("attn", std::make_shared<nn::MultiHeadAttention>(c.d_model, c.heads, c.dropout));
  ln_2 = register_module("ln_2", std::make_shared<nn::LayerNorm>(c.d_model, c.ln_eps));
  mlp = register_module("mlp", std::make_shared<GPTMLP>(c.d_model, c.ff_dim(), c.dropout, c.gelu_tanh));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(c.dropout));
}

Tensor GPTBlock::forward(const Tensor& x, const Tensor& mask, bool causal, nn::KVCache* cache) {
  Tensor h = ln_1->forward(x);
  Tensor y = x + dropout->forward(attn->forward(h, h, h, mask, cache, false, causal));
  return y + mlp->forward(ln_2->forward(y));
}

GPT::GPT(const GPTConfig& c) : config(c) {
  c.validate();
  wte = register_module("wte", std::make_shared<nn::Embedding>(c.vocab, c.d_model));
  wpe = register_module("wpe", std::make_shared<nn::Embedding>(c.block_size, c.d_model));
  drop = register_module("drop", std::make_shared<nn::Dropout>(c.dropout));
  blocks = register_module("blocks", std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < c.layers; ++i) blocks->push_back(std::make_shared<GPTBlock>(c));
  ln_f = register_module("ln_f", std::make_shared<nn::LayerNorm>(c.d_model, c.ln_eps));
  head = register_module("head", std::make_shared<nn::Linear>(c.d_model, c.vocab, false));
  head->tie_parameter("weight", wte->weight);

  // GPT-2's initialization: N(0, 0.02) for every matrix, zero biases, and the projections that
  // write into the residual stream scaled by 1/sqrt(2 * layers) (one per sublayer).
  NoGradGuard no_grad;
  for (auto& [name, p] : named_parameters()) {
    if (p.dim() < 2) continue;
    p.normal_(0.0, 0.02);
  }
  const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.layers));
  for (size_t i = 0; i < blocks->size(); ++i) {
    auto b = blocks->at<GPTBlock>(i);
    b->attn->w_o->weight.normal_(0.0, proj_std);
    b->mlp->proj->weight.normal_(0.0, proj_std);
    for (Tensor* bias : {&b->attn->w_q->bias, &b->attn->w_k->bias, &b->attn->w_v->bias, &b->attn->w_o->bias,
                         &b->mlp->fc->bias, &b->mlp->proj->bias})
      bias->zero_();
  }
}

Tensor GPT::forward(const Tensor& ids_in, GPTCache* cache, const Tensor& positions_in, const Tensor& mask_in) {
  // Inputs may come from the host: they go to the model's device (one copy per batch).
  const Device device = wte->weight.device();
  const Tensor ids = ids_in.to(device);
  const Tensor positions = positions_in.defined() ? positions_in.to(device) : positions_in;
  const Tensor mask = mask_in.defined() ? mask_in.to(device) : mask_in;
  const int64_t T = ids.size(1), past = cache ? cache->length() : 0;
  check_ids(ids, past, "GPT", "block_size", "crop the input or use a config with a longer block_size");
  Tensor pos;
  if (positions.defined()) {
    TP_CHECK(positions.dtype() == DType::Int64 && positions.sizes() == ids.sizes(),
             "GPT: positions must be int64 {} like the ids, got {} {}", ids.sizes(), positions.dtype(),
             positions.sizes());
    pos = wpe->forward(positions);  // [B, T, D]; the embedding checks the range
  } else {
    pos = wpe->forward(position_range(ids.device()).slice(0, past, past + T));  // [T, D]
  }
  Tensor x = drop->forward(wte->forward(ids) + pos);
  // Without cached keys the causal mask is the fused kernel's flag; new tokens after cached
  // ones need it offset by the cache length, so it is spelled out (one query needs none).
  const bool causal = past == 0 && T > 1;
  const Tensor attn_mask = mask_after_cache(position_range(ids.device()), mask, past, T);
  if (cache && cache->layers.empty()) cache->layers.resize(blocks->size());
  for (size_t i = 0; i < blocks->size(); ++i) {
    const std::shared_ptr<GPTBlock> block = blocks->at<GPTBlock>(i);
    if (checkpoint_blocks() && !cache)
      x = checkpoint([block, attn_mask, causal](const TensorList& in) {
        return block->forward(in[0], attn_mask, causal, nullptr);
      }, {x});
    else
      x = block->forward(x, attn_mask, causal, cache ? &cache->layers[i] : nullptr);
  }
  return head->forward(ln_f->forward(x));
}

const Tensor& GPT::position_range(Device device) {
  if (!position_range_.defined() || position_range_.device() != device)
    position_range_ = arange(config.block_size, TensorOptions(DType::Int64, device));
  return position_range_;
}

// Hugging Face stores GPT-2's projections as Conv1D, y = x W + b with W [in, out]; tapestry's
// Linear holds W^T. c_attn packs the query, key and value projections as column thirds.
std::shared_ptr<GPT> load_gpt2_hf(const std::string& path, int64_t heads, double dropout) {
  auto file = nn::load_safetensors(path);
  auto tensors = file.as_map();
  const std::string prefix = tensors.count("transformer.wte.weight") ? "transformer." : "";
  auto get = [&](const std::string& key, const Shape& shape) {
    auto it = tensors.find(prefix + key);
    TP_CHECK(it != tensors.end(), "load_gpt2_hf: {}: '{}' is missing (not a GPT-2 checkpoint in Hugging Face's layout?)",
             path, prefix + key);
    TP_CHECK(it->second.sizes() == shape, "load_gpt2_hf: {}: '{}' is {}, expected {}", path, prefix + key,
             it->second.sizes(), shape);
    TP_CHECK(is_floating(it->second.dtype()), "load_gpt2_hf: {}: '{}' is {}, expected a floating dtype", path,
             prefix + key, it->second.dtype());
    return it->second;
  };
  auto wte_it = tensors.find(prefix + "wte.weight");
  auto wpe_it = tensors.find(prefix + "wpe.weight");
  TP_CHECK(wte_it != tensors.end() && wpe_it != tensors.end() && wte_it->second.dim() == 2 &&
               wpe_it->second.dim() == 2,
           "load_gpt2_hf: {}: no 2-D 'wte.weight' and 'wpe.weight' (not a GPT-2 checkpoint in Hugging Face's layout?)",
           path);
  GPTConfig c;
  c.vocab = wte_it->second.size(0);
  c.d_model = wte_it->second.size(1);
  c.block_size = wpe_it->second.size(0);
  c.heads = heads;
  c.layers = 0;
  while (tensors.count(fmt::format("{}h.{}.ln_1.weight", prefix, c.layers))) ++c.layers;
  TP_CHECK(c.layers > 0, "load_gpt2_hf: {}: no layers ('{}h.0.ln_1.weight' is missing)", path, prefix);
  auto fc_it = tensors.find(prefix + "h.0.mlp.c_fc.weight");
  TP_CHECK(fc_it != tensors.end() && fc_it->second.dim() == 2, "load_gpt2_hf: {}: '{}h.0.mlp.c_fc.weight' is missing",
           path, prefix);
  c.d_ff = fc_it->second.size(1);
  c.dropout = dropout;
  c.gelu_tanh = true;
  TP_CHECK(heads > 0 && c.d_model % heads == 0, "load_gpt2_hf: {}: d_model {} is not divisible by heads {}", path,
           c.d_model, heads);
  auto model = std::make_shared<GPT>(c);
  const int64_t D = c.d_model, F = c.d_ff;
  NoGradGuard no_grad;
  model->wte->weight.copy_(get("wte.weight", {c.vocab, D}));
  model->wpe->weight.copy_(get("wpe.weight", {c.block_size, D}));
  for (int64_t i = 0; i < c.layers; ++i) {
    auto b = model->blocks->at<GPTBlock>(static_cast<size_t>(i));
    const std::string h = fmt::format("h.{}.", i);
    b->ln_1->weight.copy_(get(h + "ln_1.weight", {D}));
    b->ln_1->bias.copy_(get(h + "ln_1.bias", {D}));
    b->ln_2->weight.copy_(get(h + "ln_2.weight", {D}));
    b->ln_2->bias.copy_(get(h + "ln_2.bias", {D}));
    Tensor qkv_w = get(h + "attn.c_attn.weight", {D, 3 * D}), qkv_b = get(h + "attn.c_attn.bias", {3 * D});
    nn::Linear* qkv[3] = {b->attn->w_q.get(), b->attn->w_k.get(), b->attn->w_v.get()};
    for (int64_t j = 0; j < 3; ++j) {
      qkv[j]->weight.copy_(qkv_w.slice(1, j * D, (j + 1) * D).transpose(0, 1));
      qkv[j]->bias.copy_(qkv_b.slice(0, j * D, (j + 1) * D));
    }
    b->attn->w_o->weight.copy_(get(h + "attn.c_proj.weight", {D, D}).transpose(0, 1));
    b->attn->w_o->bias.copy_(get(h + "attn.c_proj.bias", {D}));
    b->mlp->fc->weight.copy_(get(h + "mlp.c_fc.weight", {D, F}).transpose(0, 1));
    b->mlp->fc->bias.copy_(get(h + "mlp.c_fc.bias", {F}));
    b->mlp->proj->weight.copy_(get(h + "mlp.c_proj.weight", {F, D}).transpose(0, 1));
    b->mlp->proj->bias.copy_(get(h + "mlp.c_proj.bias", {D}));
  }
  model->ln_f->weight.copy_(get("ln_f.weight", {D}));
  model->ln_f->bias.copy_(get("ln_f.bias", {D}));
  return model;
}

}  // namespace tapestry::models
