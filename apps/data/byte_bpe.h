// Byte-level BPE, the tokenizer of GPT-2 and of the Llama 3 and SmolLM families, read from either
// OpenAI's GPT-2 files (encoder.json and vocab.bpe; tools/get-gpt2-tokenizer.sh fetches them) or a
// Hugging Face tokenizer.json (model "BPE" with a ByteLevel pre-tokenizer), giving the ids the
// reference encoders give.
//
// Text is split into pre-tokens by one of two patterns (scanned by hand; \p{L}, \p{N} and \s come
// from apps/data/unicode_classes.inc, \s being Unicode's White_Space):
//   GPT-2's (encoder.json files; a tokenizer.json whose ByteLevel pre-tokenizer uses its regex)
//     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   Llama 3's (a tokenizer.json whose Split pre-tokenizer holds exactly this regex)
//     (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// Any other pre-tokenizer, normalizer or model option is refused when the file is read. Each
// pre-token's bytes are merged by rank (lowest first, leftmost on ties, as Hugging Face's BPE),
// with a cache per pre-token; with tokenizer.json's ignore_merges a pre-token that is itself in the
// vocabulary is taken whole. What encode() does not do, on purpose:
//   - special tokens: "<|endoftext|>" in the input is plain text (seven tokens for GPT-2), never a
//     special id; put the special ids (eot(), token_id("<|begin_of_text|>")) in yourself.
//   - reject invalid UTF-8: a byte that does not start a valid sequence (overlong forms, surrogates
//     and code points past U+10FFFF included) counts as one code point outside \p{L}, \p{N} and \s,
//     like punctuation; every byte has a token, so decode(encode(s)) == s for any bytes s.
//   - the (?i) of Llama 3's contractions folds ASCII only: "'S" is a contraction, "'\u017F" is not.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tapestry::apps {

// Copies share the vocabulary and a cache of pre-token encodings; encode and decode may run on
// several threads at once (the cache takes a lock).
class ByteLevelBPE {
 public:
  // Reads DIR/encoder.json and DIR/vocab.bpe. A missing, unreadable or inconsistent file throws a
  // tapestry::Error naming the file (and line) and what is wrong.
  static ByteLevelBPE load_gpt2(const std::string& dir);
  // Reads a Hugging Face tokenizer.json: model.vocab, model.merges ("a b" strings or [a, b]
  // pairs), the added tokens (special ids, decoded as their text), the pre-tokenizer. The same
  // errors, naming the file and the field.
  static ByteLevelBPE load_tokenizer_json(const std::string& path);

  std::vector<int64_t> encode(const std::string& utf8) const;
  // The bytes the ids stand for, concatenated (eot() gives "<|endoftext|>"); these need not be
  // valid UTF-8 when ids split a character. An id outside [0, vocab_size()) throws.
  std::string decode(const std::vector<int64_t>& ids) const;
  int64_t vocab_size() const;  // GPT-2: 50257; with tokenizer.json, the vocabulary and the added tokens
  int64_t eot() const;         // the id of "<|endoftext|>" (GPT-2: 50256), -1 where there is none
  // The id of a token spelled `text` (an added token's content, or a vocabulary token's bytes),
  // -1 where there is none.
  int64_t token_id(const std::string& text) const;

 private:
  struct Impl;
  explicit ByteLevelBPE(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace tapestry::apps
