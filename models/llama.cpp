// The Llama-style decoder (see llama.h).
#include "tapestry/models/llama.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <set>

#include "tapestry/autograd/grad_mode.h"
#include "tapestry/nn/safetensors.h"

namespace tapestry::models {

LlamaConfig LlamaConfig::named(const std::string& name, int64_t vocab) {
  LlamaConfig c;
  c.vocab = vocab;
  if (name == "tiny") {
    c.layers = 2, c.heads = 4, c.kv_heads = 2, c.d_model = 64, c.d_ff = 176, c.max_positions = 64;
  } else if (name == "mini") {
    c.layers = 4, c.heads = 4, c.kv_heads = 2, c.d_model = 128, c.d_ff = 384, c.max_positions = 128;
    c.tie_embeddings = true;
  } else {
    throw Error(fmt::format("LlamaConfig: unknown config '{}' (expected one of {})", name, fmt::join(names(), ", ")));
  }
  return c;
}

std::vector<std::string> LlamaConfig::names() { return {"tiny", "mini"}; }

void LlamaConfig::validate() const {
  TP_CHECK(vocab > 0, "LlamaConfig: vocab must be positive, got {}", vocab);
  TP_CHECK(layers > 0 && max_positions > 0 && d_ff > 0,
           "LlamaConfig: layers, max_positions and d_ff must be positive, got {}, {} and {}", layers, max_positions,
           d_ff);
  TP_CHECK(d_model > 0 && heads > 0 && d_model % heads == 0, "LlamaConfig: d_model {} is not divisible by heads {}",
           d_model, heads);
  TP_CHECK(head_dim() % 2 == 0, "LlamaConfig: the head dim {} (d_model / heads) must be even for the rotary pairs",
           head_dim());
  TP_CHECK(kv_heads > 0 && heads % kv_heads == 0, "LlamaConfig: kv_heads {} must divide heads {}", kv_heads, heads);
  TP_CHECK(dropout >= 0 && dropout < 1, "LlamaConfig: dropout must be in [0, 1), got {}", dropout);
  TP_CHECK(rope_theta > 0 && rms_eps >= 0, "LlamaConfig: rope_theta must be positive and rms_eps at least 0, got {} and {}",
           rope_theta, rms_eps);
}

std::pair<Tensor, Tensor> rotary_tables(int64_t positions, int64_t head_dim, double theta) {
  TP_CHECK(positions >= 0 && head_dim > 0 && head_dim % 2 == 0 && theta > 0,
           "rotary_tables: need positions >= 0, an even head_dim and theta > 0, got {}, {} and {}", positions, head_dim,
           theta);
  const int64_t half = head_dim / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv_freq[static_cast<size_t>(i)] = 1.0f / std::pow(static_cast<float>(theta), exponent);
  }
  std::vector<float> c(static_cast<size_t>(positions * half)), s(c.size());
  for (int64_t p = 0; p < positions; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(p) * inv_freq[static_cast<size_t>(i)];
      c[static_cast<size_t>(p * half + i)] = std::cos(angle);
      s[static_cast<size_t>(p * half + i)] = std::sin(angle);
    }
  return {tensor(c, {positions, half}), tensor(s, {positions, half})};
}

LlamaAttention::LlamaAttention(const LlamaConfig& c) : heads(c.heads), kv_heads(c.kv_heads), head_dim(c.head_dim()) {
  q_proj = register_module("q_proj", std::make_shared<nn::Linear>(c.d_model, heads * head_dim, false));
  k_proj = register_module("k_proj", std::make_shared<nn::Linear>(c.d_model, kv_heads * head_dim, false));
  v_proj = register_module("v_proj", std::make_shared<nn::Linear>(c.d_model, kv_heads * head_dim, false));
  o_proj = register_module("o_proj", std::make_shared<nn::Linear>(heads * head_dim, c.d_model, false));
}

Tensor LlamaAttention::forward(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& masked_out,
                               bool causal, nn::KVCache* cache) const {
  const int64_t B = x.size(0), T = x.size(1), r = heads / kv_heads;
  Tensor q = rotary_embedding(q_proj->forward(x).view({B, T, heads, head_dim}).transpose(1, 2), cos, sin);
  Tensor k = rotary_embedding(k_proj->forward(x).view({B, T, kv_heads, head_dim}).transpose(1, 2), cos, sin);
  Tensor v = v_proj->forward(x).view({B, T, kv_heads, head_dim}).transpose(1, 2);
  if (cache) cache->append(k, v);
  const int64_t Tk = k.size(2);
  // Grouped-query attention without copying keys and values r times: the query heads are split
  // [G, r] and each key/value head is expanded (stride 0) over its r query heads; the fused
  // kernel reads any leading layout, and the expand's backward sums the r gradients.
  Tensor qg = q.view({B, kv_heads, r, T, head_dim});
  Tensor kg = k.unsqueeze(2).expand({B, kv_heads, r, Tk, head_dim});
  Tensor vg = v.unsqueeze(2).expand({B, kv_heads, r, Tk, head_dim});
  Tensor mask = masked_out.defined() && masked_out.dim() == 4 ? masked_out.unsqueeze(2) : masked_out;
  Tensor out = scaled_dot_product_attention_masked_out(qg, kg, vg, mask, causal);  // [B, G, r, T, K]
  return o_proj->forward(out.view({B, heads, T, head_dim}).transpose(1, 2).reshape({B, T, heads * head_dim}));
}

