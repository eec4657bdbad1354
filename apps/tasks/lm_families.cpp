// The language-model families (see lm_families.h): one row each.
#include "apps/tasks/lm_families.h"

#include <algorithm>

#include "apps/train/option_table.h"
#include "tapestry/ops/error.h"
#include "tapestry/models/gpt.h"
#include "tapestry/models/llama.h"

namespace tapestry::apps {

using models::CausalLM;
using models::GPT;
using models::GPTConfig;
using models::Llama;
using models::LlamaConfig;

namespace {

// A metadata field of a saved model as the config reads it, the error naming the file.
template <class Config>
Config validated(const SavedModel& saved, Config c) {
  try {
    c.validate();
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", saved.path, e.what()));
  }
  return c;
}

LMFamily gpt_family() {
  LMFamily f;
  f.name = "gpt", f.title = "GPT", f.blurb = "GPT-2's blocks", f.configs = GPTConfig::names();
  f.lora_layers = {{"q", "w_q"}, {"k", "w_k"}, {"v", "w_v"}, {"o", "w_o"}, {"up", "fc"}, {"down", "proj"}};
  f.lora_note = "its MLP is up and down";
  f.make = [](const std::string& config, int64_t vocab, int64_t block, double dropout) {
    GPTConfig cfg = GPTConfig::named(config, vocab);
    cfg.block_size = block, cfg.dropout = dropout;
    return std::shared_ptr<CausalLM>(std::make_shared<GPT>(cfg));
  };
  f.holds = [](const CausalLM& m) { return dynamic_cast<const GPT*>(&m) != nullptr; };
  f.shape_metadata = [](const CausalLM& m) {
    const GPTConfig& c = dynamic_cast<const GPT&>(m).config;
    return std::map<std::string, std::string>{
        {"vocab", std::to_string(c.vocab)},       {"block_size", std::to_string(c.block_size)},
        {"layers", std::to_string(c.layers)},     {"heads", std::to_string(c.heads)},
        {"d_model", std::to_string(c.d_model)},   {"d_ff", std::to_string(c.ff_dim())},
        {"gelu_tanh", c.gelu_tanh ? "1" : "0"}};
  };
  f.from_metadata = [](const SavedModel& s) {
    GPTConfig c;
    c.vocab = s.num("vocab"), c.block_size = s.num("block_size"), c.layers = s.num("layers");
    c.heads = s.num("heads"), c.d_model = s.num("d_model"), c.d_ff = s.num("d_ff");
    c.gelu_tanh = s.meta("gelu_tanh") == "1";
    c.dropout = 0;
    return std::shared_ptr<CausalLM>(std::make_shared<GPT>(c));
  };
  f.describe = [](const CausalLM& m) {
    const GPTConfig& c = dynamic_cast<const GPT&>(m).config;
    return fmt::format("{} layers, {} heads, d_model {}", c.layers, c.heads, c.d_model);
  };
  return f;
}

LMFamily llama_family() {
  LMFamily f;
  f.name = "llama", f.title = "Llama";
  f.blurb = "RMSNorm, rotary positions, SwiGLU, grouped-query attention";
  f.configs = LlamaConfig::names();
  f.lora_layers = {{"q", "q_proj"},       {"k", "k_proj"},   {"v", "v_proj"},    {"o", "o_proj"},
                   {"gate", "gate_proj"}, {"up", "up_proj"}, {"down", "down_proj"}};
  f.make = [](const std::string& config, int64_t vocab, int64_t block, double dropout) {
    LlamaConfig cfg = LlamaConfig::named(config, vocab);
    cfg.max_positions = block, cfg.dropout = dropout;
    return std::shared_ptr<CausalLM>(std::make_shared<Llama>(cfg));
  };
  f.holds = [](const CausalLM& m) { return dynamic_cast<const Llama*>(&m) != nullptr; };
  f.shape_metadata = [](const CausalLM& m) {
    const LlamaConfig& c = dynamic_cast<const Llama&>(m).config;
    return std::map<std::string, std::string>{
        {"vocab", std::to_string(c.vocab)},         {"max_positions", std::to_string(c.max_positions)},
        {"layers", std::to_string(c.layers)},       {"heads", std::to_string(c.heads)},
        {"kv_heads", std::to_string(c.kv_heads)},   {"d_model", std::to_string(c.d_model)},
        {"d_ff", std::to_string(c.d_ff)},           {"rope_theta", fmt::format("{}", c.rope_theta)},
        {"rms_eps", fmt::format("{}", c.rms_eps)},  {"tie_embeddings", c.tie_embeddings ? "1" : "0"}};
  };
  f.from_metadata = [](const SavedModel& s) {
    LlamaConfig c;
    c.vocab = s.num("vocab"), c.max_positions = s.num("max_positions"), c.layers = s.num("layers");
    c.heads = s.num("heads"), c.kv_heads = s.num("kv_heads"), c.d_model = s.num("d_model");
    c.d_ff = s.num("d_ff"), c.tie_embeddings = s.meta("tie_embeddings") == "1";
    c.rope_theta = s.real("rope_theta"), c.rms_eps = s.real("rms_eps");
    return std::shared_ptr<CausalLM>(std::make_shared<Llama>(validated(s, c)));
  };
  f.describe = [](const CausalLM& m) {
    const LlamaConfig& c = dynamic_cast<const Llama&>(m).config;
    return fmt::format("{} layers, {} heads ({} key/value), d_model {}", c.layers, c.heads, c.kv_heads, c.d_model);
  };
  f.load_hf = [](const std::string& dir) {
    return std::shared_ptr<CausalLM>(models::load_llama_hf(dir, models::read_llama_hf_config(dir + "/config.json")));
  };
  f.hf_vocab = [](const std::string& dir) { return models::read_llama_hf_config(dir + "/config.json").vocab; };
  return f;
}

}  // namespace

const std::vector<LMFamily>& lm_families() {
  static const std::vector<LMFamily> families = {gpt_family(), llama_family()};
  return families;
}

const LMFamily& lm_family(const std::string& name) {
  for (const LMFamily& f : lm_families())
    if (f.name == name) return f;
  std::vector<std::string> names;
  for (const LMFamily& f : lm_families()) names.push_back(f.name);
  throw Error(fmt::format("unknown model '{}' (expected {})", name, names_text(names)));
}

const LMFamily& lm_family_of(const CausalLM& model) {
  for (const LMFamily& f : lm_families())
    if (f.holds(model)) return f;
  throw Error("a language model of no known family");
}

const LMFamily& hf_lm_family() {
  for (const LMFamily& f : lm_families())
    if (f.load_hf) return f;
  throw Error("no language-model family reads Hugging Face directories");
}

std::map<std::string, std::string> lm_metadata(const CausalLM& model, const LMTokenizer& tok) {
  const LMFamily& f = lm_family_of(model);
  std::map<std::string, std::string> m = f.shape_metadata(model);
  m.insert({{"task", "lm"}, {"model", f.name}, {"tokenizer", tok.name()}});
  return m;
}

}  // namespace tapestry::apps
