// The training loop (see trainer.h).
#include "apps/train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "apps/train/checkpoints.h"
#include "apps/train/progress.h"
#include "apps/train/run_dir.h"
#include "tapestry/nn/safetensors.h"
#include "tapestry/ops/autocast.h"
#include "tapestry/ops/cuda.h"
#include "tapestry/ops/factory.h"
#include "tapestry/ops/file.h"

namespace tapestry::apps {

namespace {

std::string non_finite_text(double loss_sum, double grad_norm, int64_t step) {
  return fmt::format("a non-finite {} ({}) at step {}", std::isfinite(loss_sum) ? "gradient norm" : "loss",
                     std::isfinite(loss_sum) ? grad_norm : loss_sum, step);
}

}  // namespace

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string clock_text(double s) {
  int64_t t = static_cast<int64_t>(s + 0.5);
  return t >= 3600 ? fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60) : fmt::format("{}:{:02}", t / 60, t % 60);
}

double metric(const Metrics& metrics, const std::string& key) {
  for (const Metric& m : metrics)
    if (m.key == key) return m.value;
  throw Error(fmt::format("train: the evaluation reports no metric '{}'", key));
}

OptionTable trainer_options(TrainerOptions& o) {
  OptionTable t("trainer");
  t.add("epochs", o.epochs, "epochs").positive();
  t.add("accumulate", o.accumulate, "batches per optimizer step (their gradients summed, weighted by tokens)").positive();
  t.add("clip-norm", o.clip_norm, "clip the global gradient norm to this before each step (0: none)").at_least(0);
  t.add("on-nan", o.on_nan, "a non-finite loss or gradient norm: stop (nothing saved) or skip the step")
      .one_of({"stop", "skip"})
      .this_run_only();
  t.add("checkpoint-activations", o.checkpoint_activations, "recompute each block's forward during backward instead "
        "of keeping its activations: less memory for about one more forward of compute, the same gradients (to the bit; "
        "the translation Transformer's encoder: to rounding)")
      .this_run_only();
  t.add("precision", o.precision, "bf16: the train step's matmuls in bfloat16 with float32 accumulation, as "
        "torch.autocast(dtype=torch.bfloat16) (weights, optimizer, softmax, norms, loss and evaluation stay "
        "float32); needs a CPU with AVX512-BF16, or a GPU of compute capability 8.0 or later")
      .one_of({"fp32", "bf16"})
      .this_run_only();
  t.add("tf32", o.tf32, "float32 matmuls on a GPU through TF32 tensor cores (about 10 mantissa bits, as "
        "torch.backends.cuda.matmul.allow_tf32); nothing changes on the CPU")
      .this_run_only();
  t.add("eval-every", o.eval_every, "also evaluate every N steps (0: after each epoch only)").at_least(0);
  t.add("no-progress", o.progress, "no progress line on stderr").this_run_only().clears = true;
  t.add("step-log", o.step_log, "append a TSV line per optimizer step: step, epoch, loss, tokens, lr, gradient norm")
      .this_run_only();
  t.add("out", o.out_dir, "the run folder: tokenizer, config.toml, checkpoints, curves");
  t.add("resume", o.resume, "continue exactly from the checkpoint in --out").this_run_only();
  t.add("overwrite", o.overwrite, "start over in an --out that holds a run (deletes its checkpoints)").this_run_only();
  t.add("reshard", o.reshard, "with --resume under mpirun: accept a checkpoint written by a different number of "
        "processes (same global batches; dropout masks differ, so not bit-exact)").this_run_only();
  t.add("save-every", o.save_every, "also checkpoint every N steps (0: after each epoch only)").at_least(0);
  t.add("on-time-limit", o.on_time_limit, "with --time-limit: plan (after each epoch, end at the last whole epoch "
        "that fits, the learning rate falling linearly to zero over its last third (or --cooldown epochs), and average "
        "at most its last 2) or cut (train until the limit, ending the epoch there)").one_of({"plan", "cut"})
      .this_run_only();
  t.add("cooldown", o.cooldown, "the learning rate falls linearly to zero over the run's last N epochs (0: only "
        "when a time limit's plan ends the run early, over a third of its epochs, at least 2)").at_least(0);
  t.add("time-limit", o.time_limit, "end training after this many seconds (0: none): planned to, or cut at, as "
        "--on-time-limit says; the run then ends evaluated and saved").at_least(0).this_run_only();
  t.add("keep", o.keep, "keep the last K epoch checkpoints").positive();
  t.add("average", o.average, "average the last N epoch checkpoints into the model at the end (0, 1: none)").at_least(0);
  t.add("seed", o.seed, "random seed (initialization, batch order, dropout)");
  t.add("threads", o.threads, "threads (0: all cores)").at_least(0);
  t.add("device", o.device, "cpu, cuda, cuda:N (a GPU needs a -DTAPESTRY_CUDA=ON build) or emulated (the test device)")
      .check(device_problem);
  return t;
}

