// Reading text corpora: one sentence per line, plain or gzip'd (zlib reads both), checked to be
// valid UTF-8. Every fault names the file and, where it applies, the line.
#pragma once
#include <cstddef>
#include <cstdint>
#include <istream>
#include <string>
#include <vector>

namespace tapestry::apps {

// All lines of `path` without their line ends. Throws tapestry::Error for a missing or unreadable
// file, a corrupt .gz, or invalid UTF-8 ("FILE:LINE: invalid UTF-8 at byte N").
std::vector<std::string> read_lines(const std::string& path);
// The same for an open stream (`name` is used in messages).
std::vector<std::string> read_lines(std::istream& in, const std::string& name);

// The code point that starts at byte i < s.size(): {code point, its length in bytes}, or
// {-1, 1} when byte i does not start a valid UTF-8 sequence (a bad lead or continuation byte, a
// cut-off sequence, an overlong form, a surrogate, or past U+10FFFF).
struct Utf8Char {
  int32_t cp;
  size_t len;
};
Utf8Char utf8_char_at(const std::string& s, size_t i);

// Byte offset of the first invalid UTF-8 sequence in s, or -1 when s is valid.
long invalid_utf8_at(const std::string& s);

// The length of the longest prefix of `text` that does not end inside a UTF-8 sequence (for
// streaming bytes as they come).
size_t complete_utf8_prefix(const std::string& text);

}  // namespace tapestry::apps
