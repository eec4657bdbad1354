// LoRA (Hu et al. 2021, "Low-Rank Adaptation of Large Language Models"): fine-tuning that
// freezes a model and trains, beside chosen Linear layers, a low-rank update of their weights,
// W + (alpha / rank) B A, with A [rank, in] initialised as a Linear's weight and B [out, rank] at
// zero, so that training starts from the base model's outputs. Names follow PEFT's: an adapted
// layer "layers.0.self_attn.q_proj" gains "layers.0.self_attn.q_proj.lora_A.weight" and
// "...lora_B.weight" (PEFT's files put "base_model.model." before its model's own names).
//
//   nn::LoRAOptions lora;
//   lora.rank = 8, lora.alpha = 16, lora.targets = {"q_proj", "v_proj"};
//   nn::add_lora(model, lora);                              // the base is now frozen
//   optim::AdamW adamw(model.trainable_parameters(), ...);  // ... train ...
//   nn::save_safetensors("adapter.safetensors", nn::lora_state_dict(model));
//   base_again.load_state_dict(nn::merged_state_dict(model));  // a plain model with the update merged
#pragma once
#include <string>
#include <vector>

#include "tapestry/nn/layers.h"

namespace tapestry::nn {

struct LoRAOptions {
  int64_t rank = 8;
  double alpha = 16;     // the update is scaled by alpha / rank
  double dropout = 0;    // on the adapters' input while training
  std::vector<std::string> targets;  // the Linear layers to adapt, by name: the last part of their path ("q_proj")
};

// Freezes every parameter of `model` (requires_grad off) and attaches an adapter, in the layer's
// dtype and on its device, to every nn::Linear named in options.targets. Returns the adapted
// layers' paths, in order. Throws a tapestry::Error, before changing anything, for a rank below
// 1, an alpha that is not positive, a dropout outside [0, 1), a target that names no Linear
// layer, a model that has adapters already, or a layer whose weight is tied to another
// parameter (merging would change both).
std::vector<std::string> add_lora(Module& model, const LoRAOptions& options);

// The adapters' parameters under their full names: what an adapter file holds.
NamedTensors lora_state_dict(const Module& model);
// The model's state without the adapters' entries: the frozen base.
NamedTensors base_state_dict(const Module& model);
// base_state_dict with each adapted weight replaced by W + (alpha / rank) B A, computed in float64
// and rounded once to the weight's dtype: the state of the model without adapters whose outputs
// are the adapted model's (the merged model).
NamedTensors merged_state_dict(const Module& model);

// "crc32:XXXXXXXX" over the names, dtypes, shapes and values, in order: the identity of a base
// model that an adapter records, so that it is never applied to another.
std::string fingerprint(const NamedTensors& state);

}  // namespace tapestry::nn
