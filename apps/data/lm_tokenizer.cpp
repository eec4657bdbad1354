// The language-model tokenizers (see lm_tokenizer.h).
#include "apps/data/lm_tokenizer.h"

#include "apps/data/gpt2_bpe.h"
#include "apps/data/subword.h"
#include "tapestry/ops/error.h"

namespace tapestry::apps {

namespace {

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
    // Subword::decode drops the special ids: decode line by line, joined by newlines.
    std::string s;
    std::vector<int64_t> line;
    for (int64_t id : ids) {
      if (id == Subword::kEos) {
        s += sp_.decode(line) + "\n";
        line.clear();
      } else {
        line.push_back(id);
      }
    }
    return s + sp_.decode(line);
  }
  int64_t vocab_size() const override { return sp_.vocab_size(); }
  int64_t separator() const override { return Subword::kEos; }
  std::string name() const override { return "sentencepiece"; }

 private:
  Subword sp_;
};

class Gpt2LMTokenizer : public LMTokenizer {
 public:
  explicit Gpt2LMTokenizer(const std::string& dir) : bpe_(Gpt2Tokenizer::load(dir)) {}
  std::vector<int64_t> encode(const std::string& text) const override { return bpe_.encode(text); }
  std::string decode(const std::vector<int64_t>& ids) const override {
    std::string s;
    std::vector<int64_t> run;
    for (int64_t id : ids) {
      if (id == bpe_.eot()) {
        s += bpe_.decode(run) + "\n";
        run.clear();
      } else {
        run.push_back(id);
      }
    }
    return s + bpe_.decode(run);
  }
  int64_t vocab_size() const override { return bpe_.vocab_size(); }
  int64_t separator() const override { return bpe_.eot(); }
  std::string name() const override { return "gpt2"; }

 private:
  Gpt2Tokenizer bpe_;
};

}  // namespace

std::unique_ptr<LMTokenizer> byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }
std::unique_ptr<LMTokenizer> sentencepiece_tokenizer(const std::string& path) {
  return std::make_unique<SentencePieceTokenizer>(path);
}
std::unique_ptr<LMTokenizer> gpt2_tokenizer(const std::string& dir) { return std::make_unique<Gpt2LMTokenizer>(dir); }

size_t complete_utf8_prefix(const std::string& text) {
  // Walk back over at most 3 continuation bytes to the last lead byte; keep it only if its
  // sequence is complete.
  size_t n = text.size(), i = n;
  int back = 0;
  while (i > 0 && back < 4 && (static_cast<unsigned char>(text[i - 1]) & 0xC0) == 0x80) --i, ++back;
  if (i == 0) return back ? 0 : n;
  const unsigned char lead = static_cast<unsigned char>(text[i - 1]);
  const size_t need = lead < 0x80 ? 1 : (lead >> 5) == 6 ? 2 : (lead >> 4) == 14 ? 3 : (lead >> 3) == 30 ? 4 : 1;
  return n - (i - 1) >= need ? n : i - 1;
}

}  // namespace tapestry::apps
