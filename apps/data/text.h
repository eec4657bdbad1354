// Reading text corpora: one sentence per line, plain or gzip'd (zlib reads both), checked to be
// valid UTF-8. Every fault names the file and, where it applies, the line.
#pragma once
#include <istream>
#include <string>
#include <vector>

namespace tapestry::apps {

// All lines of `path` without their line ends. Throws tapestry::Error for a missing or unreadable
// file, a corrupt .gz, or invalid UTF-8 ("FILE:LINE: invalid UTF-8 at byte N").
std::vector<std::string> read_lines(const std::string& path);
// The same for an open stream (`name` is used in messages).
std::vector<std::string> read_lines(std::istream& in, const std::string& name);

// Byte offset of the first invalid UTF-8 sequence in s, or -1 when s is valid.
long invalid_utf8_at(const std::string& s);

}  // namespace tapestry::apps
