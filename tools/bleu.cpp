// `tapestry bleu --ref FILE [--hyp FILE]`: corpus BLEU as sacreBLEU prints it, with its signature.
#include <cstdio>
#include <iostream>
#include <memory>

#include "apps/data/text.h"
#include "apps/eval/bleu.h"
#include "tools/cli.h"

namespace tapestry::tools {

Subcommand add_bleu(CLI::App& app) {
  struct Flags {
    std::string ref_path, hyp_path;
  };
  auto f = std::make_shared<Flags>();
  auto* bleu = app.add_subcommand("bleu", "corpus BLEU of hypotheses against references, as sacreBLEU's default");
  bleu->add_option("--ref", f->ref_path, "reference file (plain or .gz), one sentence per line")->required();
  bleu->add_option("--hyp", f->hyp_path, "hypothesis file (default: standard input)");
  return {bleu, [f] {
    auto refs = apps::read_lines(f->ref_path);
    auto hyps = f->hyp_path.empty() ? apps::read_lines(std::cin, "<stdin>") : apps::read_lines(f->hyp_path);
    auto score = apps::corpus_bleu(hyps, refs);
    std::printf("%s\n%s\n", score.format().c_str(), apps::BleuScore::signature().c_str());
    return 0;
  }};
}

}  // namespace tapestry::tools
