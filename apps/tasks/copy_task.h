// The copy task of the Annotated Transformer: learn to output the source sequence (random
// symbols 1..V-1, first symbol 1 as the start) and check exact copies on held-out sequences.
#pragma once
#include <cstdint>
#include <string>

#include "apps/train/run_setup.h"
#include "apps/train/trainer.h"

namespace tapestry::apps {

struct CopyTaskOptions {
  // The Trainer's part: a held-out check every 50 steps, the seed, the progress line, the step log.
  TrainerOptions trainer = [] {
    TrainerOptions t;
    t.eval_every = 50;
    t.seed = 1;
    return t;
  }();
  int64_t vocab = 11, seq_len = 10, batch = 80;
  int64_t d_model = 512, heads = 8, d_ff = 2048, layers = 2;
  double dropout = 0.1;
  bool pre_norm = true;  // the Annotated Transformer's layout; post-norm diverges at its lr peak
  int64_t warmup = 400;
  double lr_factor = 0.5;  // the Annotated Transformer: Adam lr 0.5 times rate(factor 1): peak 1.1e-3
  int64_t max_steps = 3000;
  int64_t eval_sequences = 200;
};

// The task's options, one row each (flag, help, values): the command line's flags.
OptionTable options_table(CopyTaskOptions& options);

struct CopyTaskResult {
  bool solved = false;     // every held-out sequence copied exactly
  int64_t steps = 0;       // steps taken until solved (or max_steps)
  double last_loss = 0;
  double accuracy = 0;     // fraction of held-out sequences copied exactly at the end
};

// Trains on the Trainer: a line per held-out check (step, loss, exact copies), stopping once
// every held-out sequence is copied exactly.
CopyTaskResult train_copy_task(const CopyTaskOptions& options);

}  // namespace tapestry::apps
