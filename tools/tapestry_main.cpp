// The tapestry command line (CLI11): `train --task copy`, `bench`, `bleu`. Bad flags print one
// clear line and exit non-zero.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <cmath>
#include <cstdio>

#include <iostream>

#include "apps/eval/attention_map.h"
#include "apps/eval/bleu.h"
#include "apps/tasks/copy_task.h"
#include "apps/data/text.h"
#include "apps/tasks/translation.h"
#include "tools/config_file.h"
#include "tools/bench.h"
#include "tapestry/tapestry.h"

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

// A real-valued flag: finite, above lo (or at it unless lo_strict), below hi. CLI11's range
// checks let "nan" through (every comparison with NaN is false).
CLI::Validator real_flag(double lo, bool lo_strict, double hi = INFINITY) {
  const std::string range =
      std::isinf(hi) ? fmt::format("{} {}", lo_strict ? ">" : ">=", lo) : fmt::format("in [{}, {})", lo, hi);
  return CLI::Validator(
      [=](std::string& value) {
        try {
          size_t used = 0;
          double v = std::stod(value, &used);
          if (used == value.size() && std::isfinite(v) && (lo_strict ? v > lo : v >= lo) && v < hi) return std::string();
        } catch (const std::exception&) {
        }
        return fmt::format("must be a number {}, got '{}'", range, value);
      },
      range);
}

