// A run folder's checkpoints (see checkpoints.h).
#include "apps/train/checkpoints.h"

#include <set>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "apps/train/run_dir.h"
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

// A number from a checkpoint's metadata; a value that does not parse names the file and key.
template <class T> T meta_number(const std::map<std::string, std::string>& meta, const std::string& path, const char* key) {
  auto it = meta.find(key);
  TP_CHECK(it != meta.end(), "resume: {} has no '{}' entry (not a training checkpoint)", path, key);
  try {
    size_t used = 0;
    T v;
    if constexpr (std::is_floating_point_v<T>) v = static_cast<T>(std::stod(it->second, &used));
    else v = static_cast<T>(std::stoll(it->second, &used));
    // A NaN or infinite loss sum is no state a run can go on from (issue 44: it resumed).
    if (used == it->second.size() && std::isfinite(static_cast<double>(v))) return v;
  } catch (const std::exception&) {
  }
  throw Error(fmt::format("resume: {}: '{}' is '{}', not a finite number: the checkpoint is damaged", path, key,
                          it->second));
}

std::map<std::string, std::string> with(std::map<std::string, std::string> meta,
                                        std::initializer_list<std::pair<const std::string, std::string>> more) {
  for (const auto& [k, v] : more) meta[k] = v;
  return meta;
}

}  // namespace

Checkpoints::Checkpoints(nn::Module& model, optim::Optimizer& optimizer, const TrainerOptions& options,
                         const int64_t& planned_epochs)
    : model_(model), optimizer_(optimizer), o_(options), planned_epochs_(planned_epochs) {}

nn::NamedTensors Checkpoints::saved_state() const {
  if (!o_.trainable_only) return model_.state_dict();
  nn::NamedTensors out;
  for (auto& [name, t] : model_.named_parameters())
    if (t.requires_grad()) out.emplace_back(name, t);
  return out;
}

std::string Checkpoints::weights_path(const std::string& suffix) const {
  return fmt::format("{}/{}{}.safetensors", o_.out_dir, o_.trainable_only ? "adapter" : "model", suffix);
}

void Checkpoints::load_saved_state(const std::map<std::string, Tensor>& state, const std::string& from,
                                   const char* what) {
  if (!o_.trainable_only) {
    model_.load_state_dict(state);
    return;
  }
  std::vector<std::string> missing, unexpected;
  std::set<std::string> expected;
  for (const auto& [name, t] : saved_state()) {
    expected.insert(name);
    if (!state.count(name)) missing.push_back(name);
  }
  for (const auto& [name, t] : state)
    if (!expected.count(name)) unexpected.push_back(name);
  TP_CHECK(missing.empty() && unexpected.empty(), "{}: {} holds other trainable tensors than this run's (missing: "
           "{}; unexpected: {}); resume with the options of its config.toml", what, from, fmt::join(missing, ", "),
           fmt::join(unexpected, ", "));
  model_.load_state_dict(state, false);
}

void Checkpoints::save(int64_t step, int64_t epoch, int64_t next_batch, double loss_sum, int64_t tokens) {
  if (!dist::is_main()) return;  // every rank holds the same weights; rank 0 writes them
  TP_CHECK(std::isfinite(optim::global_norm(o_.trainable_only ? model_.trainable_parameters() : model_.parameters())), "train: the weights are not finite after step {}; "
           "nothing was saved (the last checkpoint is intact). Lower --lr-factor or set --clip-norm", step);
  nn::NamedTensors state;
  for (auto& [name, t] : saved_state()) state.emplace_back("model." + name, t);
  for (auto& [name, t] : optimizer_.state_dict()) state.emplace_back("optimizer." + name, t);
  auto meta = with(o_.recipe, {{"epoch", std::to_string(epoch)},
                               {"next_batch", std::to_string(next_batch)},
                               {"step", std::to_string(step)},
                               {"epoch_loss_sum", fmt::format("{:.17g}", loss_sum)},
                               {"epoch_tokens", std::to_string(tokens)},
                               {"rng", default_generator().state()},
                               {"world_size", std::to_string(dist::world_size())}});
  if (planned_epochs_ > 0 && planned_epochs_ < o_.epochs) meta["planned_epochs"] = std::to_string(planned_epochs_);
  nn::save_safetensors(o_.out_dir + "/checkpoint.safetensors", state, meta);
  nn::save_safetensors(weights_path(""), saved_state(), with(o_.model_metadata, {{"step", std::to_string(step)}}));
}

