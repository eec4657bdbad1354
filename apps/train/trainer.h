// The one training loop of tapestry's applications. A task (translation, the copy task, a
// language model, ...) hands the Trainer a model, an optimizer, a schedule and a DataSource; the
// Trainer runs the steps (gradient accumulation weighted by tokens, clipping, the schedule, a
// non-finite guard), shows progress with rate and ETA, evaluates through the task's hook, and,
// given a run folder, writes checkpoints (every N steps and per epoch), keeps the last K epoch
// copies and the best on a metric, averages the last N, resumes exactly (Note [Exact resume] in
// checkpoints.cpp) and draws the curves. `tapestry bench` times Trainer::step, the same step training runs.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "apps/train/option_table.h"
#include "tapestry/dist/dist.h"
#include "tapestry/nn/module.h"
#include "tapestry/optim/optimizer.h"

namespace tapestry::apps {

// One batch as the trainer sees it: how many tokens its loss averages over (which weights it
// inside an accumulated step) and how to compute that mean loss (recording the forward pass).
struct TrainBatch {
  int64_t tokens = 1;
  std::function<Tensor()> loss;
};

// Where the batches come from. plan(epoch) is called once at the start of each epoch (1-based)
// and returns how many batches it has; batch(i) gives batch i of the planned epoch. A resumed run
// calls plan() for its epoch and then batch() from where it stopped, so a plan must follow from
// the epoch alone (and the task's seed), never from earlier calls.
//
// Data parallelism (dist, `mpirun -np N tapestry train ...`): the plan is of global
// batches, the same on every rank; the Trainer calls set_shard(rank, world) first, and batch(i)
// then gives only this rank's shard of global batch i (shard_of: every world-th example from
// rank on), which may be empty (tokens 0, no loss).
class DataSource {
 public:
  virtual ~DataSource() = default;
  virtual int64_t plan(int64_t epoch) = 0;
  virtual TrainBatch batch(int64_t index) = 0;
  void set_shard(int rank, int world) {
    shard_rank_ = rank;
    shard_world_ = world;
  }

 protected:
  int shard_rank_ = 0, shard_world_ = 1;
};

// Rank `rank`'s shard of `items`: items rank, rank + world, rank + 2 world, ... Strided rather
// than contiguous, so that a batch sorted by length gives every rank a like share of tokens.
// The shards of the ranks are disjoint and together hold every item once.
template <class T> std::vector<T> shard_of(const std::vector<T>& items, int rank, int world) {
  std::vector<T> out;
  for (size_t i = static_cast<size_t>(rank); i < items.size(); i += static_cast<size_t>(world)) out.push_back(items[i]);
  return out;
}

// A number an evaluation reports: "val loss 4.273" in the epoch line, a curve in curves.svg.
struct Metric {
  std::string key;     // its metadata name in checkpoints ("val_bleu")
  std::string label;   // as printed and plotted ("val BLEU")
  double value = 0;
  int decimals = 3;
  std::string note;    // printed after the value (" (greedy)")
  bool own_axis = false;  // plotted on the right-hand axis (a score beside losses)
};
using Metrics = std::vector<Metric>;
// The value of `key` in metrics; throws naming the key when absent.
double metric(const Metrics& metrics, const std::string& key);

struct TrainerOptions {
  // The process: its threads (0: all cores; the run's set-up sets them) and the device the task
  // places its model on (cpu, cuda, cuda:N, emulated: training_device).
  int64_t threads = 0;
  std::string device = "cpu";
  int64_t epochs = 1;
  int64_t accumulate = 1;       // batches per optimizer step, their gradients summed token-weighted
  double clip_norm = 0;         // clip the global gradient norm to this before each step (0: none)
  bool checkpoint_activations = false;  // recompute each block of the model's stacks in backward
                                        // (Module::set_checkpointing): less memory, one more forward
  std::string precision = "fp32";  // "bf16": each step's forward and backward under an AutocastGuard
  bool tf32 = false;            // float32 matmuls on a GPU through TF32 tensor cores (cuda::set_allow_tf32;
                                // process-wide from the Trainer's construction, as PyTorch's switch)
  std::string on_nan = "stop";  // a non-finite loss or gradient norm: "stop" (throw) or "skip" the step
  int64_t eval_every = 0;       // also evaluate every N steps (0: at the end of each epoch only)
  bool progress = true;         // the progress line on stderr
  std::string rate_unit = "tok";  // what a TrainBatch's count counts, as the rate shows it ("img/s")
  std::string step_log;         // a TSV line per optimizer step: step, epoch, loss, tokens, lr, grad norm

