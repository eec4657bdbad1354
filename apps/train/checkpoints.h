// The Trainer's run folder (its checkpointing part): the checkpoint every N steps and per epoch,
// exact resume from it (Note [Exact resume] in checkpoints.cpp), the per-epoch copies of which the
// last K stay, the best on a metric, and the average of the last N at the end. Rank 0 writes;
// every rank reads on resume.
#pragma once
#include <cstdint>

#include "apps/train/trainer.h"

namespace tapestry::apps {

// Where a resumed run goes on: its epoch, the next batch, and the epoch's running loss and tokens.
struct ResumePoint {
  int64_t epoch = 1, batch = 0, tokens = 0;
  double loss_sum = 0;
  int64_t planned_epochs = 0;  // the plan to a deadline the run had made (0: none; it ran to its --epochs)
};

class Checkpoints {
 public:
  // planned_epochs: the Trainer's plan to a deadline (Note [Planning to the deadline]), which the
  // checkpoints record when it ends the run before --epochs.
  Checkpoints(nn::Module& model, optim::Optimizer& optimizer, const TrainerOptions& options,
              const int64_t& planned_epochs);
  // checkpoint.safetensors (model, optimizer, position, rng, recipe) and model.safetensors.
  void save(int64_t step, int64_t epoch, int64_t next_batch, double loss_sum, int64_t tokens);
  // Loads the folder's checkpoint into the model and optimizer, sets `step`, and returns where to
  // go on (epoch 1, batch 0 without one); refuses a checkpoint of another recipe or rank count.
  ResumePoint load(int64_t& step, FitResult& result);
  // The epoch copy (keeping the last K), the best on best_metric, then the checkpoint that moves
  // resume past this epoch.
  void end_of_epoch(int64_t step, int64_t epoch, const EpochRecord& record, FitResult& result);
  // After the last epoch: the mean of the last N epoch copies becomes the model (model.avg).
  void average(FitResult& result, int64_t last_epoch, int64_t count);  // the last `count` epoch copies up to last_epoch

 private:
  // The state the files hold (all of it, or the trainable parameters: TrainerOptions::trainable_only),
  // the path of a weights file ("" -> DIR/model.safetensors, ".best" -> DIR/adapter.best.safetensors),
  // and loading such a state (which must name exactly those tensors).
  nn::NamedTensors saved_state() const;
  std::string weights_path(const std::string& suffix) const;
  void load_saved_state(const std::map<std::string, Tensor>& state, const std::string& from, const char* what);
  nn::Module& model_;
  optim::Optimizer& optimizer_;
  const TrainerOptions& o_;
  const int64_t& planned_epochs_;
};

}  // namespace tapestry::apps