LlamaMLP::LlamaMLP(int64_t d_model, int64_t d_ff) {
  gate_proj = register_module("gate_proj", std::make_shared<nn::Linear>(d_model, d_ff, false));
  up_proj = register_module("up_proj", std::make_shared<nn::Linear>(d_model, d_ff, false));
  down_proj = register_module("down_proj", std::make_shared<nn::Linear>(d_ff, d_model, false));
}

Tensor LlamaMLP::forward(const Tensor& x) const {
  return down_proj->forward(nn::activation("silu", gate_proj->forward(x)) * up_proj->forward(x));
}

LlamaBlock::LlamaBlock(const LlamaConfig& c) {
  input_layernorm = register_module("input_layernorm", std::make_shared<nn::RMSNorm>(c.d_model, c.rms_eps));
  self_attn = register_module("self_attn", std::make_shared<LlamaAttention>(c));
  post_attention_layernorm =
      register_module("post_attention_layernorm", std::make_shared<nn::RMSNorm>(c.d_model, c.rms_eps));
  mlp = register_module("mlp", std::make_shared<LlamaMLP>(c.d_model, c.d_ff));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(c.dropout));
}

Tensor LlamaBlock::forward(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& masked_out, bool causal,
                           nn::KVCache* cache) const {
  Tensor h = x + dropout->forward(self_attn->forward(input_layernorm->forward(x), cos, sin, masked_out, causal, cache));
  return h + dropout->forward(mlp->forward(post_attention_layernorm->forward(h)));
}

Llama::Llama(const LlamaConfig& c) : config(c) {
  c.validate();
  embed_tokens = register_module("embed_tokens", std::make_shared<nn::Embedding>(c.vocab, c.d_model));
  layers = register_module("layers", std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < c.layers; ++i) layers->push_back(std::make_shared<LlamaBlock>(c));
  norm = register_module("norm", std::make_shared<nn::RMSNorm>(c.d_model, c.rms_eps));
  lm_head = register_module("lm_head", std::make_shared<nn::Linear>(c.d_model, c.vocab, false));
  if (c.tie_embeddings) lm_head->tie_parameter("weight", embed_tokens->weight);
  // Hugging Face's _init_weights for Llama: N(0, initializer_range = 0.02) for every Linear and
  // the embedding; the RMSNorm weights stay 1.
  NoGradGuard no_grad;
  for (Tensor& p : decay_parameters()) p.normal_(0.0, 0.02);  // the matrices
}

void Llama::ensure_tables(Device device, DType dtype) {
  if (cos_.defined() && cos_.device() == device && cos_.dtype() == dtype) return;
  auto [c, s] = rotary_tables(config.max_positions, config.head_dim(), config.rope_theta);
  cos_ = c.to(dtype).to(device), sin_ = s.to(dtype).to(device);
  range_ = arange(config.max_positions, TensorOptions(DType::Int64, device));
}

Tensor Llama::forward(const Tensor& ids_in, LlamaCache* cache, const Tensor& positions_in, const Tensor& masked_out_in) {
  const Device device = embed_tokens->weight.device();
  const Tensor ids = ids_in.to(device);
  const Tensor masked_out = masked_out_in.defined() ? masked_out_in.to(device) : masked_out_in;
  const int64_t T = ids.size(1), past = cache ? cache->length() : 0;
  check_ids(ids, past, "Llama", "max_positions", "crop the input or raise max_positions");
  ensure_tables(device, embed_tokens->weight.dtype());
  Tensor cos, sin;
  if (positions_in.defined()) {
    const Tensor positions = positions_in.to(device);
    TP_CHECK(positions.dtype() == DType::Int64 && positions.sizes() == ids.sizes(),
             "Llama: positions must be int64 {} like the ids, got {} {}", ids.sizes(), positions.dtype(),
             positions.sizes());
    cos = embedding(cos_, positions).unsqueeze(1);  // [B, 1, T, K/2]; the embedding checks the range
    sin = embedding(sin_, positions).unsqueeze(1);
  } else {
    cos = cos_.slice(0, past, past + T), sin = sin_.slice(0, past, past + T);  // [T, K/2]
  }
  // As the GPT: the kernel's causal flag without cached keys; after cached ones the mask is
  // offset by the cache length and spelled out (one new query needs none).
  const bool causal = past == 0 && T > 1;
  const Tensor mask = mask_after_cache(range_, masked_out, past, T);
  if (cache && cache->layers.empty()) cache->layers.resize(layers->size());
  Tensor x = embed_tokens->forward(ids);
  for (size_t i = 0; i < layers->size(); ++i) {
    const std::shared_ptr<LlamaBlock> block = layers->at<LlamaBlock>(i);
    if (checkpoint_blocks() && !cache)
      x = checkpoint([block, cos, sin, mask, causal](const TensorList& in) {
        return block->forward(in[0], cos, sin, mask, causal, nullptr);
      }, {x});
    else
      x = block->forward(x, cos, sin, mask, causal, cache ? &cache->layers[i] : nullptr);
  }
  return lm_head->forward(norm->forward(x));
}

