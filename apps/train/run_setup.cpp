// A run's set-up and the shared option groups (see run_setup.h).
#include "apps/train/run_setup.h"

#include "tapestry/ops/factory.h"

namespace tapestry::apps {

RunSetup::RunSetup(OptionTable table, TrainerOptions trainer, std::function<std::string()> config_toml)
    : table_(std::move(table)), trainer_(std::move(trainer)), make_toml_(std::move(config_toml)) {
  table_.check();  // before the data are read, as the flags would be
  if (trainer_.threads > 0) set_num_threads(static_cast<int>(trainer_.threads));
  config_toml_ = make_toml_ ? make_toml_() : table_.to_toml();
}

void RunSetup::open(std::vector<std::string> files) {
  files.push_back("config.toml");
  folder_.emplace(trainer_.out_dir, trainer_.resume, trainer_.overwrite, files);  // refuses an empty --out
  seed();
}

void RunSetup::seed() const { manual_seed(trainer_.seed); }

TrainerOptions& RunSetup::record(const std::map<std::string, std::string>& recipe,
                                 std::map<std::string, std::string> metadata, std::string curves_title) {
  if (make_toml_) config_toml_ = make_toml_();
  trainer_.recipe = table_.recipe();
  trainer_.recipe.insert(recipe.begin(), recipe.end());
  trainer_.run_files = {{"config.toml", config_toml_}};
  trainer_.model_metadata = std::move(metadata);
  trainer_.curves_title = std::move(curves_title);
  return trainer_;
}

void add_run_rows(OptionTable& table, const OptionTable& trainer, const std::vector<std::string>& also) {
  table.take(trainer, "save-every");
  table.take_all(trainer, also);
  table.take_all(trainer, {"threads", "device"});
  table.take_all(trainer, kRunControlFlags);
}

void AdamWCosine::add_rows(OptionTable& t, const std::string& weight_decay_help) {
  t.add("warmup", warmup, "steps of linear warmup before the cosine decay").positive();
  t.add("lr", lr, "peak learning rate (AdamW)").above(0);
  t.add("min-lr", min_lr, "learning rate at the end of the cosine decay").at_least(0);
  t.add("weight-decay", weight_decay, weight_decay_help).at_least(0);
  t.add_check([this] { return min_lr <= lr ? "" : fmt::format("--min-lr {} is above --lr {}", min_lr, lr); });
}

optim::CosineSchedule AdamWCosine::schedule(int64_t total_steps) const {
  return optim::CosineSchedule(lr, warmup_steps(total_steps), total_steps, min_lr);
}

std::unique_ptr<optim::AdamW> AdamWCosine::adamw(std::vector<Tensor> decay, std::vector<Tensor> no_decay,
                                                 double beta2) const {
  optim::AdamWOptions o;
  o.lr = lr, o.beta1 = 0.9, o.beta2 = beta2, o.eps = 1e-8, o.weight_decay = weight_decay;
  return std::make_unique<optim::AdamW>(
      std::vector<optim::ParamGroup>{{std::move(decay), std::nullopt, weight_decay}, {std::move(no_decay), std::nullopt, 0.0}}, o);
}

}  // namespace tapestry::apps
