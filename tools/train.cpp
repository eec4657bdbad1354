// `tapestry train --task copy|multi30k`: the flags of each task, and the Trainer's, bound to the
// task's options. Flags both tasks take (warmup, lr factor, seed, norm, threads, step log) are
// applied to the chosen task only when given, so each task keeps its own defaults.
#include <cstdio>
#include <memory>

#include "apps/tasks/copy_task.h"
#include "apps/tasks/translation.h"
#include "tapestry/tapestry.h"
#include "tools/cli.h"

namespace tapestry::tools {

namespace {

struct TrainFlags {
  std::string config_file, task = "copy", norm, step_log;
  int64_t warmup = 0, threads = 0;
  double lr_factor = 0;
  uint64_t seed = 0;
  bool quick = false, print_config = false, no_progress = false;
  apps::CopyTaskOptions copy;
  apps::TranslationOptions mt;
  CLI::App* cmd = nullptr;
  CLI::Option_group *copy_group = nullptr, *mt_group = nullptr;
};

// Flags given on the command line (or by --config-file) that both tasks share.
template <class Options> void apply_shared(const TrainFlags& f, Options& o) {
  if (f.cmd->count("--warmup")) o.warmup = f.warmup;
  if (f.cmd->count("--lr-factor")) o.lr_factor = f.lr_factor;
  if (f.cmd->count("--seed")) o.seed = f.seed;
  if (!f.norm.empty()) o.pre_norm = f.norm == "pre";
  if (!f.step_log.empty()) o.step_log = f.step_log;
  if (f.no_progress) o.progress = false;
}

int run_copy(const apps::CopyTaskOptions& o) {
  std::printf("copy task: vocab %lld, length %lld, batch %lld, d_model %lld, %lld+%lld %s-norm layers, %lld heads, "
              "d_ff %lld, Noam warmup %lld\n",
              (long long)o.vocab, (long long)o.seq_len, (long long)o.batch, (long long)o.d_model, (long long)o.layers,
              (long long)o.layers, o.pre_norm ? "pre" : "post", (long long)o.heads, (long long)o.d_ff,
              (long long)o.warmup);
  std::fflush(stdout);
  auto r = apps::train_copy_task(o);
  if (r.solved) {
    std::printf("solved: every held-out sequence copied exactly after %lld steps\n", (long long)r.steps);
    return 0;
  }
  std::printf("not solved after %lld steps: %.1f%% exact copies\n", (long long)r.steps, 100 * r.accuracy);
  return 1;
}

int run_train(TrainFlags& f) {
  if (f.threads > 0) set_num_threads(static_cast<int>(f.threads));
  // A flag of the other task would be ignored silently: refuse it.
  const auto* wrong = f.task == "multi30k" ? f.copy_group : f.mt_group;
  for (const CLI::Option* option : wrong->get_options())
    TP_CHECK(option->count() == 0, "train: {} is not an option of --task {}", option->get_name(), f.task);
  if (f.task == "copy") {
    apply_shared(f, f.copy);
    return run_copy(f.copy);
  }
  apps::TranslationOptions& mt = f.mt;
  // The quick recipe changes the defaults only: flags and a config file still win.
  auto preset = [&](const char* flag, auto& field, auto value) {
    if (f.quick && f.cmd->count(flag) == 0) field = value;
  };
  preset("--epochs", mt.epochs, apps::TranslationOptions::kQuickEpochs);
  preset("--eval-limit", mt.eval_limit, apps::TranslationOptions::kQuickEvalLimit);
  preset("--beam", mt.beam, int64_t{1});
  preset("--average", mt.average, int64_t{0});
  preset("--out", mt.out_dir, std::string("runs/multi30k-quick"));
  apply_shared(f, mt);
  mt.threads = f.threads;
  if (f.print_config) {
    std::printf("%s", apps::options_to_toml(mt).c_str());
    return 0;
  }
  auto result = apps::train_translation(mt);
  return result.interrupted ? 128 + result.interrupted : 0;
}

}  // namespace

Subcommand add_train(CLI::App& app) {
  auto f = std::make_shared<TrainFlags>();
  auto* train = f->cmd = app.add_subcommand("train", "train a model");
  // Repeated flags take the last value: a config file's options go first, so the command line wins.
  train->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  train->add_option("--config-file", f->config_file,
                    "read options from a TOML file of `flag = value` lines (a run's config.toml); flags override it");
  train->add_option("--task", f->task, "copy (the Annotated Transformer's copy task) or multi30k (German to English)")
      ->check(CLI::IsMember({"copy", "multi30k"}))
      ->capture_default_str();
  // Shared by both tasks (their defaults differ: the task's own apply when the flag is absent).
  train->add_option("--warmup", f->warmup, "Noam warmup steps (copy 400, multi30k see README)")->check(positive());
  train->add_option("--lr-factor", f->lr_factor, "Noam schedule factor")->check(real_flag(0, true));
  train->add_option("--seed", f->seed, "random seed");
  train->add_option("--norm", f->norm, "pre or post: where the layers put LayerNorm (copy: pre, multi30k: see README)")
      ->check(CLI::IsMember({"pre", "post"}));
  train->add_option("--threads", f->threads, "threads (default: all cores)")->check(CLI::NonNegativeNumber);
  train->add_option("--step-log", f->step_log,
                    "append a TSV line per optimizer step: step, epoch, loss, tokens, lr, gradient norm");
  train->add_flag("--no-progress", f->no_progress, "no progress line on stderr");

  apps::CopyTaskOptions& copy = f->copy;
  auto* c = f->copy_group = train->add_option_group("copy task");
  c->add_option("--steps", copy.max_steps, "maximum training steps")->capture_default_str()->check(positive());
  c->add_option("--batch", copy.batch, "sequences per batch")->capture_default_str()->check(positive());
  c->add_option("--d-model", copy.d_model, "model width")->capture_default_str()->check(positive());
  c->add_option("--heads", copy.heads, "attention heads")->capture_default_str()->check(positive());
  c->add_option("--d-ff", copy.d_ff, "feed-forward width")->capture_default_str()->check(positive());
  c->add_option("--layers", copy.layers, "encoder and decoder layers")->capture_default_str()->check(positive());

  apps::TranslationOptions& mt = f->mt;
  auto* m = f->mt_group = train->add_option_group("multi30k");
  m->add_option("--data", mt.data_dir, "data directory (default: $TAPESTRY_DATA or ../shared/data/multi30k)");
  m->add_option("--out", mt.out_dir, "where the subword model, config.toml and checkpoints go")->capture_default_str();
  m->add_option("--config", mt.config, "model size")
      ->check(CLI::IsMember({"tiny", "small", "base", "big"}))
      ->capture_default_str();
  m->add_option("--epochs", mt.epochs, "epochs")->check(positive())->capture_default_str();
  m->add_option("--limit", mt.limit, "use only the first N training pairs (0: all)")->check(CLI::NonNegativeNumber);
  m->add_option("--eval-limit", mt.eval_limit, "score only the first N val/test sentences (0: all)")
      ->check(CLI::NonNegativeNumber);
  m->add_option("--max-tokens", mt.max_tokens, "padded tokens per batch")->check(positive())->capture_default_str();
  m->add_option("--accumulate", mt.accumulate, "batches per optimizer step (gradient accumulation)")
      ->check(positive())
      ->capture_default_str();
  m->add_option("--vocab-size", mt.vocab_size, "subword vocabulary")->check(positive())->capture_default_str();
  m->add_option("--dropout", mt.dropout, "dropout")->check(real_flag(0, false, 1))->capture_default_str();
  m->add_option("--label-smoothing", mt.label_smoothing, "label smoothing")
      ->check(real_flag(0, false, 1))
      ->capture_default_str();
  m->add_option("--clip-norm", mt.clip_norm, "clip the gradient norm to this (0: no clipping)")
      ->check(real_flag(0, false))
      ->capture_default_str();
  m->add_option("--beam", mt.beam, "beam size for the test set (1: greedy)")->check(positive())->capture_default_str();
  m->add_option("--alpha", mt.alpha, "length penalty for the test set")->check(real_flag(0, false))->capture_default_str();
  m->add_flag("--resume", mt.resume, "continue exactly from the checkpoint in --out");
  m->add_flag("--overwrite", mt.overwrite, "start over in an --out that holds a run (deletes its checkpoints)");
  m->add_option("--on-nan", mt.on_nan, "a non-finite loss or gradient: stop (nothing saved) or skip the step")
      ->check(CLI::IsMember({"stop", "skip"}))
      ->capture_default_str();
  m->add_flag("--detect-anomaly", mt.detect_anomaly, "name the first op whose forward or backward gives NaN/inf (slow)");
  m->add_option("--save-every", mt.save_every, "also checkpoint every N steps (0: each epoch)")
      ->check(CLI::NonNegativeNumber);
  m->add_option("--keep", mt.keep, "keep the last K epoch checkpoints")->check(positive())->capture_default_str();
  m->add_option("--average", mt.average, "average the last N epoch checkpoints before the test (0, 1: none)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  m->add_flag("--quick", f->quick, "the quick recipe: shows learning in under 10 minutes (see README)");
  m->add_flag("--print-config", f->print_config, "print the options as TOML and exit");
  return {train, [f] { return run_train(*f); }};
}

}  // namespace tapestry::tools