namespace {

using Json = nlohmann::json;

Json read_json(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  TP_CHECK(in.good(), "load_llama_hf: {}: cannot open {}", path, what);
  try {
    return Json::parse(in);
  } catch (const Json::exception& e) {
    throw Error(fmt::format("load_llama_hf: {}: not valid JSON ({})", path, e.what()));
  }
}

}  // namespace

LlamaConfig read_llama_hf_config(const std::string& path) {
  const Json j = read_json(path, "the model's config");
  TP_CHECK(j.is_object(), "load_llama_hf: {}: expected a JSON object", path);
  auto has = [&](const char* key) { return j.contains(key) && !j.at(key).is_null(); };
  auto integer = [&](const char* key, std::optional<int64_t> fallback) -> int64_t {
    if (!has(key)) {
      TP_CHECK(fallback.has_value(), "load_llama_hf: {}: '{}' is missing", path, key);
      return *fallback;
    }
    TP_CHECK(j.at(key).is_number_integer(), "load_llama_hf: {}: '{}' must be an integer, got {}", path, key,
             j.at(key).dump());
    return j.at(key).get<int64_t>();
  };
  auto real = [&](const char* key, double fallback) {
    if (!has(key)) return fallback;
    TP_CHECK(j.at(key).is_number(), "load_llama_hf: {}: '{}' must be a number, got {}", path, key, j.at(key).dump());
    return j.at(key).get<double>();
  };
  auto flag = [&](const char* key) {
    if (!has(key)) return false;
    TP_CHECK(j.at(key).is_boolean(), "load_llama_hf: {}: '{}' must be true or false, got {}", path, key,
             j.at(key).dump());
    return j.at(key).get<bool>();
  };
  const std::string type = has("model_type") && j.at("model_type").is_string() ? j.at("model_type").get<std::string>()
                                                                              : "llama";
  TP_CHECK(type == "llama", "load_llama_hf: {}: model_type '{}' is not a Llama (expected \"llama\")", path, type);
  // What this model does not have is refused rather than silently computed another way.
  TP_CHECK(!has("rope_scaling"), "load_llama_hf: {}: rope_scaling {} is not supported (plain rotary positions only)",
           path, has("rope_scaling") ? j.at("rope_scaling").dump() : "");
  TP_CHECK(!flag("attention_bias") && !flag("mlp_bias"),
           "load_llama_hf: {}: attention_bias / mlp_bias are not supported (Llama's projections have no biases)", path);
  const std::string act = has("hidden_act") && j.at("hidden_act").is_string() ? j.at("hidden_act").get<std::string>()
                                                                             : "silu";
  TP_CHECK(act == "silu", "load_llama_hf: {}: hidden_act '{}' is not supported (SwiGLU uses silu)", path, act);
  LlamaConfig c;
  c.vocab = integer("vocab_size", std::nullopt);
  c.d_model = integer("hidden_size", std::nullopt);
  c.d_ff = integer("intermediate_size", std::nullopt);
  c.layers = integer("num_hidden_layers", std::nullopt);
  c.heads = integer("num_attention_heads", std::nullopt);
  c.kv_heads = integer("num_key_value_heads", c.heads);
  c.max_positions = integer("max_position_embeddings", 2048);
  c.rope_theta = real("rope_theta", 10000.0);
  c.rms_eps = real("rms_norm_eps", 1e-6);
  c.tie_embeddings = flag("tie_word_embeddings");
  c.dropout = 0.0;
  if (has("head_dim"))
    TP_CHECK(c.heads > 0 && integer("head_dim", 0) * c.heads == c.d_model,
             "load_llama_hf: {}: head_dim {} is not hidden_size / num_attention_heads ({} / {})", path,
             integer("head_dim", 0), c.d_model, c.heads);
  try {
    c.validate();
  } catch (const Error& e) {
    throw Error(fmt::format("load_llama_hf: {}: {}", path, e.what()));
  }
  return c;
}

