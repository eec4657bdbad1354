// libFuzzer target: the corpus reader read_lines (apps/data/text.h).
// The first input byte picks the mode; the rest is the text:
//   even: the text is written as a plain file and read with read_lines(path);
//   odd:  the text is gzip-compressed with zlib's gzwrite (level from the byte's upper bits) into
//         a .gz file and read with read_lines(path), through zlib's inflate.
// Either way the result is compared with read_lines(std::istream&) on the same text: both must
// accept it with the same lines or both refuse it. (A plain file that itself starts with the gzip
// magic is decompressed by zlib, so it is read but not compared.)
// A tapestry::Error is the expected answer to bad input; anything else is a bug.
#include <zlib.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "apps/data/text.h"
#include "tapestry/ops/error.h"

namespace {

struct Outcome {
  bool ok = false;
  std::vector<std::string> lines;
};

template <class F> Outcome attempt(F&& read) {
  Outcome o;
  try {
    o.lines = read();
    o.ok = true;
  } catch (const tapestry::Error&) {
    o.ok = false;
  }
  return o;
}

std::string describe(const Outcome& o) {
  if (!o.ok) return "an Error";
  return std::to_string(o.lines.size()) + " lines";
}

void compare(const char* mode, const Outcome& file, const Outcome& stream) {
  if (file.ok != stream.ok || file.lines != stream.lines) {
    std::string what = std::string(mode) + ": read_lines(path) gave " + describe(file) +
                       " but read_lines(istream) gave " + describe(stream);
    if (file.ok && stream.ok)
      for (size_t i = 0; i < file.lines.size() && i < stream.lines.size(); ++i)
        if (file.lines[i] != stream.lines[i]) {
          what += "; first difference at line " + std::to_string(i + 1);
          break;
        }
    tapestry_fuzz::fail("fuzz_text", what);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static tapestry_fuzz::ScratchFile plain("text", ".txt");
  static tapestry_fuzz::ScratchFile packed("text", ".txt.gz");
  const bool gz = (data[0] & 1) != 0;
  const int level = (data[0] >> 1) % 10;  // 0 stores, 9 compresses most
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);

  Outcome stream = attempt([&] {
    std::istringstream in(text);
    return tapestry::apps::read_lines(in, "<input>");
  });

  if (!gz) {
    plain.write(text);
    Outcome file = attempt([&] { return tapestry::apps::read_lines(plain.path()); });
    const bool gzip_magic = text.size() >= 2 && static_cast<unsigned char>(text[0]) == 0x1f &&
                            static_cast<unsigned char>(text[1]) == 0x8b;
    if (!gzip_magic) compare("plain", file, stream);
    return 0;
  }

  const std::string mode = "wb" + std::to_string(level);
  gzFile f = gzopen(packed.path().c_str(), mode.c_str());
  if (f == nullptr) tapestry_fuzz::fail("fuzz_text", "gzopen(" + packed.path() + ", " + mode + ") failed");
  if (!text.empty() && gzwrite(f, text.data(), static_cast<unsigned>(text.size())) != static_cast<int>(text.size()))
    tapestry_fuzz::fail("fuzz_text", "gzwrite failed");
  if (gzclose(f) != Z_OK) tapestry_fuzz::fail("fuzz_text", "gzclose failed");
  Outcome file = attempt([&] { return tapestry::apps::read_lines(packed.path()); });
  compare("gzip", file, stream);
  return 0;
}