  // The run folder (empty: nothing is written, as for the copy task and bench) and what goes in it.
  std::string out_dir;
  bool resume = false;          // continue from out_dir's checkpoint, exactly (Note [Exact resume])
  bool overwrite = false;       // the task's RunFolder: start over in an out_dir that holds a run
  int64_t save_every = 0;       // also checkpoint every N steps (0: at the end of each epoch only)
  int64_t stop_after = 0;       // stop after N steps, right after a checkpoint (tests interruption)
  // With a time limit, "plan" (Note [Planning to the deadline]) ends the run at the last whole
  // epoch that fits, the learning rate decaying to zero over the last epochs of that plan; "cut"
  // trains on until the limit and ends the epoch there.
  std::string on_time_limit = "plan";
  int64_t cooldown = 0;         // the learning rate falls to zero over the run's last N epochs (0: only
                                // when a plan ends the run early, over a third of its epochs, at least 2)
  double time_limit = 0;        // seconds: end training after the step that reaches it (0: none); the
                                // epoch then ends there (evaluated, saved) and the run is complete
  int64_t keep = 5;             // keep the last K epoch copies (model.epochE.safetensors)
  int64_t average = 5;          // after the last epoch, average the last N epoch copies into the model
  std::string best_metric;      // keep model.best.safetensors on this metric's highest value ("": none)
  // A fine-tuning run with a frozen base (LoRA): the checkpoint and the weights files hold the
  // trainable parameters only, and the weights files are adapter.safetensors (adapter.epochE, ...
  // .best, .avg) instead of model.*; model_metadata then names the base they apply to.
  bool trainable_only = false;
  // Resume refuses a checkpoint whose recipe differs: the model and whatever decides the batches.
  // A key absent from an older checkpoint is compared with recipe_defaults, or passes.
  std::map<std::string, std::string> recipe, recipe_defaults;
  std::map<std::string, std::string> model_metadata;  // written with every weights file
  std::map<std::string, std::string> run_files;       // written (atomically) once resume has checked
  std::string curves_title;     // curves.svg's title
  // Data parallelism: each rank's dropout stream is reseeded every step from (seed, step, rank),
  // so a resumed run continues exactly. A checkpoint written by a different number of ranks is
  // refused unless reshard (the global batches stay the same; the dropout masks do not).
  uint64_t seed = 0;
  bool reshard = false;
  // Gradient buckets (dist::GradReducer): as PyTorch DDP's bucket_cap_mb, first bucket small so
  // that its all-reduce starts early in the backward.
  size_t bucket_bytes = dist::GradReducer::kBucketBytes, first_bucket_bytes = dist::GradReducer::kFirstBucketBytes;
};

struct EpochRecord {
  int64_t epoch = 0, steps = 0;  // steps: the optimizer steps taken by the end of this epoch
  double train_loss = 0, seconds = 0, tokens_per_s = 0;
  Metrics metrics;
};

struct StepResult {
  double loss = 0;       // the step's mean loss over its tokens
  double loss_sum = 0;   // its sum over the tokens (each batch's mean loss times its tokens)
  int64_t tokens = 0;
  double grad_norm = 0;  // before clipping
  bool taken = true;     // false: skipped for a non-finite loss or gradient (on_nan = "skip")
  std::string skipped;   // why, when not taken
  // Agreed by every rank: a stop signal arrived (on any rank), the time limit is reached.
  bool stop_signal = false, out_of_time = false;
};

struct FitResult {
  std::vector<EpochRecord> epochs;
  int64_t steps = 0;
  double last_loss = 0;      // the last step's
  Metrics last_metrics;      // the last evaluation's
  bool stopped = false;      // stop_after cut the run short
  bool finished_early = false;  // the should_stop hook ended training
  bool out_of_time = false;     // time_limit ended training
  int interrupted = 0;       // the signal (SIGINT/SIGTERM) that stopped the run after a checkpoint, or 0
  int64_t skipped_steps = 0;
  double best_value = 0;
  int64_t best_epoch = 0;    // 0: none
  int64_t averaged = 0;      // epoch copies averaged into the model at the end (0: none)
};

class Checkpoints;
class Progress;
struct ResumePoint;

// The loop: fit() runs the epochs, each a run of step()s over the DataSource's batches, evaluates
// after each, and hands the run folder to Checkpoints and what is shown to Progress.
class Trainer {
 public:
  // The schedule may be null (the optimizer's lr stays as it is).
  Trainer(nn::Module& model, optim::Optimizer& optimizer, const optim::Schedule* schedule, TrainerOptions options);
  ~Trainer();
  Trainer(const Trainer&) = delete;  // its parts hold references to its options
  Trainer& operator=(const Trainer&) = delete;

  // Evaluation after each epoch (and every eval_every steps); its metrics are printed, plotted,
  // recorded. The model is in eval mode while it runs.
  std::function<Metrics(int64_t epoch, int64_t step)> evaluate;
  // Ends training early after an evaluation (the copy task: every sequence copied).
  std::function<bool(const Metrics&)> should_stop;

