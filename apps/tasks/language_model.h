// Training a decoder-only language model (the GPT, or the Llama with --model llama) on any UTF-8
// text through the Trainer (`tapestry train --task lm`): the corpus as one token stream (a
// separator token ends each line), random windows of block_size + 1 tokens, AdamW with parameter
// groups (no decay on biases and norm weights), linear
// warmup and cosine decay, validation loss, perplexity and bits per byte after each epoch,
// checkpoints and exact resume. `tapestry generate` samples from the run folder it writes.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "apps/data/lm_tokenizer.h"
#include "apps/train/run_setup.h"
#include "apps/train/trainer.h"
#include "tapestry/models/causal_lm.h"

namespace tapestry::apps {

struct LMOptions {
  // The default recipe (docs/training.md: "Language model"): the English side of Multi30k.
  // The Trainer's part: epochs, clip-norm, out, resume, seed, ... (one epoch copy, no averaging).
  TrainerOptions trainer = [] {
    TrainerOptions t;
    t.epochs = 8;
    t.clip_norm = 1.0;
    t.out_dir = "runs/lm";
    t.seed = 1;
    t.keep = 1;
    t.average = 0;
    return t;
  }();
  std::string train_path;   // empty: default_data_dir()/train.en.gz
  std::string val_path;     // empty: val.en.gz beside the default train file; with --data alone,
                            // the last 5% of its lines (at least one) are held out
  std::string tokenizer = "sentencepiece";  // sentencepiece | byte | gpt2
  std::string gpt2_dir;     // gpt2: where encoder.json and vocab.bpe are (empty: the default cache)
  int64_t vocab_size = 4000;  // sentencepiece only
  std::string model = "gpt";     // gpt | llama
  std::string config = "mini";   // one of the model's named configs (GPTConfig / LlamaConfig)
  int64_t block = 64;       // context length of the training windows (<= the config's, which it replaces)
  int64_t batch = 32;       // windows per batch
  AdamWCosine adamw = {200, 2e-3, 2e-4, 0.1};  // warmup steps, lr, min-lr, weight decay (on the matrices)
  double dropout = 0.1;
  int64_t limit = 0;        // train on the first N lines only (0: all)
  bool export_ids = false;  // also write train.ids/val.ids (int32) and ids.json for tools/lm-compare.sh
  std::vector<std::string> prompts;  // sampled (greedy and seeded) after training

  // Fine-tuning: the model and the tokenizer come from `base` (a run folder of train --task lm, or
  // a Hugging Face Llama directory) instead of --model, --config and --tokenizer. Without
  // lora_rank every weight trains and the run folder stands alone (model.safetensors and the
  // tokenizer's files); with it the base is frozen and only LoRA adapters train and are saved
  // (adapter.safetensors, recording the base's path and fingerprint).
  std::string base;
  int64_t lora_rank = 0;              // 0: full fine-tuning
  double lora_alpha = 16;             // the adapters' update is scaled by alpha / rank
  std::string lora_targets = "q,v";   // the adapted layers: q, k, v, o (attention), gate, up, down (MLP)
  bool merge = false;                 // after training, write the base with the adapters merged into OUT/merged
};

// The task's options, one row each (flag, help, values, role): the command line's flags, the
// config.toml a run writes and the resume recipe.
OptionTable options_table(LMOptions& options);
// The options as TOML (config.toml, read back by `tapestry train --config-file`), with the
// default corpus written out.
std::string options_to_toml(const LMOptions& options);

struct LMResult {
  int64_t steps = 0, train_tokens = 0, val_tokens = 0, val_bytes = 0, parameters = 0, trainable_parameters = 0;
  double val_loss = 0, val_ppl = 0, val_bpb = 0, seconds = 0, tokens_per_s = 0, peak_rss_mib = 0;
  bool stopped = false;
  int interrupted = 0;
};

LMResult train_language_model(const LMOptions& options);

// A trained model and its tokenizer, from a run folder train_language_model wrote (or Hugging
// Face weights: GPT-2's safetensors file, see load_gpt2_hf, or a Llama directory).
struct LanguageModel {
  std::unique_ptr<LMTokenizer> tokenizer;
  std::shared_ptr<models::CausalLM> model;
};
// A LoRA run's folder (adapter.safetensors) loads as its base with the adapters attached; the
// base must still be where the run found it, unchanged (its fingerprint is checked).
LanguageModel load_language_model(const std::string& checkpoint_dir);
// A Llama-family model in a Hugging Face directory (models::load_llama_hf) with its tokenizer
// (hf_tokenizer); a tokenizer whose vocabulary differs from config.json's vocab_size is refused
// before the weights are read.
LanguageModel load_hf_language_model(const std::string& dir);

// The merged model of a LoRA run (`train --task lm --base B --lora-rank R`): the base's weights
// with the adapters added in (W + alpha / rank B A), written to out_dir in the base's own layout
// (a run folder for `generate --checkpoint`, or a Hugging Face directory for `generate --hf`),
// with the tokenizer's files. Returns the merged model's parameter count.
int64_t merge_lora_run(const std::string& run_dir, const std::string& out_dir);

// Mean loss (nats per predicted token) over a stream, in windows of block + 1 tokens that step
// by block: every token after the first is predicted once.
double stream_loss(models::CausalLM& model, const std::vector<int32_t>& stream, int64_t block, int64_t batch);

// Peak resident set size of this process, MiB.
double peak_rss_mib();

}  // namespace tapestry::apps
