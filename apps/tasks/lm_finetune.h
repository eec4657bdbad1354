// Fine-tuning a language model (`train --task lm --base DIR`) and its LoRA runs: the base (a run
// folder of train --task lm, or a Hugging Face directory), LoRA adapters attached for training,
// the tokenizer's files a run folder copies from its base, and the merged model of a LoRA run.
// Loading a LoRA run's folder, a Hugging Face directory and merging (language_model.h's
// load_language_model, load_hf_language_model, merge_lora_run) are defined here too.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "apps/tasks/language_model.h"
#include "apps/tasks/lm_families.h"

namespace tapestry::apps {

bool is_hf_dir(const std::string& dir);  // holds config.json
// A file's bytes (throws naming it when unreadable), and files by their path relative to `dir`
// written there, atomically, with their folders: how a run folder copies a tokenizer's files.
std::string read_whole_file(const std::string& path);
void write_files(const std::string& dir, const std::map<std::string, std::string>& files);

// --lora-targets' check: a comma-separated list of distinct names among q, k, v, o, gate, up, down
// (the problem, or "").
std::string lora_targets_problem(const std::string& value);
// The family's Linear layers --lora-targets names; throws for a name the family lacks.
std::vector<std::string> lora_layer_names(const LMFamily& family, const std::string& targets);

// --base: its model (in training mode) and tokenizer. Sets o.base to its absolute path (recorded
// in the recipe, config.toml and adapter.safetensors, so that the run resumes and loads from any
// working directory), o.model to its family and o.config to "base".
LanguageModel load_base(LMOptions& o);

// Freezes the model and attaches rank o.lora_rank adapters to `layers`. Returns the metadata
// adapter.safetensors records (the base's path and fingerprint, the adapters' shape) and adds a
// line of what was attached to `shape`.
std::map<std::string, std::string> attach_lora(models::CausalLM& model, const LMOptions& o, const LMTokenizer& tok,
                                               const std::vector<std::string>& layers, std::string& shape);

// The tokenizer's files of a base (a run folder or a Hugging Face directory), by their path in a
// folder made from it, so that the folder stands alone: spm.model or gpt2/ as a run folder holds
// them, and a Hugging Face model's under hf/ (where load_language_model reads them) or, with
// hf_layout, at the top.
std::map<std::string, std::string> tokenizer_files(const std::string& base, const LMTokenizer& tok, bool hf_layout);

// A LoRA run's folder: its base (which must still be where the run found it, unchanged) with the
// adapters attached and loaded.
LanguageModel load_adapter_language_model(const std::string& run_dir);

// The merged model of a model with adapters, written to out_dir in its base's own layout; returns
// the parameter count (merge_lora_run's body, for a model in memory).
int64_t write_merged(const models::CausalLM& model, const LMTokenizer& tok, const std::string& base,
                     const std::string& out_dir);

}  // namespace tapestry::apps
