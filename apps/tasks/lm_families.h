// The causal language-model families `tapestry train --task lm` trains, fine-tunes and loads,
// as data: one row per family (GPT, Llama) with its --model name, its named configs, how to build
// one, the checkpoint metadata that rebuilds it, its Linear layers for LoRA and, where it has one,
// its Hugging Face loader. A new family is a row in lm_families.cpp; the LM task, the
// fine-tuning code and the loaders read the table and name no family.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "apps/data/lm_tokenizer.h"
#include "apps/train/saved_model.h"
#include "tapestry/models/causal_lm.h"

namespace tapestry::apps {

struct LMFamily {
  std::string name;   // --model, and the checkpoint's "model" metadata: "gpt"
  std::string title;  // for the log: "GPT"
  std::string blurb;  // --model's help: "GPT-2's blocks"
  std::vector<std::string> configs;  // the named configs (--config)
  // --lora-targets' names (q, k, v, o, gate, up, down) -> its Linear layers', and what to say of
  // a name it lacks.
  std::map<std::string, std::string> lora_layers;
  std::string lora_note;
  // A model at a named config for a vocabulary, with a context of `block` positions and dropout.
  std::function<std::shared_ptr<models::CausalLM>(const std::string& config, int64_t vocab, int64_t block,
                                                  double dropout)> make;
  bool (*holds)(const models::CausalLM& model);  // the model is of this family
  // The shape the checkpoint metadata records (beside task, model and tokenizer), and the model
  // rebuilt from it (no dropout); a line describing the shape for the log.
  std::function<std::map<std::string, std::string>(const models::CausalLM&)> shape_metadata;
  std::function<std::shared_ptr<models::CausalLM>(const SavedModel&)> from_metadata;
  std::function<std::string(const models::CausalLM&)> describe;
  // A Hugging Face directory of this family (config.json, model.safetensors); empty: none.
  std::function<std::shared_ptr<models::CausalLM>(const std::string& dir)> load_hf;
  std::function<int64_t(const std::string& dir)> hf_vocab;  // config.json's vocab_size
};

// Every family, in --model's order.
const std::vector<LMFamily>& lm_families();
// By --model name (throws naming the names), and the family of a model.
const LMFamily& lm_family(const std::string& name);
const LMFamily& lm_family_of(const models::CausalLM& model);
// The family that reads Hugging Face directories (the first with a load_hf).
const LMFamily& hf_lm_family();

// The metadata a run of the model's family writes with its weights: task, model, tokenizer, and
// the family's shape.
std::map<std::string, std::string> lm_metadata(const models::CausalLM& model, const LMTokenizer& tok);

}  // namespace tapestry::apps