ResumePoint Checkpoints::load(int64_t& step, FitResult& result) {
  ResumePoint at;
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
    // A base model that changed under a fine-tuning run is no option the user can set back.
    TP_CHECK(recorded == value || key != "base_fingerprint", "resume: {} fine-tuned a base model whose fingerprint "
             "was {}; its base now has {}: it changed since, and the run goes on from the model it began with only",
             from, recorded, value);
    TP_CHECK(recorded == value, "resume: {} was trained with {} = {}, but this run has {} = {}; resume with the "
             "options of its config.toml", from, key, recorded, key, value);
  }
  load_saved_state(model_state, from, "resume");
  optimizer_.load_state_dict(opt_state);
  step = meta_number<int64_t>(file.metadata, from, "step");
  TP_CHECK(optimizer_.step_count() == step, "resume: {} is at step {} but {} at step {}; the checkpoint is torn",
           opt_path, optimizer_.step_count(), from, step);
  at.epoch = meta_number<int64_t>(file.metadata, from, "epoch");
  at.batch = meta_number<int64_t>(file.metadata, from, "next_batch");
  at.loss_sum = meta_number<double>(file.metadata, from, "epoch_loss_sum");
  at.tokens = meta_number<int64_t>(file.metadata, from, "epoch_tokens");
  TP_CHECK(at.epoch >= 1 && at.batch >= 0 && at.tokens >= 0, "resume: {}: epoch {}, batch {} is not a position: the "
           "checkpoint is damaged", from, at.epoch, at.batch);
  TP_CHECK(file.metadata.count("rng"), "resume: {} has no 'rng' entry (not a training checkpoint)", from);
  if (file.metadata.count("planned_epochs")) at.planned_epochs = meta_number<int64_t>(file.metadata, from, "planned_epochs");
  // Older checkpoints (no entry) were written by one process.
  const int64_t saved_world = file.metadata.count("world_size") ? meta_number<int64_t>(file.metadata, from, "world_size") : 1;
  TP_CHECK(saved_world == dist::world_size() || o_.reshard,
           "resume: {} was written by a run on {} process{}, and this one has {}; resume with the same count (mpirun "
           "-np {}), or pass --reshard to go on with the same global batches split over {} (not bit-exact: each "
           "rank's dropout masks change)",
           from, saved_world, saved_world == 1 ? "" : "es", dist::world_size(), saved_world, dist::world_size());
  default_generator().set_state(file.metadata.at("rng"));
  std::printf("resume: from %s at epoch %lld, batch %lld, step %lld\n", from.c_str(), (long long)at.epoch,
              (long long)at.batch, (long long)step);
  // The best so far stays the best unless a later epoch beats it.
  const std::string best_path = weights_path(".best");
  if (!o_.best_metric.empty() && file_exists(best_path)) {
    auto best = nn::load_safetensors(best_path).metadata;
    if (best.count(o_.best_metric) && best.count("epoch")) {
      result.best_value = meta_number<double>(best, best_path, o_.best_metric.c_str());
      result.best_epoch = meta_number<int64_t>(best, best_path, "epoch");
    }
  }
  return at;
}

// Per-epoch copies (the last `keep` stay, for averaging) and the best on best_metric, written
// before the checkpoint that moves resume past this epoch; then curves.svg.
void Checkpoints::end_of_epoch(int64_t step, int64_t epoch, const EpochRecord& r, FitResult& result) {
  if (!dist::is_main()) return;
  const std::string epoch_path = weights_path(fmt::format(".epoch{}", epoch));
  nn::save_safetensors(epoch_path, saved_state(), with(o_.model_metadata, {{"epoch", std::to_string(epoch)}}));
  if (epoch - o_.keep >= 1) std::remove(weights_path(fmt::format(".epoch{}", epoch - o_.keep)).c_str());
  if (!o_.best_metric.empty()) {
    const double value = metric(r.metrics, o_.best_metric);
    if (result.best_epoch == 0 || value > result.best_value) {
      result.best_value = value;
      result.best_epoch = epoch;
      nn::save_safetensors(weights_path(".best"), saved_state(),
                           with(o_.model_metadata, {{"epoch", std::to_string(epoch)}, {o_.best_metric, fmt::format("{:.2f}", value)}}));
    }
  }
  save(step, epoch + 1, 0, 0, 0);
}

void Checkpoints::average(FitResult& result, int64_t last_epoch, int64_t count) {
  // An average left by an earlier run in this directory must not pass for this run's.
  std::remove(weights_path(".avg").c_str());
  if (count <= 1) return;
  std::vector<std::string> paths, epochs;
  // The last epochs this run reached: a run cut by its time limit averages what it has (issue 47:
  // cut in epoch 15 of 18, it averaged epochs 14-15 of the planned 14-18, not 11-15).
  for (int64_t e = std::max<int64_t>(1, last_epoch - count + 1); e <= last_epoch; ++e) {
    std::string p = weights_path(fmt::format(".epoch{}", e));
    if (std::ifstream(p).good()) paths.push_back(p), epochs.push_back(std::to_string(e));
  }
  if (paths.size() < 2) return;
  load_saved_state(average_checkpoints(paths), paths.back(), "average");
  nn::save_safetensors(weights_path(".avg"), saved_state(),
                       with(o_.model_metadata, {{"averaged", std::to_string(paths.size())}}));
  result.averaged = static_cast<int64_t>(paths.size());
  std::printf("averaged the weights of the last %zu epoch checkpoints (epochs %s)\n", paths.size(),
              fmt::format("{}", fmt::join(epochs, ", ")).c_str());
}

}  // namespace tapestry::apps