std::shared_ptr<Llama> load_llama_hf(const std::string& dir) {
  TP_CHECK(std::filesystem::is_directory(dir), "load_llama_hf: {} is not a directory (expected a Hugging Face "
           "checkpoint folder with config.json and model*.safetensors)", dir);
  return load_llama_hf(dir, read_llama_hf_config(dir + "/config.json"));
}

std::shared_ptr<Llama> load_llama_hf(const std::string& dir, const LlamaConfig& c) {
  namespace fs = std::filesystem;

  // The weight files: one model.safetensors, or the shards the index names (each read once).
  const std::string index_path = dir + "/model.safetensors.index.json";
  std::vector<std::string> files;
  if (fs::exists(index_path)) {
    const Json index = read_json(index_path, "the shard index");
    TP_CHECK(index.is_object() && index.contains("weight_map") && index.at("weight_map").is_object(),
             "load_llama_hf: {}: no \"weight_map\" object", index_path);
    std::set<std::string> seen;
    for (const auto& [tensor_name, file] : index.at("weight_map").items()) {
      TP_CHECK(file.is_string(), "load_llama_hf: {}: the file of '{}' is not a string", index_path, tensor_name);
      const std::string shard = file.get<std::string>();
      TP_CHECK(shard.find('/') == std::string::npos, "load_llama_hf: {}: shard '{}' is not a file name in {}",
               index_path, shard, dir);
      if (!seen.insert(shard).second) continue;
      TP_CHECK(fs::exists(dir + "/" + shard), "load_llama_hf: {}/{} is missing (model.safetensors.index.json lists it "
               "for '{}')", dir, shard, tensor_name);
      files.push_back(shard);
    }
  } else {
    TP_CHECK(fs::exists(dir + "/model.safetensors"), "load_llama_hf: {} has neither model.safetensors nor "
             "model.safetensors.index.json", dir);
    files.push_back("model.safetensors");
  }
  // Shard by shard, each copied into the model and released before the next is read: the peak is
  // the model and one shard, not the model and every shard.
  auto model = std::make_shared<Llama>(c);
  const nn::NamedTensors params = model->named_parameters();
  auto hf_key = [](const std::string& name) { return name == "lm_head.weight" ? name : "model." + name; };
  std::map<std::string, std::string> loaded_from;  // key -> its file
  NoGradGuard no_grad;
  for (const std::string& f : files) {
    const std::string path = dir + "/" + f;
    std::map<std::string, Tensor> shard = nn::load_safetensors(path).as_map();
    for (const auto& [key, t] : shard) {
      auto seen = loaded_from.find(key);
      TP_CHECK(seen == loaded_from.end(), "load_llama_hf: '{}' is in both {} and {}", key,
               seen == loaded_from.end() ? "" : seen->second, path);
    }
    for (const auto& [name, p] : params) {  // in the model's order, so the first misfit is named
      auto it = shard.find(hf_key(name));
      if (it == shard.end()) continue;
      const Tensor& t = it->second;
      TP_CHECK(t.sizes() == p.sizes(), "load_llama_hf: {}: tensor '{}' is {}, but config.json's sizes make it {}",
               path, it->first, t.sizes(), p.sizes());
      TP_CHECK(is_floating(t.dtype()), "load_llama_hf: {}: tensor '{}' is {}, expected a floating dtype", path,
               it->first, t.dtype());
      Tensor(p).copy_(t);
      loaded_from.emplace(it->first, path);
      shard.erase(it);
    }
    for (const auto& [key, t] : shard) {
      // Older checkpoints keep the rotary frequencies as a buffer, and some tied ones store the head too.
      const std::string inv_freq = "rotary_emb.inv_freq";
      const bool known = key.size() > inv_freq.size() &&
                         key.compare(key.size() - inv_freq.size(), inv_freq.size(), inv_freq) == 0;
      TP_CHECK(known || (c.tie_embeddings && key == "lm_head.weight"),
               "load_llama_hf: {}: unexpected tensor '{}' (config.json: {} layers{})", path, key, c.layers,
               c.tie_embeddings ? ", tied head" : "");
      loaded_from.emplace(key, path);
    }
  }
  for (const auto& [name, p] : params)
    TP_CHECK(loaded_from.count(hf_key(name)), "load_llama_hf: {}: tensor '{}' is missing from {}", dir, hf_key(name),
             fmt::join(files, ", "));
  model->eval();
  return model;
}

}  // namespace tapestry::models