Device training_device(const std::string& name) {
  if (name == "cuda" && dist::world_size() > 1)
    return Device::parse(fmt::format("cuda:{}", dist::local_rank() % std::max(1, cuda::device_count())));
  return Device::parse(name);
}

void check_options(const TrainerOptions& options) {
  TrainerOptions copy = options;  // the table binds to fields it could set; checking sets none
  trainer_options(copy).check();
}

Trainer::Trainer(nn::Module& model, optim::Optimizer& optimizer, const optim::Schedule* schedule,
                 TrainerOptions options)
    : model_(model), optimizer_(optimizer), schedule_(schedule), o_(std::move(options)) {
  check_options(o_);
  // Averaging adapters averages A and B apart, and avg(B) avg(A) is no epoch's update.
  TP_CHECK(!o_.trainable_only || o_.average <= 1, "train: averaging the epoch copies of adapters (average {}) is not "
           "averaging their updates; set average to 0", o_.average);
  // The ramp scales a schedule's rate; without one it would silently do nothing.
  TP_CHECK(schedule_ || o_.cooldown == 0, "train: cooldown {} ramps a learning-rate schedule's rate, and this Trainer "
           "has no schedule; give it one, or set cooldown to 0", o_.cooldown);
  if (o_.checkpoint_activations) model_.set_checkpointing(true);
  const std::vector<Tensor> params = model_.parameters();
  device_ = params.empty() ? Device::CPU : params.front().device();
  std::string why;
  TP_CHECK(o_.precision != "bf16" || bf16_supported(device_, &why), "train: --precision bf16: {}", why);
  if (o_.tf32) cuda::set_allow_tf32(true);
  checkpoints_ = std::make_unique<Checkpoints>(model_, optimizer_, o_, planned_epochs_);
  progress_ = std::make_unique<Progress>(o_);
}

Trainer::~Trainer() = default;

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Whether `local` holds on any rank (the identity on one process).
bool on_any_rank(bool local) {
  return dist::allreduce(static_cast<int64_t>(local), dist::ReduceOp::Max) > 0;
}

}  // namespace

void Trainer::reseed_dropout_for_rank() const {
  if (dist::world_size() > 1) manual_seed(splitmix64(o_.seed ^ splitmix64(static_cast<uint64_t>(step_) ^ splitmix64(dist::rank() + 1))));
}

