// `tapestry generate --checkpoint DIR --prompt "..."`: continues a prompt with a language model
// that `train --task lm` wrote (or Hugging Face weights with --hf: a Llama-family directory, or
// GPT-2's model.safetensors), streaming the text to stdout as tokens come; --input FILE continues
// one prompt per line, as one batch.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>

#include "apps/data/lm_tokenizer.h"
#include "apps/data/text.h"
#include "apps/tasks/language_model.h"
#include "tapestry/models/gpt.h"
#include "tapestry/ops/factory.h"
#include "tools/cli.h"

namespace tapestry::tools {

Subcommand add_generate(CLI::App& app) {
  struct Flags {
    std::string dir, hf, gpt2_dir, prompt, input;
    int64_t heads = 12, threads = 0;
    models::SampleOptions sample;
  };
  auto f = std::make_shared<Flags>();
  f->sample.seed = 1;
  auto* cmd = app.add_subcommand("generate", "continue text with a trained language model");
  cmd->add_option("--checkpoint", f->dir, "directory written by `train --task lm --out DIR`");
  cmd->add_option("--hf", f->hf, "instead: a Hugging Face Llama-family directory (config.json, model*.safetensors, "
                  "tokenizer.model or tokenizer.json), or GPT-2's model.safetensors file");
  cmd->add_option("--heads", f->heads, "with --hf GPT-2: attention heads (the file does not say; GPT-2 124M has 12)")
      ->check(positive())
      ->capture_default_str();
  cmd->add_option("--gpt2-dir", f->gpt2_dir, "with --hf GPT-2: GPT-2's encoder.json and vocab.bpe (default: "
                  "$TAPESTRY_GPT2_DIR or ~/.cache/tapestry/gpt2; tools/get-gpt2-tokenizer.sh fetches them)");
  cmd->add_option("--prompt", f->prompt, "the text to continue (streamed)");
  cmd->add_option("--input", f->input, "prompts, one per line, decoded as one batch");
  cmd->add_option("--max-new", f->sample.max_new, "tokens to add at most")->check(positive())->capture_default_str();
  cmd->add_option("--temperature", f->sample.temperature, "sampling temperature")
      ->check(real_flag(0, true))
      ->capture_default_str();
  cmd->add_option("--top-k", f->sample.top_k, "sample from the k most likely tokens (0: all)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--top-p", f->sample.top_p, "sample from the smallest set with this much probability (1: all)")
      ->check(real_flag(0, true, 1.0000001))
      ->capture_default_str();
  cmd->add_option("--seed", f->sample.seed, "random seed: the same seed gives the same text")->capture_default_str();
  cmd->add_flag("--greedy", f->sample.greedy, "always take the most likely token");
  cmd->add_option("--threads", f->threads, "threads (default: all cores)")->check(CLI::NonNegativeNumber);
  return {cmd, [f, cmd] {
    TP_CHECK(f->dir.empty() != f->hf.empty(), "generate: give exactly one of --checkpoint DIR and --hf DIR|FILE");
    TP_CHECK(f->input.empty() || cmd->count("--prompt") == 0, "generate: give --prompt or --input, not both");
    // A tokenizer would split invalid bytes into garbage tokens silently (issue 44): refused, as
    // input files' invalid lines are.
    const long bad = apps::invalid_utf8_at(f->prompt);
    TP_CHECK(bad < 0, "generate: --prompt is not valid UTF-8 (at byte {})", bad + 1);
    if (f->threads > 0) set_num_threads(static_cast<int>(f->threads));
    apps::LanguageModel lm;
    if (!f->dir.empty()) {
      lm = apps::load_language_model(f->dir);
    } else if (std::filesystem::is_directory(f->hf)) {
      lm = apps::load_hf_language_model(f->hf);
    } else {
      const std::string dir = f->gpt2_dir.empty() ? apps::default_gpt2_dir() : f->gpt2_dir;
      lm.tokenizer = apps::gpt2_tokenizer(dir);
      lm.model = models::load_gpt2_hf(f->hf, f->heads);
    }
    // Weights holding NaN or inf would print garbage and exit 0 (issue 44): refused, naming the tensor.
    for (const auto& [name, t] : lm.model->state_dict()) {
      if (!is_floating(t.dtype())) continue;
      const std::vector<double> values = t.detach().to(Device::CPU).to_vector<double>();
      const auto bad_values = std::count_if(values.begin(), values.end(), [](double v) { return !std::isfinite(v); });
      TP_CHECK(bad_values == 0, "generate: the weights hold NaN or inf in '{}' ({} of its {} values): the file is "
               "damaged, or the model diverged", name, bad_values, values.size());
    }
    const apps::LMTokenizer& tok = *lm.tokenizer;
    f->sample.eos = tok.eos();
    // A prompt continues a line of the training stream, which starts after a separator (a
    // Hugging Face model's text starts after its bos token).
    auto encode = [&](const std::string& text) {
      std::vector<int64_t> ids{tok.bos()};
      for (int64_t id : tok.encode(text)) ids.push_back(id);
      return ids;
    };
    // The continuation is decoded together with the prompt's tokens (body, which decodes to
    // `before`) and printed past them: some tokenizers (SentencePiece) spell a word's leading
    // space only inside a sequence.
    auto continuation = [&](const std::vector<int64_t>& body, const std::string& before,
                            const std::vector<int64_t>& added) {
      std::vector<int64_t> all = body;
      for (int64_t id : added)
        if (id != tok.eos()) all.push_back(id);
      const std::string text = tok.decode(all);
      return text.compare(0, before.size(), before) == 0 ? text.substr(before.size()) : " " + tok.decode(added);
    };
    if (!f->input.empty()) {
      auto lines = apps::read_lines(f->input);
      std::vector<std::vector<int64_t>> prompts;
      for (const auto& line : lines) prompts.push_back(encode(line));
      auto outs = models::generate(*lm.model, prompts, f->sample);
      for (size_t i = 0; i < lines.size(); ++i) {
        const std::vector<int64_t> body(prompts[i].begin() + 1, prompts[i].end());
        std::printf("%s%s\n", lines[i].c_str(), continuation(body, tok.decode(body), outs[i]).c_str());
      }
      return 0;
    }
    // Streaming: decode everything so far and print what is new, up to a whole UTF-8 character.
    std::printf("%s", f->prompt.c_str());
    std::fflush(stdout);
    const std::vector<int64_t> prompt = encode(f->prompt), body(prompt.begin() + 1, prompt.end());
    const std::string before = tok.decode(body);
    std::vector<int64_t> added;
    size_t printed = 0;
    models::generate(*lm.model, {prompt}, f->sample, [&](size_t, int64_t id) {
      if (id == tok.eos()) return;
      added.push_back(id);
      const std::string text = continuation(body, before, added);
      const size_t ready = apps::complete_utf8_prefix(text);
      if (ready > printed) {
        std::fwrite(text.data() + printed, 1, ready - printed, stdout);
        std::fflush(stdout);
        printed = ready;
      }
    });
    std::printf("\n");
    return 0;
  }};
}

}  // namespace tapestry::tools
