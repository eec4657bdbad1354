// The tapestry command line (CLI11): `train --task copy`, `bench`, `bleu`. Bad flags print one
// clear line and exit non-zero.
#include <CLI/CLI.hpp>
#include <cstdio>

#include <iostream>

#include "models/bleu.h"
#include "models/copy_task.h"
#include "models/text.h"
#include "models/translation.h"
#include "tools/bench.h"
#include "tapestry.h"

using namespace tapestry;

namespace {

// CLI11's PositiveNumber prints the whole range of a double; this says it plainly.
const CLI::Validator kPositive(
    [](std::string& value) {
      try {
        size_t used = 0;
        if (std::stoll(value, &used) > 0 && used == value.size()) return std::string();
      } catch (const std::exception&) {
      }
      return "must be a positive integer, got '" + value + "'";
    },
    "POSITIVE");

int run_copy(const models::CopyTaskOptions& o) {
  std::printf("copy task: vocab %lld, length %lld, batch %lld, d_model %lld, %lld+%lld %s-norm layers, %lld heads, "
              "d_ff %lld, Noam warmup %lld\n",
              (long long)o.vocab, (long long)o.seq_len, (long long)o.batch, (long long)o.d_model, (long long)o.layers,
              (long long)o.layers, o.pre_norm ? "pre" : "post", (long long)o.heads, (long long)o.d_ff,
              (long long)o.warmup);
  auto r = models::train_copy_task(o, [](int64_t step, double loss, double acc) {
    std::printf("step %5lld  loss %.4f  exact copies %.1f%%\n", (long long)step, loss, 100 * acc);
    std::fflush(stdout);
  });
  if (r.solved) {
    std::printf("solved: every held-out sequence copied exactly after %lld steps\n", (long long)r.steps);
    return 0;
  }
  std::printf("not solved after %lld steps: %.1f%% exact copies\n", (long long)r.steps, 100 * r.accuracy);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tapestry: a C++ autograd engine and Transformer model zoo"};
  app.set_version_flag("--version", std::string("tapestry ") + kVersion);
  app.require_subcommand(0, 1);

  auto* train = app.add_subcommand("train", "train a model");
  std::string task = "copy";
  train->add_option("--task", task, "copy (the Annotated Transformer's copy task) or multi30k (German to English)")
      ->check(CLI::IsMember({"copy", "multi30k"}))
      ->capture_default_str();
  models::CopyTaskOptions copy;
  int threads = 0;
  train->add_option("--steps", copy.max_steps, "maximum training steps")->capture_default_str()->check(kPositive);
  train->add_option("--batch", copy.batch, "sequences per batch")->capture_default_str()->check(kPositive);
  train->add_option("--d-model", copy.d_model, "model width")->capture_default_str()->check(kPositive);
  train->add_option("--heads", copy.heads, "attention heads")->capture_default_str()->check(kPositive);
  train->add_option("--d-ff", copy.d_ff, "feed-forward width")->capture_default_str()->check(kPositive);
  train->add_option("--layers", copy.layers, "encoder and decoder layers")->capture_default_str()->check(kPositive);
  train->add_option("--warmup", copy.warmup, "Noam warmup steps")->capture_default_str()->check(kPositive);
  train->add_option("--seed", copy.seed, "random seed")->capture_default_str();
  train->add_option("--lr-factor", copy.lr_factor, "Noam schedule factor")->capture_default_str();
  models::TranslationOptions mt;
  train->add_option("--data", mt.data_dir, "multi30k: data directory (default: $TAPESTRY_DATA or ../shared/data/multi30k)");
  train->add_option("--out", mt.out_dir, "multi30k: where the subword model and checkpoints go")->capture_default_str();
  train->add_option("--config", mt.config, "multi30k: model size")
      ->check(CLI::IsMember({"tiny", "small", "base", "big"}))
      ->capture_default_str();
  train->add_option("--epochs", mt.epochs, "multi30k: epochs")->check(kPositive)->capture_default_str();
  train->add_option("--limit", mt.limit, "multi30k: use only the first N training pairs")->check(kPositive);
  train->add_option("--eval-limit", mt.eval_limit, "multi30k: score only the first N val/test sentences")->check(kPositive);
  train->add_option("--max-tokens", mt.max_tokens, "multi30k: padded tokens per batch")->check(kPositive)->capture_default_str();
  train->add_option("--vocab-size", mt.vocab_size, "multi30k: subword vocabulary")->check(kPositive)->capture_default_str();
  train->add_option("--beam", mt.beam, "multi30k: beam size for the test set (1: greedy)")->check(kPositive)->capture_default_str();
  train->add_option("--label-smoothing", mt.label_smoothing, "multi30k: label smoothing")->capture_default_str();
  train->add_flag("--resume", mt.resume, "multi30k: continue exactly from the checkpoint in --out");
  train->add_option("--save-every", mt.save_every, "multi30k: also checkpoint every N steps")->check(kPositive);
  train->add_option("--keep", mt.keep, "multi30k: keep the last K epoch checkpoints")->check(kPositive)->capture_default_str();
  train->add_option("--average", mt.average, "multi30k: average the last N epoch checkpoints before the test")
      ->check(kPositive);
  bool post_norm = false;
  train->add_flag("--post-norm", post_norm, "the paper's post-norm layers (default: pre-norm, as the Annotated Transformer)");
  train->add_option("--threads", threads, "threads (default: all cores)")->check(CLI::NonNegativeNumber);

  auto* bench = app.add_subcommand("bench", "time a named workload (see docs/benchmarks.md)");
  tools::BenchOptions bo;
  bench->add_option("--workload", bo.workload, "copy, small or base")
      ->check(CLI::IsMember({"copy", "small", "base"}))
      ->capture_default_str();
  bench->add_option("--threads", bo.threads, "threads (default: all cores)")->check(kPositive);
  bench->add_option("--steps", bo.steps, "timed train steps")->check(kPositive)->capture_default_str();
  bench->add_option("--warmup", bo.warmup, "untimed steps first")->check(CLI::NonNegativeNumber)->capture_default_str();
  bench->add_flag("--json", bo.json, "one JSON object on one line");
  bench->add_flag("--profile", bo.profile, "also print per-op times of the train step");
  bench->add_flag("--peak", bo.peak, "measure the machine's fp32 FMA peak instead");

  auto* bleu = app.add_subcommand("bleu", "corpus BLEU of hypotheses against references, as sacreBLEU's default");
  std::string ref_path, hyp_path;
  bleu->add_option("--ref", ref_path, "reference file (plain or .gz), one sentence per line")->required();
  bleu->add_option("--hyp", hyp_path, "hypothesis file (default: standard input)");

  auto* translate = app.add_subcommand("translate", "translate sentences with a trained checkpoint");
  std::string ckpt_dir, input_path;
  int64_t tr_beam = 4;
  double tr_alpha = 0.6;
  bool tr_greedy = false;
  translate->add_option("--checkpoint", ckpt_dir, "directory written by `train --task multi30k --out DIR`")->required();
  translate->add_option("--input", input_path, "sentences, one per line (default: standard input)");
  translate->add_option("--beam", tr_beam, "beam size")->check(kPositive)->capture_default_str();
  translate->add_option("--alpha", tr_alpha, "length penalty")->check(CLI::NonNegativeNumber)->capture_default_str();
  translate->add_flag("--greedy", tr_greedy, "greedy decoding instead of beam search");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (threads > 0) set_num_threads(threads);
    copy.pre_norm = !post_norm;
    if (*train && task == "multi30k") {
      if (train->count("--warmup")) mt.warmup = copy.warmup;
      if (train->count("--lr-factor")) mt.lr_factor = copy.lr_factor;
      if (train->count("--seed")) mt.seed = copy.seed;
      models::train_translation(mt);
      return 0;
    }
    if (*train) return run_copy(copy);
    if (*bench) return tools::run_bench(bo);
    if (*translate) {
      auto lines = input_path.empty() ? models::read_lines(std::cin, "<stdin>") : models::read_lines(input_path);
      for (const auto& out : models::translate(ckpt_dir, lines, tr_greedy ? 1 : tr_beam, tr_alpha))
        std::printf("%s\n", out.c_str());
      return 0;
    }
    if (*bleu) {
      auto refs = models::read_lines(ref_path);
      auto hyps = hyp_path.empty() ? models::read_lines(std::cin, "<stdin>") : models::read_lines(hyp_path);
      auto score = models::corpus_bleu(hyps, refs);
      std::printf("%s\n%s\n", score.format().c_str(), models::BleuScore::signature().c_str());
      return 0;
    }
    std::printf("%s", app.help().c_str());
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "tapestry: %s\n", e.what());
    return 1;
  }
}