StepResult Trainer::step(const std::vector<TrainBatch>& group) {
  TP_CHECK(!group.empty(), "train: a step needs at least one batch");
  // One process is N ranks with N = 1: every collective below is the identity there, and the
  // reducer does nothing, so the one path serves both (Note [One sync per step] still holds on
  // one process: its losses and gradient norm are read in one copy).
  StepResult r;
  int64_t local_tokens = 0;
  for (const TrainBatch& b : group) local_tokens += b.tokens;
  r.tokens = dist::allreduce(local_tokens);  // the whole group's, over the ranks (tokens are known before any loss)
  TP_CHECK(r.tokens > 0, "train: step {} has no tokens on any of the {} ranks", step_ + 1, dist::world_size());
  ++step_;
  if (schedule_) {
    schedule_->apply(optimizer_, step_);
    if (lr_scale_ != 1.0) optimizer_.set_lr(optimizer_.lr() * lr_scale_);  // the deadline's cooldown
  }
  double& loss_sum = r.loss_sum;
  reseed_dropout_for_rank();
  // Each batch's mean loss is weighted by its share of the group's tokens (all ranks'), so the
  // gradients summed over the batches and the ranks are those of the group's mean token loss, as
  // one batch of the group's size would give. The backward of the last batch that has tokens
  // starts the gradients' all-reduce (overlap, on N ranks).
  if (!reducer_) reducer_ = std::make_unique<dist::GradReducer>(model_.trainable_parameters(), o_.bucket_bytes, o_.first_bucket_bytes);
  size_t last = group.size();
  while (last > 0 && group[last - 1].tokens == 0) --last;
  // Note [One sync per step]: the losses stay on the device until every backward has been queued;
  // then they are read together with the gradients' squared norm, in one copy to the host (one
  // synchronisation on a GPU, where reading each loss would stall the device mid-step). The values
  // and their order of summation are those of reading each loss at once.
  std::vector<std::pair<Tensor, int64_t>> losses;  // detached, with their batch's tokens
  AutocastGuard autocast(o_.precision == "bf16" ? Precision::BFloat16 : Precision::Float32, device_);
  for (size_t i = 0; i < last; ++i) {
    const TrainBatch& b = group[i];
    if (b.tokens == 0) continue;  // an empty shard: this rank adds zeros
    if (i + 1 == last) reducer_->prepare();
    Tensor loss = b.loss();
    losses.emplace_back(loss.detach(), b.tokens);
    const double weight = static_cast<double>(b.tokens) / static_cast<double>(r.tokens);
    if (weight == 1.0) loss.backward();
    else (loss * weight).backward();
  }
  reducer_->reduce();  // the gradients summed over the ranks
  // The losses and the squared gradient norm, as doubles in one copy.
  const std::vector<Tensor> params = model_.trainable_parameters();
  TensorList parts;
  for (auto& [loss, tokens] : losses) parts.push_back(reshape(loss.to(DType::Float64), {1}));
  const Device device = losses.empty() ? device_ : losses[0].first.device();
  parts.push_back(reshape(optim::grad_sum_of_squares(params, device), {1}));
  const std::vector<double> values = cat(parts, 0).to_vector<double>();
  for (size_t i = 0; i < losses.size(); ++i) loss_sum += values[i] * static_cast<double>(losses[i].second);
  r.grad_norm = std::sqrt(values.back());
  // One small all-reduce agrees on the loss and on whether to stop.
  r.stop_signal = StopSignals::pending() != 0;
  r.out_of_time = o_.time_limit > 0 && seconds_since(run_start_) >= o_.time_limit;
  Tensor totals = tensor(std::vector<double>{loss_sum, r.stop_signal ? 1.0 : 0.0, r.out_of_time ? 1.0 : 0.0}, {}, kFloat64);
  dist::allreduce_(totals);
  const std::vector<double> tv = totals.to_vector<double>();
  loss_sum = tv[0], r.stop_signal = tv[1] > 0, r.out_of_time = tv[2] > 0;
  r.loss = loss_sum / static_cast<double>(r.tokens);
  // A non-finite loss or gradient would poison the weights and every checkpoint after it.
  if (!std::isfinite(loss_sum) || !std::isfinite(r.grad_norm)) {
    optimizer_.zero_grad();
    TP_CHECK(o_.on_nan == "skip", "train: {}; stopped before saving anything, the last checkpoint is intact. Lower "
             "--lr-factor, set --clip-norm, find the op with --detect-anomaly, or skip such steps with --on-nan skip",
             non_finite_text(loss_sum, r.grad_norm, step_));
    r.skipped = non_finite_text(loss_sum, r.grad_norm, step_);
    --step_;  // the step is not taken: the schedule and the optimizer stay where they were
    r.taken = false;
    return r;
  }
  if (o_.clip_norm > 0) optim::scale_grads_to_norm(params, o_.clip_norm, r.grad_norm);
  optimizer_.step();
  optimizer_.zero_grad();
  return r;
}

