// `tapestry classify --checkpoint DIR [--text T]... [FILE]...`: labels mail as ham or spam with a
// classifier from `tapestry train --task classify`. Each FILE is one raw mail (headers and body,
// or a corpus JSON record); each --text is the text itself; with neither, every line of standard
// input is one text.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "apps/data/mail_corpus.h"
#include "apps/tasks/text_classification.h"
#include "tools/cli.h"

namespace tapestry::tools {

Subcommand add_classify(CLI::App& app) {
  struct Flags {
    std::string dir;
    std::vector<std::string> texts, files;
  };
  auto f = std::make_shared<Flags>();
  auto* classify = app.add_subcommand("classify", "label mail as ham or spam with a trained classifier");
  classify->add_option("--checkpoint", f->dir, "directory written by `train --task classify --out DIR`")->required();
  classify->add_option("--text", f->texts, "a text to label (repeatable)");
  classify->add_option("files", f->files, "raw mail files (or the corpus's JSON records) to label");
  return {classify, [f] {
    apps::TextClassifier model = apps::load_text_classifier(f->dir);
    std::vector<std::string> names, texts;
    for (const std::string& t : f->texts) names.push_back(t.substr(0, 60)), texts.push_back(t);
    for (const std::string& path : f->files) {
      std::ifstream in(path, std::ios::binary);
      TP_CHECK(in, "{}: cannot open", path);
      std::stringstream buf;
      buf << in.rdbuf();
      std::string raw = buf.str();
      nlohmann::json j = nlohmann::json::parse(raw, nullptr, false);
      if (!j.is_discarded() && j.is_object() && j.contains("text") && j["text"].is_string())
        raw = j["text"].get<std::string>();  // a corpus record
      names.push_back(path), texts.push_back(apps::mail_text(raw));
    }
    if (f->texts.empty() && f->files.empty())
      for (std::string line; std::getline(std::cin, line);) names.push_back(line.substr(0, 60)), texts.push_back(line);
    const std::vector<double> p = model.spam_probability(texts);
    for (size_t i = 0; i < p.size(); ++i)
      std::printf("%s %.3f  %s\n", p[i] >= 0.5 ? "spam" : "ham ", p[i], names[i].c_str());
    return 0;
  }};
}

}  // namespace tapestry::tools
