// The training loop (see trainer.h).
#include "apps/train/trainer.h"

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "apps/eval/plot.h"
#include "apps/train/run_dir.h"
#include "tapestry/ops/file.h"
#include "tapestry/nn/safetensors.h"
#include "tapestry/ops/factory.h"

namespace tapestry::apps {

// Note [Exact resume]: a checkpoint holds the model, the optimizer (moments, step count) and,
// in its metadata, the position (epoch, next batch), the running epoch loss and the random
// generator's state (dropout seeds come from it). A DataSource's plan follows from the epoch
// (and the task's seed) and every kernel is independent of the thread count, so a resumed run
// replays exactly what the uninterrupted run would have done. The metadata also records the
// task's recipe (the model and whatever decides the batches), and resume refuses a run whose
// recipe differs. The checkpoint written at the end of an epoch, after its evaluation and its
// epoch copy, points at batch 0 of the next epoch; one written after the last batch but before
// that (save_every, an interruption) resumes into the epoch's end.
//
// Note [Checkpoint unit]: all of it is one file, checkpoint.safetensors (tensors "model.*" and
// "optimizer.*"), written to a temp file, fsync'd and renamed over the previous one: a kill at
// any instant leaves either the old or the new generation, never a mix, and its CRC catches
// damage. model.safetensors (the weights alone, for inference) is written after it and is not
// read by resume. Runs from before this format (a model and an optimizer file) still resume,
// with the old torn-pair check.

namespace {

// One line redrawn in place on a terminal; on a pipe, a line each time `done` (batches, moving
// from `before`) crosses a tenth of the epoch.
void progress_line(int64_t epoch, int64_t before, int64_t done, int64_t total, int64_t step, double loss, double tok_s,
                   double lr, double eta, bool tty) {
  const int width = 24;
  int filled = static_cast<int>(width * done / std::max<int64_t>(total, 1));
  std::string bar = std::string(filled, '#') + std::string(width - filled, '.');
  std::string line = fmt::format("epoch {:>2} [{}] {:>4}/{} step {} | loss {:.3f} | {:.0f} tok/s | lr {:.2e} | ETA {}",
                                 epoch, bar, done, total, step, loss, tok_s, lr, clock_text(eta));
  if (tty) {
    std::fprintf(stderr, "\r%s", line.c_str());
    if (done == total) std::fprintf(stderr, "\n");
  } else if (done == total || done * 10 / std::max<int64_t>(total, 1) != before * 10 / std::max<int64_t>(total, 1)) {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

// A number from a checkpoint's metadata; a value that does not parse names the file and key.
template <class T> T meta_number(const std::map<std::string, std::string>& meta, const std::string& path, const char* key) {
  auto it = meta.find(key);
  TP_CHECK(it != meta.end(), "resume: {} has no '{}' entry (not a training checkpoint)", path, key);
  try {
    size_t used = 0;
    T v;
    if constexpr (std::is_floating_point_v<T>) v = static_cast<T>(std::stod(it->second, &used));
    else v = static_cast<T>(std::stoll(it->second, &used));
    if (used == it->second.size()) return v;
  } catch (const std::exception&) {
  }
  throw Error(fmt::format("resume: {}: '{}' is '{}', not a number: the checkpoint is damaged", path, key, it->second));
}

// ", val loss 4.2730, val BLEU 4.10 (greedy)": the metrics as the progress lines print them.
std::string metrics_text(const Metrics& metrics) {
  std::string text;
  for (const Metric& m : metrics) text += fmt::format(", {} {:.{}f}{}", m.label, m.value, m.decimals, m.note);
  return text;
}

std::string non_finite_text(double loss_sum, double grad_norm, int64_t step) {
  return fmt::format("a non-finite {} ({}) at step {}", std::isfinite(loss_sum) ? "gradient norm" : "loss",
                     std::isfinite(loss_sum) ? grad_norm : loss_sum, step);
}

std::map<std::string, std::string> with(std::map<std::string, std::string> meta,
                                        std::initializer_list<std::pair<const std::string, std::string>> more) {
  for (const auto& [k, v] : more) meta[k] = v;
  return meta;
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

void check_options(const TrainerOptions& o_) {
  TP_CHECK(o_.accumulate >= 1, "train: --accumulate must be at least 1, got {}", o_.accumulate);
  TP_CHECK(std::isfinite(o_.clip_norm) && o_.clip_norm >= 0, "train: --clip-norm must be >= 0 (0: no clipping), got {}",
           o_.clip_norm);
  TP_CHECK(o_.on_nan == "stop" || o_.on_nan == "skip", "train: --on-nan must be stop or skip, got '{}'", o_.on_nan);
  TP_CHECK(o_.epochs >= 1, "train: --epochs must be at least 1, got {}", o_.epochs);
  TP_CHECK(o_.eval_every >= 0 && o_.save_every >= 0 && o_.keep >= 1 && o_.average >= 0,
           "train: eval_every, save_every and average must be >= 0 and keep >= 1");
  TP_CHECK(std::isfinite(o_.time_limit) && o_.time_limit >= 0, "train: --time-limit must be >= 0 seconds (0: none), "
           "got {}", o_.time_limit);
}

Trainer::Trainer(nn::Module& model, optim::Optimizer& optimizer, const optim::Schedule* schedule,
                 TrainerOptions options)
    : model_(model), optimizer_(optimizer), schedule_(schedule), o_(std::move(options)) {
  check_options(o_);
}

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Whether `local` holds on any rank (the identity on one process).
bool on_any_rank(bool local) {
  return dist::world_size() > 1 ? dist::allreduce(static_cast<int64_t>(local), dist::ReduceOp::Max) > 0 : local;
}

}  // namespace

StepResult Trainer::step(const std::vector<TrainBatch>& group) {
  TP_CHECK(!group.empty(), "train: a step needs at least one batch");
  const bool parallel = dist::world_size() > 1;
  StepResult r;
  for (const TrainBatch& b : group) r.tokens += b.tokens;
  ++step_;
  if (schedule_) schedule_->apply(optimizer_, step_);
  double& loss_sum = r.loss_sum;
  // Dropout differs per rank and per step, and follows from (seed, step, rank) alone.
  if (parallel) manual_seed(splitmix64(o_.seed ^ splitmix64(static_cast<uint64_t>(step_) ^ splitmix64(dist::rank() + 1))));
  // One process: each batch's mean loss is weighted by its share of the group's tokens, so the
  // summed gradient is that of the group's mean token loss, as one batch of the group's size
  // would give. N ranks: each rank's loss summed over its tokens; the gradients are then summed
  // over the ranks and divided by the tokens of the whole group (the global mean token loss).
  // N ranks: the backward of the group's last batch starts the gradients' all-reduce (overlap).
  if (parallel && !reducer_) reducer_ = std::make_unique<dist::GradReducer>(model_.parameters(), o_.bucket_bytes, o_.first_bucket_bytes);
  size_t last = group.size();
  while (last > 0 && group[last - 1].tokens == 0) --last;
  // Note [One sync per step]: the losses stay on the device until every backward has been queued;
  // then they are read together with the gradients' squared norm, in one copy to the host (one
  // synchronisation on a GPU, where reading each loss would stall the device mid-step). The values
  // and their order of summation are those of reading each loss at once.
  std::vector<std::pair<Tensor, int64_t>> losses;  // detached, with their batch's tokens
  for (size_t i = 0; i < group.size(); ++i) {
    const TrainBatch& b = group[i];
    if (parallel && b.tokens == 0) continue;  // an empty shard: this rank adds zeros
    if (parallel && i + 1 == last) reducer_->prepare();
    Tensor loss = b.loss();
    losses.emplace_back(loss.detach(), b.tokens);
    const double weight = parallel ? static_cast<double>(b.tokens)
                                   : static_cast<double>(b.tokens) / static_cast<double>(r.tokens);
    if (weight == 1.0) loss.backward();
    else (loss * weight).backward();
  }
  // The losses, and (one process) the squared gradient norm, as doubles in one copy.
  auto read = [&losses](const Tensor& extra) {
    TensorList parts;
    for (auto& [loss, tokens] : losses) parts.push_back(reshape(loss.to(DType::Float64), {1}));
    if (extra.defined()) parts.push_back(reshape(extra, {1}));
    return parts.empty() ? std::vector<double>() : cat(parts, 0).to_vector<double>();
  };
  auto add_losses = [&losses, &loss_sum](const std::vector<double>& values) {
    for (size_t i = 0; i < losses.size(); ++i) loss_sum += values[i] * static_cast<double>(losses[i].second);
  };
  r.stop_signal = StopSignals::pending() != 0;
  r.out_of_time = o_.time_limit > 0 && seconds_since(run_start_) >= o_.time_limit;
  const std::vector<Tensor> params = model_.parameters();
  if (!parallel) {
    const Device device = losses.empty() ? Device::CPU : losses[0].first.device();
    const std::vector<double> values = read(optim::grad_sum_of_squares(params, device));
    add_losses(values);
    r.grad_norm = std::sqrt(values.back());
  } else {
    add_losses(read(Tensor()));
    // One small all-reduce agrees on the totals and on whether to stop.
    Tensor totals = tensor(std::vector<double>{static_cast<double>(r.tokens), loss_sum, r.stop_signal ? 1.0 : 0.0,
                                               r.out_of_time ? 1.0 : 0.0});
    dist::allreduce_(totals);
    auto tv = totals.to_vector<double>();
    r.tokens = static_cast<int64_t>(tv[0]), loss_sum = tv[1], r.stop_signal = tv[2] > 0, r.out_of_time = tv[3] > 0;
    TP_CHECK(r.tokens > 0, "train: step {} has no tokens on any of the {} ranks", step_, dist::world_size());
    reducer_->reduce(1.0 / static_cast<double>(r.tokens));
    r.grad_norm = optim::grad_norm(params);  // of the reduced gradients: a second read
  }
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

void Trainer::log_step(int64_t epoch, const StepResult& r) {
  if (o_.step_log.empty() || !dist::is_main()) return;
  // Appended and closed each step, so that the log survives a kill up to the last step.
  FILE* f = std::fopen(o_.step_log.c_str(), "a");
  TP_CHECK(f, "train: cannot write the step log {}", o_.step_log);
  std::fprintf(f, "%lld\t%lld\t%.17g\t%lld\t%.17g\t%.17g\n", (long long)step_, (long long)epoch, r.loss,
               (long long)r.tokens, optimizer_.lr(), r.grad_norm);
  std::fclose(f);
}

void Trainer::save_checkpoint(int64_t epoch, int64_t next_batch, double loss_sum, int64_t tokens) {
  if (!dist::is_main()) return;  // every rank holds the same weights; rank 0 writes them
  TP_CHECK(std::isfinite(optim::global_norm(model_.parameters())), "train: the weights are not finite after step {}; "
           "nothing was saved (the last checkpoint is intact). Lower --lr-factor or set --clip-norm", step_);
  nn::NamedTensors state;
  for (auto& [name, t] : model_.state_dict()) state.emplace_back("model." + name, t);
  for (auto& [name, t] : optimizer_.state_dict()) state.emplace_back("optimizer." + name, t);
  auto meta = with(o_.recipe, {{"epoch", std::to_string(epoch)},
                               {"next_batch", std::to_string(next_batch)},
                               {"step", std::to_string(step_)},
                               {"epoch_loss_sum", fmt::format("{:.17g}", loss_sum)},
                               {"epoch_tokens", std::to_string(tokens)},
                               {"rng", default_generator().state()},
                               {"world_size", std::to_string(dist::world_size())}});
  nn::save_safetensors(o_.out_dir + "/checkpoint.safetensors", state, meta);
  model_.save(o_.out_dir + "/model.safetensors", with(o_.model_metadata, {{"step", std::to_string(step_)}}));
}

Trainer::Position Trainer::load_checkpoint(FitResult& result) {
  Position at;
  const std::string ckpt_path = o_.out_dir + "/checkpoint.safetensors";
  const std::string model_path = o_.out_dir + "/model.safetensors", opt_path = o_.out_dir + "/optimizer.safetensors";
  const bool legacy = !file_exists(ckpt_path) && file_exists(model_path) && file_exists(opt_path);
  if (!file_exists(ckpt_path) && !legacy) {
    std::printf("resume: no checkpoint in %s yet; starting from the beginning\n", o_.out_dir.c_str());
    return at;
  }
  const std::string from = legacy ? model_path : ckpt_path;
  auto file = nn::load_safetensors(from);
  std::map<std::string, Tensor> model_state, opt_state;
  if (legacy) {
    model_state = file.as_map();
    opt_state = nn::load_safetensors(opt_path).as_map();
  } else {
    for (auto& [name, t] : file.tensors) {
      if (name.rfind("model.", 0) == 0) model_state[name.substr(6)] = t;
      else if (name.rfind("optimizer.", 0) == 0) opt_state[name.substr(10)] = t;
      else throw Error(fmt::format("resume: {}: unexpected tensor '{}' (not a training checkpoint)", from, name));
    }
  }
  for (const auto& [key, value] : o_.recipe) {
    auto it = file.metadata.find(key);
    std::string recorded;
    if (it != file.metadata.end()) {
      recorded = it->second;
    } else if (o_.recipe_defaults.count(key)) {
      recorded = o_.recipe_defaults.at(key);  // an older checkpoint, made before `key` was recorded
    } else {
      continue;
    }
    TP_CHECK(recorded == value, "resume: {} was trained with {} = {}, but this run has {} = {}; resume with the "
             "options of its config.toml", from, key, recorded, key, value);
  }
  model_.load_state_dict(model_state);
  optimizer_.load_state_dict(opt_state);
  step_ = meta_number<int64_t>(file.metadata, from, "step");
  TP_CHECK(optimizer_.step_count() == step_, "resume: {} is at step {} but {} at step {}; the checkpoint is torn",
           opt_path, optimizer_.step_count(), from, step_);
  at.epoch = meta_number<int64_t>(file.metadata, from, "epoch");
  at.batch = meta_number<int64_t>(file.metadata, from, "next_batch");
  at.loss_sum = meta_number<double>(file.metadata, from, "epoch_loss_sum");
  at.tokens = meta_number<int64_t>(file.metadata, from, "epoch_tokens");
  TP_CHECK(at.epoch >= 1 && at.batch >= 0 && at.tokens >= 0, "resume: {}: epoch {}, batch {} is not a position: the "
           "checkpoint is damaged", from, at.epoch, at.batch);
  TP_CHECK(file.metadata.count("rng"), "resume: {} has no 'rng' entry (not a training checkpoint)", from);
  // Older checkpoints (no entry) were written by one process.
  const int64_t saved_world = file.metadata.count("world_size") ? meta_number<int64_t>(file.metadata, from, "world_size") : 1;
  TP_CHECK(saved_world == dist::world_size() || o_.reshard,
           "resume: {} was written by a run on {} process{}, and this one has {}; resume with the same count (mpirun "
           "-np {}), or pass --reshard to go on with the same global batches split over {} (not bit-exact: each "
           "rank's dropout masks change)",
           from, saved_world, saved_world == 1 ? "" : "es", dist::world_size(), saved_world, dist::world_size());
  default_generator().set_state(file.metadata.at("rng"));
  std::printf("resume: from %s at epoch %lld, batch %lld, step %lld\n", from.c_str(), (long long)at.epoch,
              (long long)at.batch, (long long)step_);
  // The best so far stays the best unless a later epoch beats it.
  const std::string best_path = o_.out_dir + "/model.best.safetensors";
  if (!o_.best_metric.empty() && file_exists(best_path)) {
    auto best = nn::load_safetensors(best_path).metadata;
    if (best.count(o_.best_metric) && best.count("epoch")) {
      result.best_value = meta_number<double>(best, best_path, o_.best_metric.c_str());
      result.best_epoch = meta_number<int64_t>(best, best_path, "epoch");
    }
  }
  return at;
}

Metrics Trainer::run_evaluation(int64_t epoch) {
  if (!evaluate || !dist::is_main()) return {};
  model_.eval();
  Metrics m = evaluate(epoch, step_);
  model_.train();
  return m;
}

// Per-epoch copies (the last `keep` stay, for averaging) and the best on best_metric, written
// before the checkpoint that moves resume past this epoch; then curves.svg.
void Trainer::end_of_epoch(int64_t epoch, const EpochRecord& r, FitResult& result) {
  if (!dist::is_main()) return;
  const std::string epoch_path = fmt::format("{}/model.epoch{}.safetensors", o_.out_dir, epoch);
  model_.save(epoch_path, with(o_.model_metadata, {{"epoch", std::to_string(epoch)}}));
  if (epoch - o_.keep >= 1) std::remove(fmt::format("{}/model.epoch{}.safetensors", o_.out_dir, epoch - o_.keep).c_str());
  if (!o_.best_metric.empty()) {
    const double value = metric(r.metrics, o_.best_metric);
    if (result.best_epoch == 0 || value > result.best_value) {
      result.best_value = value;
      result.best_epoch = epoch;
      model_.save(o_.out_dir + "/model.best.safetensors",
                  with(o_.model_metadata, {{"epoch", std::to_string(epoch)}, {o_.best_metric, fmt::format("{:.2f}", value)}}));
    }
  }
  save_checkpoint(epoch + 1, 0, 0, 0);
}

void Trainer::average_epochs(FitResult& result) {
  // An average left by an earlier run in this directory must not pass for this run's.
  std::remove((o_.out_dir + "/model.avg.safetensors").c_str());
  if (o_.average <= 1) return;
  std::vector<std::string> paths;
  for (int64_t e = std::max<int64_t>(1, o_.epochs - o_.average + 1); e <= o_.epochs; ++e) {
    std::string p = fmt::format("{}/model.epoch{}.safetensors", o_.out_dir, e);
    if (std::ifstream(p).good()) paths.push_back(p);
  }
  if (paths.size() < 2) return;
  model_.load_state_dict(average_checkpoints(paths));
  model_.save(o_.out_dir + "/model.avg.safetensors",
              with(o_.model_metadata, {{"averaged", std::to_string(paths.size())}}));
  result.averaged = static_cast<int64_t>(paths.size());
  std::printf("averaged the weights of the last %zu epoch checkpoints\n", paths.size());
}

FitResult Trainer::fit(DataSource& data) {
  const bool saving = !o_.out_dir.empty();
  TP_CHECK(saving || (!o_.resume && o_.save_every == 0 && o_.stop_after == 0 && o_.best_metric.empty()),
           "train: resume, save_every, stop_after and best_metric need a run folder (out_dir)");
  // On N ranks every rank trains and reads a resumed checkpoint; rank 0 alone writes files,
  // evaluates and shows progress, and the others follow its decisions.
  const int world = dist::world_size();
  const bool main_rank = dist::is_main();
  const bool progress = o_.progress && main_rank;
  const bool tty = progress && ::isatty(2);
  FitResult result;
  const auto run_start = std::chrono::steady_clock::now();
  run_start_ = run_start;
  Position start;
  if (saving && o_.resume) start = load_checkpoint(result);
  const int64_t start_step = step_;
  double train_seconds = 0;  // the epochs' training, without their evaluations
  if (world > 1) {
    // The same starting weights everywhere: rank 0's (a fresh model's random init, or the checkpoint).
    NoGradGuard no_grad;
    for (auto& [name, t] : model_.state_dict()) {
      Tensor v = t;
      dist::broadcast_(v);
    }
    data.set_shard(dist::rank(), world);
  }
  std::unique_ptr<StopSignals> stop_signals;
  if (saving) {
    stop_signals = std::make_unique<StopSignals>();
    if (main_rank)
      for (const auto& [name, contents] : o_.run_files) write_file_atomic(o_.out_dir + "/" + name, contents);
  }
  // After a signal and its checkpoint: a line saying so; the run then returns.
  auto report_stop = [&](const std::string& after) {
    // On N ranks the signal may have reached another rank only.
    const int signal = StopSignals::pending() ? StopSignals::pending() : SIGTERM;
    std::printf("train: %s: stopped after %s with a checkpoint in %s; continue with --resume\n",
                StopSignals::name(signal), after.c_str(), o_.out_dir.c_str());
    std::fflush(stdout);
    result.interrupted = signal;
    return result;
  };
  // The curves so far (an interrupted run keeps its picture); epochs before a resume are not in
  // this process, so a resumed run plots from where it resumed.
  auto draw_curves = [&] {
    std::vector<Series> series{{"train loss", "#1f77b4", {}}};
    const char* colors[] = {"#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"};
    for (size_t k = 0; k < result.epochs.back().metrics.size(); ++k) {
      const Metric& m = result.epochs.back().metrics[k];
      series.push_back({m.label + m.note, colors[k % 5], {}, m.own_axis});
    }
    for (const EpochRecord& e : result.epochs) {
      series[0].y.push_back(e.train_loss);
      for (size_t k = 0; k + 1 < series.size() && k < e.metrics.size(); ++k) series[k + 1].y.push_back(e.metrics[k].value);
    }
    write_svg_chart(o_.out_dir + "/curves.svg", o_.curves_title, series);
  };

  for (int64_t epoch = start.epoch; epoch <= o_.epochs; ++epoch) {
    const int64_t batches = data.plan(epoch);
    const bool resumed_here = epoch == start.epoch && start.batch > 0;
    const auto t0 = std::chrono::steady_clock::now();
    double loss_sum = resumed_here ? start.loss_sum : 0;
    int64_t tokens = resumed_here ? start.tokens : 0;
    const int64_t first_batch = resumed_here ? start.batch : 0;
    const int64_t first_tokens = tokens;  // rates count this process's work only
    model_.train();
    for (int64_t i = first_batch; i < batches;) {
      const int64_t end = std::min(batches, i + o_.accumulate);
      std::vector<TrainBatch> group;
      for (int64_t j = i; j < end; ++j) group.push_back(data.batch(j));
      const int64_t before = i;
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
      log_step(epoch, r);
      if (saving && r.stop_signal) {
        save_checkpoint(epoch, i, loss_sum, tokens);
        std::printf("\n");  // after the progress line
        return report_stop(fmt::format("step {}", step_));
      }
      if (o_.save_every > 0 && step_ % o_.save_every == 0 && i < batches) save_checkpoint(epoch, i, loss_sum, tokens);
      if (o_.stop_after > 0 && step_ == o_.stop_after) {  // tests: an interruption right after a checkpoint
        save_checkpoint(epoch, i, loss_sum, tokens);
        result.stopped = true;
        result.steps = step_;
        return result;
      }
      if (progress) {
        double el = seconds_since(t0);
        progress_line(epoch, before, i, batches, step_, loss_sum / static_cast<double>(tokens),
                      static_cast<double>(tokens - first_tokens) / el, optimizer_.lr(),
                      el / static_cast<double>(i - first_batch) * static_cast<double>(batches - i), tty);
      }
      if (r.out_of_time) {
        result.out_of_time = true;
        if (tty) std::fprintf(stderr, "\n");
        std::printf("train: the time limit of %s is reached after step %lld; this epoch ends here\n",
                    clock_text(o_.time_limit).c_str(), (long long)step_);
        break;
      }
      if (o_.eval_every > 0 && step_ % o_.eval_every == 0 && i < batches) {
        result.last_metrics = run_evaluation(epoch);
        std::printf("step %lld: loss %.4f%s\n", (long long)step_, r.loss, metrics_text(result.last_metrics).c_str());
        std::fflush(stdout);
        if (on_any_rank(main_rank && should_stop && should_stop(result.last_metrics))) {
          result.finished_early = true;
          break;
        }
      }
    }
    EpochRecord rec;
    rec.epoch = epoch;
    rec.steps = step_;
    rec.seconds = seconds_since(t0);
    train_seconds += rec.seconds;
    rec.train_loss = loss_sum / static_cast<double>(std::max<int64_t>(tokens, 1));
    rec.tokens_per_s = static_cast<double>(tokens - first_tokens) / rec.seconds;
    if (!result.finished_early) result.last_metrics = run_evaluation(epoch);  // else just evaluated
    rec.metrics = result.last_metrics;
    if (saving) end_of_epoch(epoch, rec, result);
    if (saving && on_any_rank(StopSignals::pending() != 0))
      return report_stop(fmt::format("epoch {}", epoch));  // end_of_epoch saved
    std::string line = fmt::format("epoch {}: train loss {:.3f}{}", epoch, rec.train_loss, metrics_text(rec.metrics));
    line += fmt::format(", {:.0f} s, {:.0f} tok/s, elapsed {}", rec.seconds, rec.tokens_per_s,
                        clock_text(seconds_since(run_start)));
    if (result.skipped_steps) line += fmt::format(", {} steps skipped so far", result.skipped_steps);
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    result.epochs.push_back(rec);
    if (saving && main_rank) draw_curves();
    if (result.finished_early || on_any_rank(main_rank && should_stop && should_stop(rec.metrics))) {
      result.finished_early = true;
      break;
    }
    if (result.out_of_time) break;
  }
  result.steps = step_;
  if (world > 1 && reducer_ && step_ > start_step) {
    const double steps = static_cast<double>(step_ - start_step);
    const double per_step = allreduce_seconds() / steps;
    std::printf("dist: %d ranks; each step all-reduces %.1f MiB of gradients in %zu bucket(s), %s: %.2f ms per step "
                "(%.2f ms waiting after the backward, %.2f ms in its hooks), %.1f%% of the training time\n",
                world, static_cast<double>(reducer_->bytes()) / (1 << 20), reducer_->buckets(),
                reducer_->overlap() ? fmt::format("{:.1f} per step started during the backward",
                                                  static_cast<double>(reducer_->started_early()) / steps).c_str()
                                    : fmt::format("after the backward ({})", reducer_->overlap_note()).c_str(),
                1e3 * per_step, 1e3 * reducer_->seconds() / steps, 1e3 * reducer_->hook_seconds() / steps,
                100 * allreduce_seconds() / std::max(1e-9, train_seconds));
  }
  if (saving && main_rank && !result.finished_early) average_epochs(result);
  return result;
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