double Trainer::allreduce_seconds() const { return reducer_ ? reducer_->seconds() + reducer_->hook_seconds() : 0.0; }

Metrics Trainer::run_evaluation(int64_t epoch) {
  if (!evaluate || !dist::is_main()) return {};
  model_.eval();
  Metrics m = evaluate(epoch, step_);
  model_.train();
  return m;
}

FitResult Trainer::fit(DataSource& data) {
  const bool saving = !o_.out_dir.empty();
  TP_CHECK(saving || (!o_.resume && o_.save_every == 0 && o_.stop_after == 0 && o_.best_metric.empty()),
           "train: resume, save_every, stop_after and best_metric need a run folder (out_dir)");
  FitResult result;
  run_start_ = std::chrono::steady_clock::now();
  ResumePoint start;
  if (saving && o_.resume) start = checkpoints_->load(step_, result);
  const int64_t start_step = step_;
  // On N ranks every rank trains and reads a resumed checkpoint; rank 0 alone writes files,
  // evaluates and shows progress, and the others follow its decisions.
  if (dist::world_size() > 1) {
    NoGradGuard no_grad;  // the same starting weights everywhere: rank 0's (fresh, or the checkpoint's)
    for (auto& [name, t] : model_.state_dict()) {
      Tensor v = t;
      dist::broadcast_(v);
    }
    data.set_shard(dist::rank(), dist::world_size());
  }
  std::unique_ptr<StopSignals> stop_signals;
  if (saving) {
    stop_signals = std::make_unique<StopSignals>();
    if (dist::is_main())
      for (const auto& [name, contents] : o_.run_files) {
        std::filesystem::create_directories(std::filesystem::path(o_.out_dir + "/" + name).parent_path());
        write_file_atomic(o_.out_dir + "/" + name, contents);
      }
  }
  double train_seconds = 0;  // the epochs' training, without their evaluations
  planned_epochs_ = o_.epochs;
  if (start.planned_epochs > 0 && start.planned_epochs < o_.epochs) {
    // A run resumed inside the ramp of the plan it had made keeps that plan (its learning rate
    // only falls); one resumed before its ramp plans again, from the recipe's end.
    planned_epochs_ = start.planned_epochs;
    if (start.epoch <= planned_epochs_ - cooldown_epochs()) planned_epochs_ = o_.epochs;
  }
  epoch_seconds_.clear();
  for (int64_t epoch = start.epoch; epoch <= planned_epochs_; ++epoch) {
    const double epoch_start = seconds_since(run_start_);
    EpochRecord rec;
    if (!run_epoch(data, epoch, start, rec, result)) return result;  // stopped inside the epoch
    train_seconds += rec.seconds;
    if (!result.finished_early) result.last_metrics = run_evaluation(epoch);  // else just evaluated
    rec.metrics = result.last_metrics;
    if (saving) checkpoints_->end_of_epoch(step_, epoch, rec, result);
    if (saving && on_any_rank(StopSignals::pending() != 0)) {
      report_stop(result, fmt::format("epoch {}", epoch));  // end_of_epoch saved
      return result;
    }
    progress_->epoch_line(rec, seconds_since(run_start_), result.skipped_steps);
    result.epochs.push_back(rec);
    progress_->draw_curves(result.epochs);
    if (result.finished_early || on_any_rank(dist::is_main() && should_stop && should_stop(rec.metrics))) {
      result.finished_early = true;
      break;
    }
    if (result.out_of_time) break;
    if (o_.time_limit > 0 && o_.on_time_limit == "plan") plan_to_deadline(epoch, seconds_since(run_start_) - epoch_start);
  }
  result.steps = step_;
  if (dist::world_size() > 1 && reducer_ && step_ > start_step)
    progress_->dist_summary(*reducer_, static_cast<double>(step_ - start_step), allreduce_seconds(), train_seconds);
  // A run cut by its time limit averages the epochs it reached, not the planned last ones.
  const int64_t last_epoch = result.epochs.empty() ? planned_epochs_ : result.epochs.back().epoch;
  if (saving && dist::is_main() && !result.finished_early) checkpoints_->average(result, last_epoch, epochs_averaged());
  return result;
}

