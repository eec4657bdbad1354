// GPT-2's byte-level BPE tokenizer: the 50257-token vocabulary of GPT-2 (and GPT-3's r50k),
// read from OpenAI's encoder.json and vocab.bpe (tools/get-gpt2-tokenizer.sh fetches them), and
// giving the ids OpenAI's encoder gives.
//
// Text is split into pre-tokens by GPT-2's pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// (scanned by hand; \p{L}, \p{N} and \s come from apps/data/unicode_classes.inc, \s being Unicode's
// White_Space as in the `regex` module encoder.py used; JavaScript ports such as gpt-3-encoder
// differ on U+0085 and U+FEFF), and each pre-token's bytes are merged by rank, with a cache per
// pre-token. What encode() does not do, on purpose:
//   - special tokens: "<|endoftext|>" in the input is plain text (seven tokens: "<", "|", "end",
//     "of", "text", "|", ">"), never eot(); put eot() between documents yourself.
//   - reject invalid UTF-8: a byte that does not start a valid sequence (overlong forms, surrogates
//     and code points past U+10FFFF included) counts as one code point outside \p{L}, \p{N} and \s,
//     like punctuation; every byte has a token, so decode(encode(s)) == s for any bytes s.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tapestry::apps {

// Copies share the vocabulary and a cache of pre-token encodings; encode and decode may run on
// several threads at once (the cache takes a lock).
class Gpt2Tokenizer {
 public:
  // Reads DIR/encoder.json and DIR/vocab.bpe. A missing, unreadable or inconsistent file throws a
  // tapestry::Error naming the file (and line) and what is wrong.
  static Gpt2Tokenizer load(const std::string& dir);

  std::vector<int64_t> encode(const std::string& utf8) const;
  // The bytes the ids stand for, concatenated (eot() gives "<|endoftext|>"); these need not be
  // valid UTF-8 when ids split a character. An id outside [0, vocab_size()) throws.
  std::string decode(const std::vector<int64_t>& ids) const;
  int64_t vocab_size() const;  // 50257
  int64_t eot() const;         // the id of "<|endoftext|>": 50256

 private:
  struct Impl;
  explicit Gpt2Tokenizer(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace tapestry::apps
