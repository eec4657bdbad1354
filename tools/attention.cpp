// `tapestry attention --checkpoint DIR --sentence S`: heat maps of every attention head of a
// trained translation model for one sentence, as an HTML page of SVGs.
#include <cstdio>
#include <memory>

#include "apps/data/text.h"
#include "apps/eval/attention_map.h"
#include "apps/tasks/translation.h"
#include "tools/cli.h"

namespace tapestry::tools {

Subcommand add_attention(CLI::App& app) {
  struct Flags {
    std::string dir, sentence, target, out = "attention.html", weights;
    std::vector<int64_t> layers;
  };
  auto f = std::make_shared<Flags>();
  auto* attention = app.add_subcommand("attention", "heat maps of every attention head for one sentence (HTML/SVG)");
  attention->add_option("--checkpoint", f->dir, "directory written by `train --task multi30k --out DIR`")->required();
  attention->add_option("--sentence", f->sentence, "the source sentence")->required();
  attention->add_option("--target", f->target, "the translation to attend along (default: the model's own, beam 4)");
  attention->add_option("--layers", f->layers, "layer indices to draw (default: all)")->check(CLI::NonNegativeNumber);
  attention->add_option("--out", f->out, "the HTML file to write")->capture_default_str();
  attention->add_option("--weights", f->weights, "weights file in the checkpoint directory (as for translate)");
  return {attention, [f] {
    for (const auto& [flag, text] : {std::pair<const char*, const std::string&>{"--sentence", f->sentence},
                                     {"--target", f->target}}) {
      const long bad = apps::invalid_utf8_at(text);
      TP_CHECK(bad < 0, "attention: {} is not valid UTF-8 (at byte {})", flag, bad + 1);
    }
    auto translator = apps::load_translator(f->dir, f->weights);
    auto maps = apps::attention_maps(*translator.model, *translator.subword, f->sentence, f->target, f->layers);
    apps::write_attention_html(f->out, maps);
    std::printf("source:      %s\ntranslation: %s\nwrote %zu maps (every head of each) to %s\n", maps.source.c_str(),
                maps.translation.c_str(), maps.maps.size(), f->out.c_str());
    return 0;
  }};
}

}  // namespace tapestry::tools
