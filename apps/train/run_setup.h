// What every task does around its own part (its data, model, optimizer and metric), written once:
// the run's set-up, and the option groups several tasks share. A driver reads as its phases:
//
//   RunSetup run(options_table(o), o.trainer);  // options checked as the flags are, threads, config.toml
//   ... read and check the data (nothing is written before this succeeds) ...
//   run.open({"spm.model"});                    // the run folder (resume, overwrite), then the seed
//   ... the model, its optimizer and schedule, the batches ...
//   Trainer trainer(model, adamw, &schedule, run.record(recipe, metadata, title));
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "apps/train/option_table.h"
#include "apps/train/run_dir.h"
#include "apps/train/trainer.h"
#include "tapestry/optim/optimizer.h"

namespace tapestry::apps {

class RunSetup {
 public:
  // Checks every option (and the table's checks across rows) as the flags are checked, sets the
  // threads, and makes config.toml's text, refusing text TOML cannot hold: all before any data are
  // read. `config_toml` makes the text instead of the table where a task writes out what its
  // defaults resolve to (the default data folder); record() makes it again, for what the task
  // resolved in between (a base's path and family).
  RunSetup(OptionTable table, TrainerOptions trainer, std::function<std::string()> config_toml = {});

  const OptionTable& table() const { return table_; }
  const std::string& config_toml() const { return config_toml_; }
  // A copy of the Trainer's options made at construction: set them on the options before.
  const TrainerOptions& trainer() const { return trainer_; }

  // The run folder, with its resume and overwrite rules (`files`: the task's own besides
  // config.toml, the checkpoints and the curves), then the seed. A task without a run folder (the
  // copy task) calls seed() alone.
  void open(std::vector<std::string> files = {});
  void seed() const;

  // The Trainer's options, with what the run folder records: the recipe rows, and `recipe`'s
  // entries (what follows from the options: the data read, the vocabulary) beside them; config.toml;
  // the model's metadata (written with every weights file) and the curves' title.
  TrainerOptions& record(const std::map<std::string, std::string>& recipe, std::map<std::string, std::string> metadata,
                         std::string curves_title);

 private:
  OptionTable table_;
  TrainerOptions trainer_;
  std::function<std::string()> make_toml_;
  std::string config_toml_;
  std::optional<RunFolder> folder_;
};

// The rows every task with a run folder ends its table with, from the Trainer's: save-every (and
// `also`, in order), threads, device, then the run control (kRunControlFlags).
void add_run_rows(OptionTable& table, const OptionTable& trainer, const std::vector<std::string>& also = {});

// The optimizer-and-schedule group of the tasks trained with AdamW on a cosine schedule (lm,
// image, mlm, classify): linear warmup to lr, cosine decay to min_lr at the last step, weight
// decay on the matrices only.
struct AdamWCosine {
  int64_t warmup = 0;  // steps
  double lr = 0, min_lr = 0, weight_decay = 0;

  // --warmup, --lr, --min-lr, --weight-decay (its help names what decays), and the check that
  // min-lr is not above lr.
  void add_rows(OptionTable& table, const std::string& weight_decay_help);
  // The schedule over `total_steps` (the warmup cut to them).
  optim::CosineSchedule schedule(int64_t total_steps) const;
  int64_t warmup_steps(int64_t total_steps) const { return std::min(warmup, total_steps); }
  // AdamW with `decay` at weight_decay and `no_decay` at none; betas (0.9, beta2), eps 1e-8.
  std::unique_ptr<optim::AdamW> adamw(std::vector<Tensor> decay, std::vector<Tensor> no_decay, double beta2 = 0.999) const;
};

}  // namespace tapestry::apps
