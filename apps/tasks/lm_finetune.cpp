// Fine-tuning and LoRA runs of the language models (see lm_finetune.h).
#include "apps/tasks/lm_finetune.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "apps/train/option_table.h"
#include "apps/train/run_dir.h"
#include "apps/train/saved_model.h"
#include "tapestry/nn/lora.h"
#include "tapestry/nn/safetensors.h"
#include "tapestry/ops/file.h"

namespace tapestry::apps {

using models::CausalLM;

bool is_hf_dir(const std::string& dir) { return file_exists(dir + "/config.json"); }

std::string read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TP_CHECK(in.good(), "cannot read {}", path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_files(const std::string& dir, const std::map<std::string, std::string>& files) {
  for (const auto& [name, bytes] : files) {
    std::filesystem::create_directories(std::filesystem::path(dir + "/" + name).parent_path());
    write_file_atomic(dir + "/" + name, bytes);
  }
}

namespace {

// --lora-targets' names, which each family maps to its Linear layers (LMFamily::lora_layers).
const std::vector<std::string> kLoraTargets = {"q", "k", "v", "o", "gate", "up", "down"};

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ',');) {
    const size_t a = part.find_first_not_of(' '), b = part.find_last_not_of(' ');
    if (a != std::string::npos) parts.push_back(part.substr(a, b - a + 1));
  }
  return parts;
}

// A LoRA run's folder: the base it names, loaded and checked against the fingerprint it recorded,
// with the adapters attached and loaded.
struct AdapterRun {
  LanguageModel lm;
  std::string base;
};

AdapterRun load_adapter_run(const std::string& dir) {
  SavedModel saved;
  saved.path = dir + "/adapter.safetensors";
  saved.kind = "a LoRA adapter of train --task lm";
  saved.file = nn::load_safetensors(saved.path);
  TP_CHECK(saved.meta("task") == "lm" && saved.meta("adapter") == "lora", "{} is not {}", saved.path, saved.kind);
  AdapterRun run;
  run.base = saved.meta("base");
  TP_CHECK(std::filesystem::is_directory(run.base), "{}: its base model {} is not there; the adapters apply to that "
           "model only: put it back", saved.path, run.base);
  run.lm = is_hf_dir(run.base) ? load_hf_language_model(run.base) : load_language_model(run.base);
  const std::string found = nn::fingerprint(run.lm.model->state_dict()), recorded = saved.meta("base_fingerprint");
  TP_CHECK(found == recorded, "{}: the base model {} has changed since the adapters were trained (fingerprint {}, "
           "recorded {}); they apply to the model they were trained on only", saved.path, run.base, found, recorded);
  nn::LoRAOptions lora;
  lora.rank = saved.num("lora_rank");
  lora.alpha = saved.real("lora_alpha");
  lora.targets = split_list(saved.meta("lora_targets"));
  try {
    nn::add_lora(*run.lm.model, lora);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", saved.path, e.what()));
  }
  std::set<std::string> expected, held;
  for (const auto& [name, t] : nn::lora_state_dict(*run.lm.model)) expected.insert(name);
  for (const auto& [name, t] : saved.file.tensors) held.insert(name);
  TP_CHECK(expected == held, "{} holds {} tensors, but rank {} adapters on {} make {}: the file is not this run's "
           "adapters", saved.path, held.size(), lora.rank, saved.meta("lora_targets"), expected.size());
  run.lm.model->load_state_dict(saved.file.as_map(), false);
  run.lm.model->eval();
  return run;
}

}  // namespace

std::string lora_targets_problem(const std::string& value) {
  const std::vector<std::string> parts = split_list(value);
  if (parts.empty()) return "give some of " + names_text(kLoraTargets);
  // Issue 44: "q,,k" and "q,q" were taken, the empty name and the repeat dropped silently.
  if (static_cast<size_t>(std::count(value.begin(), value.end(), ',')) + 1 != parts.size())
    return fmt::format("'{}' has an empty name between commas", value);
  std::set<std::string> seen;
  for (const std::string& part : parts) {
    if (std::find(kLoraTargets.begin(), kLoraTargets.end(), part) == kLoraTargets.end())
      return fmt::format("'{}' is not a layer: give some of {}", part, names_text(kLoraTargets));
    if (!seen.insert(part).second) return fmt::format("'{}' is named twice", part);
  }
  return "";
}

std::vector<std::string> lora_layer_names(const LMFamily& family, const std::string& targets) {
  std::vector<std::string> names;
  for (const std::string& part : split_list(targets)) {
    TP_CHECK(family.lora_layers.count(part), "train: --lora-targets: the {} has no '{}' layer ({})", family.title, part,
             family.lora_note);
    names.push_back(family.lora_layers.at(part));
  }
  return names;
}

LanguageModel load_base(LMOptions& o) {
  const std::string& dir = o.base;
  TP_CHECK(std::filesystem::is_directory(dir), "train: --base {}: no such directory", dir);
  TP_CHECK(!file_exists(dir + "/adapter.safetensors") || file_exists(dir + "/model.safetensors"),
           "train: --base {} is a LoRA run (adapters on a base of their own): fine-tune its merged model instead "
           "(`tapestry train --config-file {}/config.toml --resume --merge` writes it to {}/merged)", dir, dir, dir);
  LanguageModel lm = is_hf_dir(dir) ? load_hf_language_model(dir) : load_language_model(dir);
  lm.model->train();
  o.base = std::filesystem::absolute(o.base).lexically_normal().string();
  o.model = lm_family_of(*lm.model).name;
  o.config = "base";
  return lm;
}

