// `tapestry translate --checkpoint DIR`: sentences from a file or standard input, translated by a
// run that `train --task multi30k` wrote, one line out per line in.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>

#include "apps/data/text.h"
#include "apps/tasks/translation.h"
#include "tapestry/ops/cuda.h"
#include "tapestry/ops/factory.h"
#include "tapestry/ops/profile.h"
#include "tools/cli.h"

namespace tapestry::tools {

namespace {

// The length penalty the run was tested with: its config.toml's `alpha = X` line, or `fallback`
// (a run without one, or written before the option existed).
double run_alpha(const std::string& config_toml, double fallback) {
  std::ifstream in(config_toml);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("alpha = ", 0) != 0) continue;
    try {
      return std::stod(line.substr(8));
    } catch (const std::exception&) {
      return fallback;
    }
  }
  return fallback;
}

}  // namespace

Subcommand add_translate(CLI::App& app) {
  struct Flags {
    std::string dir, input, weights;
    int64_t beam = 4, batch = 50, threads = 0;
    double alpha = 0.6;
    bool greedy = false, profile = false, tf32 = false;
    std::string device = "cpu";
  };
  auto f = std::make_shared<Flags>();
  auto* translate = app.add_subcommand("translate", "translate sentences with a trained checkpoint");
  translate->add_option("--checkpoint", f->dir, "directory written by `train --task multi30k --out DIR`")->required();
  translate->add_option("--input", f->input, "sentences, one per line (default: standard input)");
  translate->add_option("--beam", f->beam, "beam size")->check(positive())->capture_default_str();
  CLI::Option* alpha = translate->add_option("--alpha", f->alpha, "length penalty (default: the run's, from its config.toml; else 0.6)")
                           ->check(real_flag(0, false));
  translate->add_flag("--greedy", f->greedy, "greedy decoding instead of beam search");
  translate->add_option("--batch", f->batch, "sentences decoded together (consecutive lines)")->check(positive())->capture_default_str();
  translate->add_option("--threads", f->threads, "threads (default: all cores)")->check(CLI::NonNegativeNumber);
  translate->add_option("--device", f->device, "cpu, cuda, cuda:N, or emulated (the test device: CPU kernels, GPU rules)")->check(device_flag())->capture_default_str();
  translate->add_option("--weights", f->weights,
                        "weights file in the checkpoint directory (default: model.avg.safetensors if the run averaged, "
                        "else model.safetensors)");
  translate->add_flag("--tf32", f->tf32, "float32 matmuls on a GPU through TF32 tensor cores (as "
                      "torch.backends.cuda.matmul.allow_tf32)");
  translate->add_flag("--profile", f->profile, "print the time spent per op to standard error after decoding");
  return {translate, [f, alpha] {
    if (alpha->count() == 0) f->alpha = run_alpha(f->dir + "/config.toml", f->alpha);
    auto lines = f->input.empty() ? apps::read_lines(std::cin, "<stdin>") : apps::read_lines(f->input);
    if (f->threads > 0) set_num_threads(static_cast<int>(f->threads));
    cuda::set_allow_tf32(f->tf32);
    auto translator = apps::load_translator(f->dir, f->weights);
    translator.model->to(Device::parse(f->device));
    std::fprintf(stderr, "translate: %s, %s, batches of %lld\n", translator.weights_path.c_str(),
                 f->greedy ? "greedy" : fmt::format("beam {}, alpha {}", f->beam, f->alpha).c_str(),
                 static_cast<long long>(f->batch));
    // The timer covers tokenizing, decoding and detokenizing (tools/decode-race.sh reads this line).
    profile::set_enabled(f->profile);
    const auto start = std::chrono::steady_clock::now();
    const auto outs = apps::translate(translator, lines, f->greedy ? 1 : f->beam, f->alpha, f->batch);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (const auto& out : outs) std::printf("%s\n", out.c_str());
    std::fprintf(stderr, "translate: %zu sentences in %.3f s (%.1f sentences/s)\n", outs.size(), seconds,
                 seconds > 0 ? static_cast<double>(outs.size()) / seconds : 0.0);
    if (f->profile) {  // outermost op scopes only, so the shares add up (see ops/profile.h)
      double seen = 0;
      for (auto& [name, e] : profile::report()) {
        seen += e.ms / 1000;
        std::fprintf(stderr, "  %-26s %8.3f s %6.1f%% %9lld calls\n", name.c_str(), e.ms / 1000,
                     100 * e.ms / 1000 / seconds, static_cast<long long>(e.calls));
      }
      std::fprintf(stderr, "  %-26s %8.3f s %6.1f%%\n", "(engine, search, rest)", seconds - seen,
                   100 * (seconds - seen) / seconds);
    }
    return 0;
  }};
}

}  // namespace tapestry::tools
