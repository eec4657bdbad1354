// `tapestry train --task copy|multi30k|lm`: the flags of each task, and the Trainer's, bound to
// the task's options. Flags several tasks take (warmup, seed, data, out, epochs, ...) are applied
// to the chosen task only when given, so each task keeps its own defaults.
#include <algorithm>
#include <cstdio>
#include <memory>

#include "apps/tasks/copy_task.h"
#include "apps/tasks/language_model.h"
#include "apps/tasks/translation.h"
#include "tapestry/dist/dist.h"
#include "tapestry/tapestry.h"
#include "tools/cli.h"

namespace tapestry::tools {

namespace {

struct TrainFlags {
  std::string config_file, task = "copy", norm, step_log, device = "cpu";
  int64_t warmup = 0, threads = 0;
  double lr_factor = 0;
  uint64_t seed = 0;
  bool quick = false, print_config = false, no_progress = false;
  apps::CopyTaskOptions copy;
  apps::TranslationOptions mt;
  apps::LMOptions lm;
  // Shared by multi30k and lm (bound here, copied into the task's options when given).
  std::string data, out, config, on_nan;
  int64_t epochs = 0, limit = 0, save_every = 0, vocab_size = 0, batch = 0;
  double dropout = 0, clip_norm = 0, time_limit = 0;
  bool resume = false, overwrite = false, reshard = false;
  CLI::App* cmd = nullptr;
  CLI::Option_group *copy_group = nullptr, *mt_group = nullptr, *lm_group = nullptr;
};

// The flags multi30k and lm share, given on the command line or by --config-file.
template <class Options> void apply_corpus_flags(const TrainFlags& f, Options& o) {
  if (f.cmd->count("--out")) o.out_dir = f.out;
  if (f.cmd->count("--config")) o.config = f.config;
  if (f.cmd->count("--epochs")) o.epochs = f.epochs;
  if (f.cmd->count("--limit")) o.limit = f.limit;
  if (f.cmd->count("--save-every")) o.save_every = f.save_every;
  if (f.cmd->count("--vocab-size")) o.vocab_size = f.vocab_size;
  if (f.cmd->count("--dropout")) o.dropout = f.dropout;
  if (f.cmd->count("--clip-norm")) o.clip_norm = f.clip_norm;
  if (f.cmd->count("--on-nan")) o.on_nan = f.on_nan;
  if (f.cmd->count("--time-limit")) o.time_limit = f.time_limit;
  if (f.resume) o.resume = true;
  if (f.overwrite) o.overwrite = true;
  if (f.reshard) o.reshard = true;
}

// Flags given on the command line (or by --config-file) that both tasks share.
template <class Options> void apply_shared(const TrainFlags& f, Options& o) {
  if (f.cmd->count("--warmup")) o.warmup = f.warmup;
  if (f.cmd->count("--lr-factor")) o.lr_factor = f.lr_factor;
  if (f.cmd->count("--seed")) o.seed = f.seed;
  if (!f.norm.empty()) o.pre_norm = f.norm == "pre";
  if (!f.step_log.empty()) o.step_log = f.step_log;
  if (f.no_progress) o.progress = false;
  o.device = f.device;
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

int run_lm(TrainFlags& f) {
  for (const char* flag : {"--lr-factor", "--norm"})
    TP_CHECK(f.cmd->count(flag) == 0, "train: {} is not an option of --task lm", flag);
  apps::LMOptions& lm = f.lm;
  apply_corpus_flags(f, lm);
  if (f.cmd->count("--data")) lm.train_path = f.data;
  if (f.cmd->count("--batch")) lm.batch = f.batch;
  if (f.cmd->count("--warmup")) lm.warmup = f.warmup;
  if (f.cmd->count("--seed")) lm.seed = f.seed;
  if (!f.step_log.empty()) lm.step_log = f.step_log;
  if (f.no_progress) lm.progress = false;
  lm.threads = f.threads;
  lm.device = f.device;
  auto r = apps::train_language_model(lm);
  return r.interrupted ? 128 + r.interrupted : 0;
}

int run_train(TrainFlags& f) {
  if (f.threads > 0) set_num_threads(static_cast<int>(f.threads));
  // N ranks given `--device cuda`: each takes a GPU of its host, its local rank modulo their number
  // (torchrun's LOCAL_RANK convention). NCCL refuses two ranks on one GPU, with a message naming them.
  if (f.device == "cuda" && dist::world_size() > 1)
    f.device = fmt::format("cuda:{}", dist::local_rank() % std::max(1, cuda::device_count()));
  // A flag of another task would be ignored silently: refuse it.
  std::vector<const CLI::Option_group*> wrong;
  if (f.task != "copy") wrong.push_back(f.copy_group);
  if (f.task != "multi30k") wrong.push_back(f.mt_group);
  if (f.task != "lm") wrong.push_back(f.lm_group);
  for (const auto* group : wrong)
    for (const CLI::Option* option : group->get_options())
      TP_CHECK(option->count() == 0, "train: {} is not an option of --task {}", option->get_name(), f.task);
  if (f.task == "copy") {
    for (const char* flag : {"--data", "--out", "--config", "--epochs", "--limit", "--save-every", "--vocab-size",
                             "--dropout", "--clip-norm", "--on-nan", "--resume", "--overwrite", "--reshard", "--time-limit"})
      TP_CHECK(f.cmd->count(flag) == 0, "train: {} is not an option of --task copy", flag);
    if (f.cmd->count("--batch")) f.copy.batch = f.batch;
    apply_shared(f, f.copy);
    return run_copy(f.copy);
  }
  if (f.task == "lm") return run_lm(f);
  TP_CHECK(f.cmd->count("--batch") == 0, "train: --batch is not an option of --task multi30k (see --max-tokens)");
  TP_CHECK(f.cmd->count("--config") == 0 || f.config == "tiny" || f.config == "small" || f.config == "base" ||
               f.config == "big",
           "train: --config {} is not a Transformer size (multi30k: tiny, small, base or big)", f.config);
  apply_corpus_flags(f, f.mt);
  if (f.cmd->count("--data")) f.mt.data_dir = f.data;
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
  train->add_option("--task", f->task,
                    "copy (the Annotated Transformer's copy task), multi30k (German to English) or lm (a GPT "
                    "language model on any text)")
      ->check(CLI::IsMember({"copy", "multi30k", "lm"}))
      ->capture_default_str();
  // Shared by both tasks (their defaults differ: the task's own apply when the flag is absent).
  train->add_option("--warmup", f->warmup, "Noam warmup steps (copy 400, multi30k see docs/training.md)")->check(positive());
  train->add_option("--lr-factor", f->lr_factor, "Noam schedule factor")->check(real_flag(0, true));
  train->add_option("--seed", f->seed, "random seed");
  train->add_option("--norm", f->norm, "pre or post: where the layers put LayerNorm (copy: pre, multi30k: see docs/training.md)")
      ->check(CLI::IsMember({"pre", "post"}));
  train->add_option("--threads", f->threads, "threads (default: all cores)")->check(CLI::NonNegativeNumber);
  train->add_option("--device", f->device, "cpu, cuda, cuda:N (a GPU needs a -DTAPESTRY_CUDA=ON build) or emulated (the test device)")
      ->check(device_flag())
      ->capture_default_str();
  train->add_option("--step-log", f->step_log,
                    "append a TSV line per optimizer step: step, epoch, loss, tokens, lr, gradient norm");
  train->add_flag("--no-progress", f->no_progress, "no progress line on stderr");

  apps::CopyTaskOptions& copy = f->copy;
  auto* c = f->copy_group = train->add_option_group("copy task");
  c->add_option("--steps", copy.max_steps, "maximum training steps")->capture_default_str()->check(positive());
  c->add_option("--d-model", copy.d_model, "model width")->capture_default_str()->check(positive());
  c->add_option("--heads", copy.heads, "attention heads")->capture_default_str()->check(positive());
  c->add_option("--d-ff", copy.d_ff, "feed-forward width")->capture_default_str()->check(positive());
  c->add_option("--layers", copy.layers, "encoder and decoder layers")->capture_default_str()->check(positive());

  // Shared by the tasks that read a corpus (multi30k, lm); --batch also by the copy task.
  train->add_option("--batch", f->batch, "sequences per batch (copy 30, lm 32)")->check(positive());
  train->add_option("--data", f->data,
                    "multi30k: the data directory (default: $TAPESTRY_DATA or ../shared/data/multi30k); lm: the "
                    "training text, UTF-8, plain or .gz (default: Multi30k's train.en)");
  train->add_option("--out", f->out, "where the tokenizer, config and checkpoints go (runs/multi30k, runs/lm)");
  train->add_option("--config", f->config, "model size: multi30k tiny|small|base|big, lm tiny|mini|small|medium|gpt2")
      ->check(CLI::IsMember({"tiny", "mini", "small", "medium", "base", "big", "gpt2"}));
  train->add_option("--epochs", f->epochs, "epochs (multi30k 12, lm 8)")->check(positive());
  train->add_option("--limit", f->limit, "use only the first N training pairs or lines (0: all)")
      ->check(CLI::NonNegativeNumber);
  train->add_option("--vocab-size", f->vocab_size, "SentencePiece vocabulary (multi30k 8000, lm 4000)")
      ->check(positive());
  train->add_option("--dropout", f->dropout, "dropout (0.1)")->check(real_flag(0, false, 1));
  train->add_option("--clip-norm", f->clip_norm, "clip the gradient norm to this (0: none; multi30k 0, lm 1)")
      ->check(real_flag(0, false));
  train->add_flag("--resume", f->resume, "continue exactly from the checkpoint in --out");
  train->add_flag("--reshard", f->reshard, "with --resume under mpirun: accept a checkpoint written by a different "
                  "number of processes (same global batches; dropout masks differ, so not bit-exact)");
  train->add_flag("--overwrite", f->overwrite, "start over in an --out that holds a run (deletes its checkpoints)");
  train->add_option("--on-nan", f->on_nan, "a non-finite loss or gradient: stop (nothing saved) or skip the step")
      ->check(CLI::IsMember({"stop", "skip"}));
  train->add_option("--time-limit", f->time_limit, "end training after this many seconds (0: none); the epoch "
                    "then ends there, evaluated and saved")
      ->check(real_flag(0, false));
  train->add_option("--save-every", f->save_every, "also checkpoint every N steps (0: each epoch)")
      ->check(CLI::NonNegativeNumber);

  apps::TranslationOptions& mt = f->mt;
  auto* m = f->mt_group = train->add_option_group("multi30k");
  m->add_option("--eval-limit", mt.eval_limit, "score only the first N val/test sentences (0: all)")
      ->check(CLI::NonNegativeNumber);
  m->add_option("--max-tokens", mt.max_tokens, "padded tokens per batch")->check(positive())->capture_default_str();
  m->add_option("--accumulate", mt.accumulate, "batches per optimizer step (gradient accumulation)")
      ->check(positive())
      ->capture_default_str();
  m->add_option("--label-smoothing", mt.label_smoothing, "label smoothing")
      ->check(real_flag(0, false, 1))
      ->capture_default_str();
  m->add_option("--beam", mt.beam, "beam size for the test set (1: greedy)")->check(positive())->capture_default_str();
  m->add_option("--alpha", mt.alpha, "length penalty for the test set")->check(real_flag(0, false))->capture_default_str();
  m->add_flag("--detect-anomaly", mt.detect_anomaly, "name the first op whose forward or backward gives NaN/inf (slow)");
  m->add_option("--keep", mt.keep, "keep the last K epoch checkpoints")->check(positive())->capture_default_str();
  m->add_option("--average", mt.average, "average the last N epoch checkpoints before the test (0, 1: none)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  apps::LMOptions& lm = f->lm;
  auto* l = f->lm_group = train->add_option_group("lm");
  l->add_option("--val", lm.val_path, "validation text (default: Multi30k's val.en, or with --data the last 5% of it)");
  l->add_option("--tokenizer", lm.tokenizer, "sentencepiece (trained on --data), byte, or gpt2 (GPT-2's BPE; "
                "tools/get-gpt2-tokenizer.sh fetches its files)")
      ->check(CLI::IsMember({"sentencepiece", "byte", "gpt2"}))
      ->capture_default_str();
  l->add_option("--gpt2-dir", lm.gpt2_dir, "where encoder.json and vocab.bpe are (default: $TAPESTRY_GPT2_DIR or "
                "~/.cache/tapestry/gpt2)");
  l->add_option("--block", lm.block, "context length of the training windows")->check(positive())->capture_default_str();
  l->add_option("--lr", lm.lr, "peak learning rate (AdamW)")->check(real_flag(0, true))->capture_default_str();
  l->add_option("--min-lr", lm.min_lr, "learning rate at the end of the cosine decay")
      ->check(real_flag(0, false))
      ->capture_default_str();
  l->add_option("--weight-decay", lm.weight_decay, "AdamW weight decay on matrices (none on biases and LayerNorm)")
      ->check(real_flag(0, false))
      ->capture_default_str();
  l->add_flag("--export-ids", lm.export_ids, "also write the token streams (train.ids, val.ids: int32) for "
              "tools/lm-compare.sh");
  m->add_flag("--quick", f->quick, "the quick recipe: shows learning in minutes (see docs/training.md)");
  m->add_flag("--print-config", f->print_config, "print the options as TOML and exit");
  return {train, [f] { return run_train(*f); }};
}

}  // namespace tapestry::tools
