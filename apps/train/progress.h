// What a training run shows (the Trainer's reporting part): the progress line with rate and ETA
// on stderr, the step log (a TSV line per optimizer step), the epoch line, curves.svg, and on N
// ranks the summary of the gradients' all-reduce. Only rank 0 shows anything.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "apps/train/trainer.h"

namespace tapestry::apps {

// ", val loss 4.2730, val BLEU 4.10 (greedy)": metrics as the progress lines print them.
std::string metrics_text(const Metrics& metrics);

class Progress {
 public:
  explicit Progress(const TrainerOptions& options);
  // An epoch of `batches` starts at first_batch (after a resume) with first_tokens already counted.
  void begin_epoch(int64_t epoch, int64_t batches, int64_t first_batch, int64_t first_tokens);
  // After a step that took batches [before, done): the line (redrawn on a terminal, every tenth
  // of the epoch on a pipe) with the epoch's mean loss, this process's tokens/s, lr and ETA.
  void after_step(int64_t before, int64_t done, int64_t step, double loss_sum, int64_t tokens, double lr);
  void end_line();  // ends a terminal's redrawn line before other output
  void log_step(int64_t step, int64_t epoch, const StepResult& r, double lr);
  double epoch_seconds() const;
  // "epoch 3: train loss 2.151, val loss ..., 61 s, 7012 tok/s, elapsed 3:05".
  void epoch_line(const EpochRecord& record, double run_seconds, int64_t skipped_steps);
  void draw_curves(const std::vector<EpochRecord>& epochs);
  void dist_summary(const dist::GradReducer& reducer, double steps, double allreduce_seconds, double train_seconds);

 private:
  const TrainerOptions& o_;
  bool shows_, tty_;
  int64_t epoch_ = 0, batches_ = 0, first_batch_ = 0, first_tokens_ = 0;
  std::chrono::steady_clock::time_point epoch_start_;
};

}  // namespace tapestry::apps