// One epoch from `start` (a resume point inside it) or from its first batch. Returns false when
// the run stops inside it (a signal, after its checkpoint; stop_after), `result` then complete.
bool Trainer::run_epoch(DataSource& data, int64_t epoch, const ResumePoint& start, EpochRecord& rec,
                        FitResult& result) {
  const bool saving = !o_.out_dir.empty();
  const int64_t batches = data.plan(epoch);
  const bool resumed_here = epoch == start.epoch && start.batch > 0;
  double loss_sum = resumed_here ? start.loss_sum : 0;
  int64_t tokens = resumed_here ? start.tokens : 0;
  const int64_t first_batch = resumed_here ? start.batch : 0;
  // A checkpoint past its epoch's end would silently skip the epoch (issue 44).
  TP_CHECK(first_batch <= batches, "resume: the checkpoint's next batch {} is past the {} batches of epoch {}: the "
           "checkpoint is damaged, or the data changed since", first_batch, batches, epoch);
  const int64_t first_tokens = tokens;  // rates count this process's work only
  progress_->begin_epoch(epoch, batches, first_batch, first_tokens);
  model_.train();
  for (int64_t i = first_batch; i < batches;) {
    const int64_t before = i, end = std::min(batches, i + o_.accumulate);
    lr_scale_ = cooldown_lr_scale(epoch, i, batches, planned_epochs_, cooldown_epochs());
    std::vector<TrainBatch> group;
    for (int64_t j = i; j < end; ++j) group.push_back(data.batch(j));
    i = end;
    StepResult r = step(group);
    if (!r.taken) {
      ++result.skipped_steps;
      std::fprintf(stderr, "train: skipped %s (epoch %lld, batches %lld-%lld; %lld skipped so far)\n",
                   r.skipped.c_str(), (long long)epoch, (long long)before + 1, (long long)end,
                   (long long)result.skipped_steps);
      continue;
    }
    loss_sum += r.loss_sum;
    tokens += r.tokens;
    result.last_loss = r.loss;
    progress_->log_step(step_, epoch, r, optimizer_.lr());
    if (saving && r.stop_signal) {
      checkpoints_->save(step_, epoch, i, loss_sum, tokens);
      std::printf("\n");  // after the progress line
      report_stop(result, fmt::format("step {}", step_));
      return false;
    }
    if (o_.save_every > 0 && step_ % o_.save_every == 0 && i < batches) checkpoints_->save(step_, epoch, i, loss_sum, tokens);
    if (o_.stop_after > 0 && step_ == o_.stop_after) {  // tests: an interruption right after a checkpoint
      checkpoints_->save(step_, epoch, i, loss_sum, tokens);
      result.stopped = true;
      result.steps = step_;
      return false;
    }
    progress_->after_step(before, i, step_, loss_sum, tokens, optimizer_.lr());
    if (r.out_of_time) {
      result.out_of_time = true;
      progress_->end_line();
      std::printf("train: the time limit of %s is reached after step %lld; this epoch ends here\n",
                  clock_text(o_.time_limit).c_str(), (long long)step_);
      break;
    }
    if (o_.eval_every > 0 && step_ % o_.eval_every == 0 && i < batches) {
      result.last_metrics = run_evaluation(epoch);
      std::printf("step %lld: loss %.4f%s\n", (long long)step_, r.loss, metrics_text(result.last_metrics).c_str());
      std::fflush(stdout);
      if (on_any_rank(dist::is_main() && should_stop && should_stop(result.last_metrics))) {
        result.finished_early = true;
        break;
      }
    }
  }
  rec.epoch = epoch;
  rec.steps = step_;
  rec.seconds = progress_->epoch_seconds();
  rec.train_loss = loss_sum / static_cast<double>(std::max<int64_t>(tokens, 1));
  rec.tokens_per_s = static_cast<double>(tokens - first_tokens) / rec.seconds;
  return true;
}

