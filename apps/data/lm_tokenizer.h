// The tokenizers a language model can train with, behind one interface: raw bytes, SentencePiece
// subwords (trained on the training text), or GPT-2's byte-level BPE. Each has a separator token
// that ends every line of a corpus and stands for its newline, so that a corpus is one stream
// "sep line1 sep line2 sep ..." and bits per byte count each line's UTF-8 bytes plus one.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tapestry::apps {

class LMTokenizer {
 public:
  virtual ~LMTokenizer() = default;
  virtual std::vector<int64_t> encode(const std::string& text) const = 0;
  // The text of ids; the separator becomes "\n", other special ids are dropped.
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t separator() const = 0;
  // What starts a prompt and what ends a generation: the separator, except for a Hugging Face
  // model's tokenizer (its bos and eos tokens).
  virtual int64_t bos() const { return separator(); }
  int64_t eos() const { return separator(); }
  virtual std::string name() const = 0;  // "byte", "sentencepiece", "gpt2", "hf-bpe" or "hf-sentencepiece"
};

// Bytes 0..255 are the ids; the separator is '\n' itself.
std::unique_ptr<LMTokenizer> byte_tokenizer();
// A SentencePiece model file (apps/data/subword.h: pad 0, unk 1, bos 2, eos 3); eos separates.
std::unique_ptr<LMTokenizer> sentencepiece_tokenizer(const std::string& model_path);
// GPT-2's vocabulary files in dir (tools/get-gpt2-tokenizer.sh); <|endoftext|> separates.
std::unique_ptr<LMTokenizer> gpt2_tokenizer(const std::string& dir);

// The tokenizer of a Hugging Face model directory: tokenizer.model (SentencePiece, as Llama 2 and
// TinyLlama; the model's own bos and eos), or else tokenizer.json (byte-level BPE, as Llama 3 and
// SmolLM; bos and eos from tokenizer_config.json, else <|endoftext|>). Its separator is eos.
// Neither file, or one it cannot read, throws a tapestry::Error naming the file.
std::unique_ptr<LMTokenizer> hf_tokenizer(const std::string& dir);

// Where gpt2 looks for its files by default: $TAPESTRY_GPT2_DIR, else ~/.cache/tapestry/gpt2
// (where tools/get-gpt2-tokenizer.sh puts them).
std::string default_gpt2_dir();

}  // namespace tapestry::apps