std::map<std::string, std::string> attach_lora(CausalLM& model, const LMOptions& o, const LMTokenizer& tok,
                                               const std::vector<std::string>& layers, std::string& shape) {
  const std::string fingerprint = nn::fingerprint(model.state_dict());
  nn::LoRAOptions lo;
  lo.rank = o.lora_rank, lo.alpha = o.lora_alpha, lo.dropout = o.dropout, lo.targets = layers;
  const std::vector<std::string> adapted = nn::add_lora(model, lo);
  shape += fmt::format("; LoRA rank {}, alpha {} on {} layers ({}), {} trainable", o.lora_rank, o.lora_alpha,
                       adapted.size(), fmt::join(layers, ", "), model.num_trainable_parameters());
  return {{"task", "lm"},
          {"adapter", "lora"},
          {"model", o.model},
          {"tokenizer", tok.name()},
          {"base", o.base},
          {"base_fingerprint", fingerprint},
          {"lora_rank", std::to_string(o.lora_rank)},
          {"lora_alpha", fmt::format("{}", o.lora_alpha)},
          {"lora_targets", fmt::format("{}", fmt::join(layers, ","))}};
}

std::map<std::string, std::string> tokenizer_files(const std::string& base, const LMTokenizer& tok, bool hf_layout) {
  std::map<std::string, std::string> files;
  const std::string kind = tok.name();
  if (kind == "sentencepiece") {
    files["spm.model"] = read_whole_file(base + "/spm.model");
  } else if (kind == "gpt2") {
    for (const char* f : {"encoder.json", "vocab.bpe"}) files[std::string("gpt2/") + f] = read_whole_file(base + "/gpt2/" + f);
  } else if (kind != "byte") {  // hf-sentencepiece, hf-bpe
    const std::string from = is_hf_dir(base) ? base : base + "/hf", to = hf_layout ? "" : "hf/";
    for (const char* f : {"tokenizer.model", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"})
      if (file_exists(from + "/" + f)) files[to + f] = read_whole_file(from + "/" + f);
  }
  return files;
}

// The merged model of a model with adapters (nn::merged_state_dict), in its base's own layout: a
// Hugging Face directory (the base's config.json, Hugging Face's names) or a run folder (the
// metadata a run of its family writes), with the tokenizer's files. Written beside, then renamed
// over an older one: a crash leaves the old folder or none.
int64_t write_merged(const CausalLM& model, const LMTokenizer& tok, const std::string& base, const std::string& out_dir) {
  const nn::NamedTensors merged = nn::merged_state_dict(model);
  const std::string tmp = out_dir + ".tmp";
  std::filesystem::remove_all(tmp);
  std::filesystem::create_directories(tmp);
  if (is_hf_dir(base)) {
    for (const char* f : {"config.json", "generation_config.json"})
      if (file_exists(base + "/" + f)) write_file_atomic(tmp + "/" + f, read_whole_file(base + "/" + f));
    nn::NamedTensors named;
    for (const auto& [name, t] : merged) named.emplace_back(name == "lm_head.weight" ? name : "model." + name, t);
    nn::save_safetensors(tmp + "/model.safetensors", named, {{"format", "pt"}});
  } else {
    // The shape of the model without its adapters is the base's: its run's metadata.
    nn::save_safetensors(tmp + "/model.safetensors", merged, lm_metadata(model, tok));
  }
  write_files(tmp, tokenizer_files(base, tok, is_hf_dir(base)));
  std::filesystem::remove_all(out_dir);
  std::filesystem::rename(tmp, out_dir);
  int64_t count = 0;
  for (const auto& [name, t] : merged) count += t.numel();
  return count;
}

int64_t merge_lora_run(const std::string& run_dir, const std::string& out_dir) {
  TP_CHECK(file_exists(run_dir + "/adapter.safetensors"), "merge: {} has no adapter.safetensors (not a LoRA run of "
           "train --task lm --base DIR --lora-rank R)", run_dir);
  const AdapterRun run = load_adapter_run(run_dir);
  return write_merged(*run.lm.model, *run.lm.tokenizer, run.base, out_dir);
}

LanguageModel load_hf_language_model(const std::string& dir) {
  const LMFamily& family = hf_lm_family();
  const int64_t vocab = family.hf_vocab(dir);
  LanguageModel lm;
  lm.tokenizer = hf_tokenizer(dir);
  TP_CHECK(lm.tokenizer->vocab_size() == vocab,
           "{}: the tokenizer ({}) has {} tokens but config.json's vocab_size is {}: they must belong to one model",
           dir, lm.tokenizer->name(), lm.tokenizer->vocab_size(), vocab);
  lm.model = family.load_hf(dir);
  return lm;
}

LanguageModel load_adapter_language_model(const std::string& dir) { return load_adapter_run(dir).lm; }

}  // namespace tapestry::apps