// Note [Planning to the deadline]: a run with a time limit (tools/train.sh gives one: the hour less
// set-up, build and the final tests) on a host too slow for its recipe used to be cut where the
// limit fell, in the middle of an epoch and at the learning rate of the middle of the schedule.
// Budgeted training does better when the schedule reaches its end at the budget (Li, Yumer and
// Ramanan, ICLR 2020). So, after each epoch, the run measures what an epoch costs here (training,
// evaluation and checkpoints), plans to end at the last whole epoch the time left fits, and over
// the last third of that plan (at least 2 epochs; --cooldown N sets it) multiplies the schedule's
// learning rate by a ramp falling linearly to zero, then averages at most the last 2 epochs
// (--average's 5 would mix in weights from the top of the ramp). Both were chosen on Multi30k's val
// set (docs/training.md, "Planned to a slow host's deadline"): over a plan of 15, ramps of 3, 5 and
// 8 epochs gave beam val BLEU 41.17, 41.70 and 41.24 averaging 5, and averaging the last 2 instead
// gained 0.46, 0.15 and 0.19. When the recipe's epochs fit and it names no --cooldown, the run is
// the recipe's, to the bit. The same ramp over a run's own last epochs is --cooldown N without a
// time limit, which makes a planned run's schedule reproducible (--epochs P --cooldown N --average
// 2 trains as a plan of P epochs does). The plan is made again after every epoch (a host that slows
// down ends earlier), never later than the recipe's end, and not later than it was once its
// cooldown began (the learning rate only falls). Under N ranks every rank takes the earliest plan.
// Checkpoints record a plan that ends the run early: a run resumed inside that plan's ramp keeps it
// (its learning rate goes on falling), and one resumed before its ramp starts from the recipe's
// end and plans again after its first epoch. A --cooldown longer than the run (or its plan) ramps
// over the whole of it, from the schedule's rate. The cooldown scales a schedule's rate: a Trainer
// without a schedule refuses --cooldown, and under a time limit only ends early. If an epoch still
// overruns, the limit cuts it as before.
int64_t epochs_that_fit(double seconds_left, const std::vector<double>& epoch_seconds, int64_t done, int64_t max_epochs) {
  if (epoch_seconds.empty()) return max_epochs;
  double per_epoch = epoch_seconds.back();
  if (epoch_seconds.size() >= 2) per_epoch = std::max(per_epoch, epoch_seconds[epoch_seconds.size() - 2]);
  const double more = per_epoch > 0 ? std::floor(std::max(0.0, seconds_left) / per_epoch) : 1e9;
  return std::clamp<int64_t>(done + static_cast<int64_t>(std::min(more, 1e9)), done, std::max(done, max_epochs));
}

double cooldown_lr_scale(int64_t epoch, int64_t batch, int64_t batches, int64_t last_epoch, int64_t window) {
  if (window <= 0) return 1.0;
  const int64_t first = last_epoch - window + 1;  // the window's first epoch
  if (epoch < first) return 1.0;
  const double into = static_cast<double>(epoch - first) + static_cast<double>(batch) / static_cast<double>(std::max<int64_t>(batches, 1));
  return std::clamp(1.0 - into / static_cast<double>(window), 0.0, 1.0);
}

int64_t Trainer::cooldown_epochs() const {
  if (o_.cooldown > 0) return std::min(o_.cooldown, planned_epochs_);  // a run shorter than the window ramps from its start
  if (planned_epochs_ >= o_.epochs) return 0;  // a recipe that fits is untouched
  return std::max<int64_t>(2, (planned_epochs_ + 1) / 3);  // a third of the plan (Note [Planning to the deadline])
}