int run_copy(const apps::CopyTaskOptions& o) {
  std::printf("copy task: vocab %lld, length %lld, batch %lld, d_model %lld, %lld+%lld %s-norm layers, %lld heads, "
              "d_ff %lld, Noam warmup %lld\n",
              (long long)o.vocab, (long long)o.seq_len, (long long)o.batch, (long long)o.d_model, (long long)o.layers,
              (long long)o.layers, o.pre_norm ? "pre" : "post", (long long)o.heads, (long long)o.d_ff,
              (long long)o.warmup);
  auto r = apps::train_copy_task(o, [](int64_t step, double loss, double acc) {
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
  // Repeated flags take the last value: a config file's options go first, so the command line wins.
  train->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  std::string config_file;
  train->add_option("--config-file", config_file,
                    "read options from a TOML file of `flag = value` lines (a run's config.toml); flags override it");
  std::string task = "copy";
  train->add_option("--task", task, "copy (the Annotated Transformer's copy task) or multi30k (German to English)")
      ->check(CLI::IsMember({"copy", "multi30k"}))
      ->capture_default_str();
  apps::CopyTaskOptions copy;
  apps::TranslationOptions mt;
  int threads = 0;
  std::string norm;
  // Shared by both tasks (their defaults differ: the task's own apply when the flag is absent).
  train->add_option("--warmup", copy.warmup, "Noam warmup steps (copy 400, multi30k see README)")->check(kPositive);
  train->add_option("--lr-factor", copy.lr_factor, "Noam schedule factor")->check(real_flag(0, true));
  train->add_option("--seed", copy.seed, "random seed");
  train->add_option("--norm", norm, "pre or post: where the layers put LayerNorm (copy: pre, multi30k: see README)")
      ->check(CLI::IsMember({"pre", "post"}));
  train->add_option("--threads", threads, "threads (default: all cores)")->check(CLI::NonNegativeNumber);
  auto* copy_group = train->add_option_group("copy task");
  copy_group->add_option("--steps", copy.max_steps, "maximum training steps")->capture_default_str()->check(kPositive);
  copy_group->add_option("--batch", copy.batch, "sequences per batch")->capture_default_str()->check(kPositive);
  copy_group->add_option("--d-model", copy.d_model, "model width")->capture_default_str()->check(kPositive);
  copy_group->add_option("--heads", copy.heads, "attention heads")->capture_default_str()->check(kPositive);
  copy_group->add_option("--d-ff", copy.d_ff, "feed-forward width")->capture_default_str()->check(kPositive);
  copy_group->add_option("--layers", copy.layers, "encoder and decoder layers")->capture_default_str()->check(kPositive);
  auto* m = train->add_option_group("multi30k");
  m->add_option("--data", mt.data_dir, "data directory (default: $TAPESTRY_DATA or ../shared/data/multi30k)");
  m->add_option("--out", mt.out_dir, "where the subword model, config.toml and checkpoints go")->capture_default_str();
  m->add_option("--config", mt.config, "model size")
      ->check(CLI::IsMember({"tiny", "small", "base", "big"}))
      ->capture_default_str();
  m->add_option("--epochs", mt.epochs, "epochs")->check(kPositive)->capture_default_str();
  m->add_option("--limit", mt.limit, "use only the first N training pairs (0: all)")->check(CLI::NonNegativeNumber);
  m->add_option("--eval-limit", mt.eval_limit, "score only the first N val/test sentences (0: all)")
      ->check(CLI::NonNegativeNumber);
  m->add_option("--max-tokens", mt.max_tokens, "padded tokens per batch")->check(kPositive)->capture_default_str();
  m->add_option("--accumulate", mt.accumulate, "batches per optimizer step (gradient accumulation)")
      ->check(kPositive)
      ->capture_default_str();
  m->add_option("--vocab-size", mt.vocab_size, "subword vocabulary")->check(kPositive)->capture_default_str();
  m->add_option("--dropout", mt.dropout, "dropout")->check(real_flag(0, false, 1))->capture_default_str();
  m->add_option("--label-smoothing", mt.label_smoothing, "label smoothing")
      ->check(real_flag(0, false, 1))
      ->capture_default_str();
  m->add_option("--clip-norm", mt.clip_norm, "clip the gradient norm to this (0: no clipping)")
      ->check(real_flag(0, false))
      ->capture_default_str();
  m->add_option("--beam", mt.beam, "beam size for the test set (1: greedy)")->check(kPositive)->capture_default_str();
  m->add_option("--alpha", mt.alpha, "length penalty for the test set")->check(real_flag(0, false))->capture_default_str();
  m->add_flag("--resume", mt.resume, "continue exactly from the checkpoint in --out");
  m->add_flag("--overwrite", mt.overwrite, "start over in an --out that holds a run (deletes its checkpoints)");
  m->add_option("--on-nan", mt.on_nan, "a non-finite loss or gradient: stop (nothing saved) or skip the step")
      ->check(CLI::IsMember({"stop", "skip"}))
      ->capture_default_str();
  m->add_flag("--detect-anomaly", mt.detect_anomaly, "name the first op whose forward or backward gives NaN/inf (slow)");
  m->add_option("--save-every", mt.save_every, "also checkpoint every N steps (0: each epoch)")
      ->check(CLI::NonNegativeNumber);
  m->add_option("--keep", mt.keep, "keep the last K epoch checkpoints")->check(kPositive)->capture_default_str();
  m->add_option("--average", mt.average, "average the last N epoch checkpoints before the test (0, 1: none)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  bool quick = false, print_config = false;
  m->add_flag("--quick", quick, "the quick recipe: shows learning in under 10 minutes (see README)");
  m->add_flag("--print-config", print_config, "print the options as TOML and exit");

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
  translate->add_option("--alpha", tr_alpha, "length penalty")->check(real_flag(0, false))->capture_default_str();
  translate->add_flag("--greedy", tr_greedy, "greedy decoding instead of beam search");
  std::string tr_weights;
  translate->add_option("--weights", tr_weights,
                        "weights file in the checkpoint directory (default: model.avg.safetensors if the run averaged, "
                        "else model.safetensors)");

  auto* attention = app.add_subcommand("attention", "heat maps of every attention head for one sentence (HTML/SVG)");
  std::string at_dir, at_sentence, at_target, at_out = "attention.html", at_weights;
  std::vector<int64_t> at_layers;
  attention->add_option("--checkpoint", at_dir, "directory written by `train --task multi30k --out DIR`")->required();
  attention->add_option("--sentence", at_sentence, "the source sentence")->required();
  attention->add_option("--target", at_target, "the translation to attend along (default: the model's own, beam 4)");
  attention->add_option("--layers", at_layers, "layer indices to draw (default: all)")->check(CLI::NonNegativeNumber);
  attention->add_option("--out", at_out, "the HTML file to write")->capture_default_str();
  attention->add_option("--weights", at_weights, "weights file in the checkpoint directory (as for translate)");

  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    app.parse(std::vector<std::string>(args.rbegin(), args.rend()));  // CLI11 takes the arguments reversed
    if (!config_file.empty()) {
      auto from_file = config_file_args(config_file, train);
      args.insert(std::find(args.begin(), args.end(), "train") + 1, from_file.begin(), from_file.end());
      app.parse(std::vector<std::string>(args.rbegin(), args.rend()));
    }
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const Error& e) {
    std::fprintf(stderr, "tapestry: %s\n", e.what());
    return 1;
  }
  try {
    if (threads > 0) set_num_threads(threads);
    copy.pre_norm = norm != "post";
    if (*train) {  // a flag of the other task would be ignored silently: refuse it
      const auto* wrong = task == "multi30k" ? copy_group : m;
      for (const CLI::Option* option : wrong->get_options())
        TP_CHECK(option->count() == 0, "train: {} is not an option of --task {}", option->get_name(), task);
    }
    if (*train && task == "multi30k") {
      // The quick recipe changes the defaults only: flags and a config file still win.
      auto preset = [&](const char* flag, auto& field, auto value) {
        if (quick && train->count(flag) == 0) field = value;
      };
      preset("--epochs", mt.epochs, apps::TranslationOptions::kQuickEpochs);
      preset("--eval-limit", mt.eval_limit, apps::TranslationOptions::kQuickEvalLimit);
      preset("--beam", mt.beam, int64_t{1});
      preset("--average", mt.average, int64_t{0});
      if (quick && train->count("--out") == 0) mt.out_dir = "runs/multi30k-quick";
      if (train->count("--warmup")) mt.warmup = copy.warmup;
      if (train->count("--lr-factor")) mt.lr_factor = copy.lr_factor;
      if (train->count("--seed")) mt.seed = copy.seed;
      if (!norm.empty()) mt.pre_norm = norm == "pre";
      mt.threads = threads;
      if (print_config) {
        std::printf("%s", apps::options_to_toml(mt).c_str());
        return 0;
      }
      auto result = apps::train_translation(mt);
      return result.interrupted ? 128 + result.interrupted : 0;
    }
    if (*train) return run_copy(copy);
    if (*bench) return tools::run_bench(bo);
    if (*translate) {
      auto lines = input_path.empty() ? apps::read_lines(std::cin, "<stdin>") : apps::read_lines(input_path);
      auto translator = apps::load_translator(ckpt_dir, tr_weights);
      std::fprintf(stderr, "translate: %s, %s\n", translator.weights_path.c_str(),
                   tr_greedy ? "greedy" : fmt::format("beam {}, alpha {}", tr_beam, tr_alpha).c_str());
      for (const auto& out : apps::translate(translator, lines, tr_greedy ? 1 : tr_beam, tr_alpha))
        std::printf("%s\n", out.c_str());
      return 0;
    }
    if (*attention) {
      auto translator = apps::load_translator(at_dir, at_weights);
      auto maps = apps::attention_maps(translator, at_sentence, at_target, at_layers);
      apps::write_attention_html(at_out, maps);
      std::printf("source:      %s\ntranslation: %s\nwrote %zu maps (every head of each) to %s\n", maps.source.c_str(),
                  maps.translation.c_str(), maps.maps.size(), at_out.c_str());
      return 0;
    }
    if (*bleu) {
      auto refs = apps::read_lines(ref_path);
      auto hyps = hyp_path.empty() ? apps::read_lines(std::cin, "<stdin>") : apps::read_lines(hyp_path);
      auto score = apps::corpus_bleu(hyps, refs);
      std::printf("%s\n%s\n", score.format().c_str(), apps::BleuScore::signature().c_str());
      return 0;
    }
    std::printf("%s", app.help().c_str());
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "tapestry: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "tapestry: out of memory\n");
    return 1;
  } catch (const std::exception& e) {  // a library's own exception: still one line, never an abort
    std::fprintf(stderr, "tapestry: %s\n", e.what());
    return 1;
  }
}