  FitResult fit(DataSource& data);

  // One optimizer step on a group of batches: schedule, forward and backward of each (token
  // weighted), clip, non-finite guard, optimizer step, zero the gradients. On N ranks each
  // group is this rank's shard; the gradients and the token and loss totals are summed over the
  // ranks before the clip, so every rank takes the same step.
  StepResult step(const std::vector<TrainBatch>& group);
  // Seconds spent summing gradients over the ranks so far (0 on one process).
  double allreduce_seconds() const;  // the gradients' all-reduce, all steps: waiting after the backward and its hooks
  const dist::GradReducer* reducer() const { return reducer_.get(); }  // null before the first step
  int64_t steps_taken() const { return step_; }

 private:
  bool run_epoch(DataSource& data, int64_t epoch, const ResumePoint& start, EpochRecord& record, FitResult& result);
  void report_stop(FitResult& result, const std::string& after);
  Metrics run_evaluation(int64_t epoch);
  // On N ranks, each rank's dropout stream from (seed, step, rank); one process keeps its stream.
  void reseed_dropout_for_rank() const;
  // Note [Planning to the deadline]: after an epoch that took `seconds`, the epochs the time left fits.
  void plan_to_deadline(int64_t epoch, double seconds);
  int64_t cooldown_epochs() const;  // the ramp's epochs: --cooldown; else a third of a plan's (0: none)
  int64_t epochs_averaged() const;  // --average; a plan's run, at most 2 (Note [Planning to the deadline])

  nn::Module& model_;
  Device device_ = Device::CPU;  // the model's (its first parameter's): where autocast runs
  optim::Optimizer& optimizer_;
  const optim::Schedule* schedule_;
  TrainerOptions o_;
  int64_t step_ = 0;
  std::chrono::steady_clock::time_point run_start_ = std::chrono::steady_clock::now();
  int64_t planned_epochs_ = 0;    // the epoch the run ends with: o_.epochs, or fewer by the plan
  std::vector<double> epoch_seconds_;  // wall time of each epoch of this session, evaluation included
  double lr_scale_ = 1.0;           // the deadline's cooldown, applied over the schedule's lr
  std::unique_ptr<dist::GradReducer> reducer_;  // made at the first step (it does nothing on one rank)
  std::unique_ptr<Checkpoints> checkpoints_;    // the run folder (checkpoints.h)
  std::unique_ptr<Progress> progress_;          // what the run shows (progress.h)
};

// The element-wise mean of the parameters in `paths` (safetensors files of one model), as the
// paper averages its last checkpoints. Throws naming the file whose tensors do not match.
std::map<std::string, Tensor> average_checkpoints(const std::vector<std::string>& paths);

// The Trainer's options as table rows (flags, help, accepted values); a task's table takes the
// ones it offers (OptionTable::take) and marks its recipe among them.
OptionTable trainer_options(TrainerOptions& options);
// The Trainer's flags that steer one invocation of a run folder's task (multi30k, lm): what a
// nan does, the time limit, resume/overwrite/reshard, the step log, the progress line,
// activation checkpointing (memory for compute; the same gradients) and the matmul precision (bf16
// autocast, TF32 on a GPU).
inline const std::vector<std::string> kRunControlFlags = {"on-nan", "time-limit", "on-time-limit", "resume", "overwrite", "reshard",
                                                         "step-log", "no-progress", "checkpoint-activations",
                                                         "precision", "tf32"};

// Note [Planning to the deadline]: the epochs a run with `seconds_left` of its time limit can
// still end, after `done` epochs whose wall times (evaluation included) were `epoch_seconds`: it
// plans with the slower of the last two, so that one quick epoch does not promise too much. At
// most `max_epochs`, at least `done`.
int64_t epochs_that_fit(double seconds_left, const std::vector<double>& epoch_seconds, int64_t done, int64_t max_epochs);
// The cooldown: the schedule's lr times this, falling linearly from 1 at the start of the last
// `window` epochs before `last_epoch` to 0 at its end (1 everywhere for a window of 0). `batch` of
// `batches` is the position in `epoch`.
double cooldown_lr_scale(int64_t epoch, int64_t batch, int64_t batches, int64_t last_epoch, int64_t window);

// Throws naming the first bad option (what the Trainer's constructor checks), as its flag would.
void check_options(const TrainerOptions& options);

// The device a task trains on, from its --device: under N ranks, plain "cuda" takes a GPU of this
// host, the local rank modulo their number (torchrun's LOCAL_RANK convention).
Device training_device(const std::string& name);

// "1:02:03" or "2:03".
std::string clock_text(double seconds);
double seconds_since(std::chrono::steady_clock::time_point start);

}  // namespace tapestry::apps