int64_t Trainer::epochs_averaged() const {
  return planned_epochs_ < o_.epochs ? std::min<int64_t>(o_.average, 2) : o_.average;
}

void Trainer::plan_to_deadline(int64_t epoch, double seconds) {
  epoch_seconds_.push_back(seconds);
  int64_t plan = epochs_that_fit(o_.time_limit - seconds_since(run_start_), epoch_seconds_, epoch, o_.epochs);
  const bool cooling = cooldown_epochs() > 0 && epoch > planned_epochs_ - cooldown_epochs();  // the ramp has begun
  if (cooling) plan = std::min(plan, planned_epochs_);  // once the ramp began, its end only comes earlier
  plan = static_cast<int64_t>(dist::allreduce(static_cast<double>(-plan), dist::ReduceOp::Max) * -1.0);  // the earliest
  if (plan == planned_epochs_) return;
  planned_epochs_ = plan;  // the checkpoints from now on record it
  const int64_t window = cooldown_epochs();
  if (!dist::is_main()) return;
  if (plan == o_.epochs) {
    std::printf("train: the time limit of %s fits all %lld epochs again (%s an epoch here)\n",
                clock_text(o_.time_limit).c_str(), (long long)plan, clock_text(seconds).c_str());
  } else if (plan <= epoch) {
    std::printf("train: the time limit of %s leaves no time for another epoch (%s each): the run ends with epoch %lld\n",
                clock_text(o_.time_limit).c_str(), clock_text(seconds).c_str(), (long long)epoch);
  } else {
    std::string ramp = schedule_ ? fmt::format(", its learning rate falling to zero over epochs {}-{}",
                                               std::max<int64_t>(1, plan - window + 1), plan)
                                 : "";  // the cooldown scales a schedule's rate
    if (epochs_averaged() != o_.average) ramp += fmt::format(", averaging the last {}", epochs_averaged());
    std::printf("train: the time limit of %s fits %lld of the %lld epochs (%s an epoch here): the run ends with epoch "
                "%lld%s\n",
                clock_text(o_.time_limit).c_str(), (long long)plan, (long long)o_.epochs, clock_text(seconds).c_str(),
                (long long)plan, ramp.c_str());
  }
  std::fflush(stdout);
}

// After a signal and its checkpoint: a line saying so; the run then returns.
void Trainer::report_stop(FitResult& result, const std::string& after) {
  // On N ranks the signal may have reached another rank only.
  const int signal = StopSignals::pending() ? StopSignals::pending() : SIGTERM;
  std::printf("train: %s: stopped after %s with a checkpoint in %s; continue with --resume\n",
              StopSignals::name(signal), after.c_str(), o_.out_dir.c_str());
  std::fflush(stdout);
  result.interrupted = signal;
}

std::map<std::string, Tensor> average_checkpoints(const std::vector<std::string>& paths) {
  TP_CHECK(!paths.empty(), "average_checkpoints: no checkpoints given");
  std::map<std::string, Tensor> sum;
  for (const auto& [name, t] : nn::load_safetensors(paths[0]).tensors) sum[name] = t.to(DType::Float64);
  for (size_t i = 1; i < paths.size(); ++i) {
    auto next = nn::load_safetensors(paths[i]).as_map();
    TP_CHECK(next.size() == sum.size(), "average_checkpoints: {} holds {} tensors but {} holds {}", paths[i],
             next.size(), paths[0], sum.size());
    for (auto& [name, acc] : sum) {
      auto it = next.find(name);
      TP_CHECK(it != next.end() && it->second.sizes() == acc.sizes(),
               "average_checkpoints: {} has no tensor '{}' of shape {}", paths[i], name, acc.sizes());
      acc.add_(it->second.to(DType::Float64));
    }
  }
  std::map<std::string, Tensor> out;
  for (auto& [name, acc] : sum) out[name] = (acc / static_cast<double>(paths.size())).to(DType::Float32);
  return out;
}

}  // namespace tapestry::apps
