// The language-model tokenizers (see lm_tokenizer.h).
#include "apps/data/lm_tokenizer.h"

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

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

// A Hugging Face model's SentencePiece tokenizer.model: its own ids, bos and eos.
class HFSentencePieceTokenizer : public LMTokenizer {
 public:
  explicit HFSentencePieceTokenizer(const std::string& path) : sp_(path) {
    TP_CHECK(sp_.bos_id() >= 0 && sp_.eos_id() >= 0, "{}: the model has no bos or eos piece", path);
  }
  std::vector<int64_t> encode(const std::string& text) const override { return sp_.encode(text); }
  std::string decode(const std::vector<int64_t>& ids) const override { return sp_.decode_any(ids); }
  int64_t vocab_size() const override { return sp_.vocab_size(); }
  int64_t separator() const override { return sp_.eos_id(); }
  int64_t bos() const override { return sp_.bos_id(); }
  std::string name() const override { return "hf-sentencepiece"; }

 private:
  Subword sp_;
};

// A Hugging Face tokenizer.json (byte-level BPE) with the bos and eos its tokenizer_config.json names.
class HFBPETokenizer : public LMTokenizer {
 public:
  HFBPETokenizer(const std::string& dir) : bpe_(ByteLevelBPE::load_tokenizer_json(dir + "/tokenizer.json")) {
    const std::string config = dir + "/tokenizer_config.json";
    nlohmann::json j;
    if (std::ifstream in(config); in.good()) {
      try {
        j = nlohmann::json::parse(in);
      } catch (const nlohmann::json::exception& e) {
        throw Error(fmt::format("{}: not valid JSON: {}", config, e.what()));
      }
    }
    auto special = [&](const char* key) -> int64_t {
      std::string text = "<|endoftext|>";
      if (j.is_object() && j.contains(key)) {
        const nlohmann::json& v = j.at(key);
        if (v.is_string()) text = v.get<std::string>();
        else if (v.is_object() && v.contains("content") && v.at("content").is_string())
          text = v.at("content").get<std::string>();
      }
      const int64_t id = bpe_.token_id(text);
      TP_CHECK(id >= 0, "{}: the {} token \"{}\" is not in {}/tokenizer.json", config, key, text, dir);
      return id;
    };
    bos_ = special("bos_token"), eos_ = special("eos_token");
  }
  std::vector<int64_t> encode(const std::string& text) const override { return bpe_.encode(text); }
  std::string decode(const std::vector<int64_t>& ids) const override {
    std::vector<int64_t> text_ids;  // bos and eos spelled out would clutter the text
    for (int64_t id : ids)
      if (id != bos_ && id != eos_) text_ids.push_back(id);
    return bpe_.decode(text_ids);
  }
  int64_t vocab_size() const override { return bpe_.vocab_size(); }
  int64_t separator() const override { return eos_; }
  int64_t bos() const override { return bos_; }
  std::string name() const override { return "hf-bpe"; }

 private:
  ByteLevelBPE bpe_;
  int64_t bos_ = -1, eos_ = -1;
};

}  // namespace

std::unique_ptr<LMTokenizer> hf_tokenizer(const std::string& dir) {
  // Llama 2's directories hold both (their tokenizer.json is SentencePiece's BPE converted, with
  // byte fallback): the SentencePiece model is the original.
  if (std::ifstream(dir + "/tokenizer.model").good())
    return std::make_unique<HFSentencePieceTokenizer>(dir + "/tokenizer.model");
  if (std::ifstream(dir + "/tokenizer.json").good()) return std::make_unique<HFBPETokenizer>(dir);
  throw Error(fmt::format("{}: no tokenizer.json or tokenizer.model (the model's tokenizer)", dir));
}

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
