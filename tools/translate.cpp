// `tapestry translate --checkpoint DIR`: sentences from a file or standard input, translated by a
// run that `train --task multi30k` wrote, one line out per line in.
#include <cstdio>
#include <iostream>
#include <memory>

#include "apps/data/text.h"
#include "apps/tasks/translation.h"
#include "tools/cli.h"

namespace tapestry::tools {

Subcommand add_translate(CLI::App& app) {
  struct Flags {
    std::string dir, input, weights;
    int64_t beam = 4;
    double alpha = 0.6;
    bool greedy = false;
    std::string device = "cpu";
  };
  auto f = std::make_shared<Flags>();
  auto* translate = app.add_subcommand("translate", "translate sentences with a trained checkpoint");
  translate->add_option("--checkpoint", f->dir, "directory written by `train --task multi30k --out DIR`")->required();
  translate->add_option("--input", f->input, "sentences, one per line (default: standard input)");
  translate->add_option("--beam", f->beam, "beam size")->check(positive())->capture_default_str();
  translate->add_option("--alpha", f->alpha, "length penalty")->check(real_flag(0, false))->capture_default_str();
  translate->add_flag("--greedy", f->greedy, "greedy decoding instead of beam search");
  translate->add_option("--device", f->device, "cpu, cuda, cuda:N, or emulated (the test device: CPU kernels, GPU rules)")->check(device_flag())->capture_default_str();
  translate->add_option("--weights", f->weights,
                        "weights file in the checkpoint directory (default: model.avg.safetensors if the run averaged, "
                        "else model.safetensors)");
  return {translate, [f] {
    auto lines = f->input.empty() ? apps::read_lines(std::cin, "<stdin>") : apps::read_lines(f->input);
    auto translator = apps::load_translator(f->dir, f->weights);
    translator.model->to(Device::parse(f->device));
    std::fprintf(stderr, "translate: %s, %s\n", translator.weights_path.c_str(),
                 f->greedy ? "greedy" : fmt::format("beam {}, alpha {}", f->beam, f->alpha).c_str());
    for (const auto& out : apps::translate(translator, lines, f->greedy ? 1 : f->beam, f->alpha))
      std::printf("%s\n", out.c_str());
    return 0;
  }};
}

}  // namespace tapestry::tools
