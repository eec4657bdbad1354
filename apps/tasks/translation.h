// Training the Transformer on a parallel corpus (Multi30k German to English by default):
// SentencePiece subwords, token-count batches, label-smoothed loss, Adam with the Noam schedule,
// a progress line per epoch, validation loss and greedy BLEU after each epoch, an atomic
// checkpoint, and beam-search BLEU on the test set at the end.
#pragma once
#include <cstdint>
#include <string>
#include <map>
#include <vector>

#include "apps/data/subword.h"
#include "apps/train/run_setup.h"
#include "apps/train/trainer.h"
#include "tapestry/models/transformer.h"
#include "tapestry/ops/tensor.h"

namespace tapestry::apps {

struct TranslationOptions {
  // The Trainer's part: epochs, accumulate, clip-norm, out, resume, keep, average, seed, ...
  TrainerOptions trainer = [] {
    TrainerOptions t;
    // docs/training.md "Planned to a slow host's deadline": 15 epochs whose last 5 ramp the rate to
    // zero, the last 2 averaged, gave val BLEU 41.85 against 41.26 for 18 epochs averaging 5.
    t.epochs = 15;
    t.cooldown = 5;
    t.average = 2;
    t.out_dir = "runs/multi30k";
    t.seed = 1;
    t.best_metric = "val_bleu";  // model.best.safetensors; keep 5 is the Trainer's default
    return t;
  }();
  std::string data_dir;  // empty: default_data_dir()
  std::string src_lang = "de", tgt_lang = "en";
  std::string train_split = "train", val_split = "val", test_split = "test_2016_flickr";
  std::string config = "small";
  int64_t vocab_size = 8000;
  // The default recipe (docs/training.md: "Multi30k"): about 40 minutes on two cores.
  int64_t max_tokens = 2048;  // padded tokens per batch
  int64_t warmup = 400;
  double lr_factor = 0.5;     // peak learning rate 0.5 * 256^-0.5 * 400^-0.5 = 1.6e-3 for the small config
  double label_smoothing = 0.1;
  double dropout = 0.1;
  int64_t limit = 0;        // use only the first N training pairs (0: all)
  int64_t eval_limit = 0;   // score only the first N val/test sentences (0: all)
  int64_t beam = 4;
  double alpha = 1.0;  // tuned on val (docs/training.md "Tuning the recipe"); the paper's is 0.6
  bool detect_anomaly = false;  // name the first op whose forward gives NaN or whose backward gives NaN/inf
  bool pre_norm = false;     // pre-norm layers (x + Sublayer(LayerNorm(x))) instead of the paper's post-norm
};

// `tapestry train --quick` (docs/training.md: "Multi30k"): the defaults of a run that shows
// learning in minutes. Flags and a config file still override them.
TranslationOptions quick_translation_options();

// The task's options, one row each (flag, help, values, role): the command line's flags, the
// config.toml a run writes and the resume recipe.
OptionTable options_table(TranslationOptions& options);

// The options as TOML, one `key = value` per line with the command line's flag names as keys, so
// that the file (saved as config.toml beside the checkpoints) reads back with
// `tapestry train --config-file FILE`.
std::string options_to_toml(const TranslationOptions& options);

struct EpochResult {
  int64_t epoch = 0, steps = 0;
  double train_loss = 0, val_loss = 0, val_bleu = 0, seconds = 0, tokens_per_s = 0;
};

struct TranslationResult {
  std::vector<EpochResult> epochs;
  double test_bleu = 0, val_bleu = 0;  // the final model's (averaged or last), decoded as the test set is
  std::string test_bleu_line;
  bool stopped = false;  // stop_after cut the run short
  int interrupted = 0;   // the signal (SIGINT/SIGTERM) that stopped the run after a checkpoint, or 0
  int64_t skipped_steps = 0;  // steps skipped for a non-finite loss or gradient (--on-nan skip)
  double best_val_bleu = -1;
  int64_t best_epoch = 0;
  int64_t averaged = 0;  // how many checkpoints were averaged for the test (0: none)
};

TranslationResult train_translation(const TranslationOptions& options);

// A trained model and its subwords, from a directory train_translation wrote. `weights` names
// the file in it; empty picks the weights the final test used: model.avg.safetensors when
// checkpoints were averaged, else model.safetensors. Throws a tapestry::Error naming the file
// when it is missing or does not fit its recorded config.
struct Translator {
  std::string weights_path;
  std::unique_ptr<Subword> subword;
  std::unique_ptr<models::Transformer> model;
};
Translator load_translator(const std::string& checkpoint_dir, const std::string& weights = "");

// Translations of `sources`, in order, in batches of `batch` consecutive sentences: beam search
// with the paper's length penalty, or greedy when beam is 1.
std::vector<std::string> translate(Translator& translator, const std::vector<std::string>& sources, int64_t beam = 4,
                                   double alpha = 0.6, int64_t batch = 50);

}  // namespace tapestry::apps
