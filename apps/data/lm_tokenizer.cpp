// The language-model tokenizers (see lm_tokenizer.h).
#include "apps/data/lm_tokenizer.h"

#include <cstdlib>

#include "apps/data/byte_bpe.h"
#include "apps/data/subword.h"
#include "tapestry/ops/error.h"

namespace tapestry::apps {

namespace {

// ids with `separator` between lines: each run decoded by decode_run, the runs joined by "\n"
// (for tokenizers whose own decode drops or spells out the separator).
template <class DecodeRun>
std::string decode_lines(const std::vector<int64_t>& ids, int64_t separator, const DecodeRun& decode_run) {
  std::string s;
  std::vector<int64_t> run;
  for (int64_t id : ids) {
    if (id == separator) {
      s += decode_run(run) + "\n";
      run.clear();
    } else {
      run.push_back(id);
    }
  }
  return s + decode_run(run);
}

class ByteTokenizer : public LMTokenizer {
 public:
  std::vector<int64_t> encode(const std::string& text) const override {
    std::vector<int64_t> ids;
    ids.reserve(text.size());
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  std::string decode(const std::vector<int64_t>& ids) const override {
    std::string s;
    for (int64_t id : ids) {
      TP_CHECK(id >= 0 && id < 256, "byte tokenizer: id {} is not a byte", id);
      s.push_back(static_cast<char>(id));
    }
    return s;
  }
  int64_t vocab_size() const override { return 256; }
  int64_t separator() const override { return '\n'; }
  std::string name() const override { return "byte"; }
};

class SentencePieceTokenizer : public LMTokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& path) : sp_(path) {}
  std::vector<int64_t> encode(const std::string& text) const override { return sp_.encode(text); }
  std::string decode(const std::vector<int64_t>& ids) const override {
    // Subword::decode drops the special ids, the separator (eos) included.
    return decode_lines(ids, Subword::kEos, [this](const std::vector<int64_t>& run) { return sp_.decode(run); });
  }
  int64_t vocab_size() const override { return sp_.vocab_size(); }
  int64_t separator() const override { return Subword::kEos; }
  std::string name() const override { return "sentencepiece"; }

 private:
  Subword sp_;
};

class Gpt2LMTokenizer : public LMTokenizer {
 public:
  explicit Gpt2LMTokenizer(const std::string& dir) : bpe_(ByteLevelBPE::load_gpt2(dir)) {}
  std::vector<int64_t> encode(const std::string& text) const override { return bpe_.encode(text); }
  std::string decode(const std::vector<int64_t>& ids) const override {
    // ByteLevelBPE::decode spells eot out as "<|endoftext|>".
    return decode_lines(ids, bpe_.eot(), [this](const std::vector<int64_t>& run) { return bpe_.decode(run); });
  }
  int64_t vocab_size() const override { return bpe_.vocab_size(); }
  int64_t separator() const override { return bpe_.eot(); }
  std::string name() const override { return "gpt2"; }

 private:
  ByteLevelBPE bpe_;
};

}  // namespace

std::unique_ptr<LMTokenizer> byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }
std::unique_ptr<LMTokenizer> sentencepiece_tokenizer(const std::string& path) {
  return std::make_unique<SentencePieceTokenizer>(path);
}
std::unique_ptr<LMTokenizer> gpt2_tokenizer(const std::string& dir) { return std::make_unique<Gpt2LMTokenizer>(dir); }

std::string default_gpt2_dir() {
  if (const char* dir = std::getenv("TAPESTRY_GPT2_DIR")) return dir;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : ".") + "/.cache/tapestry/gpt2";
}

}  // namespace tapestry::apps
