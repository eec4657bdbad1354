// Text corpus reading (see text.h).
#include "apps/data/text.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <iterator>

#include "tapestry/ops/error.h"

namespace tapestry::apps {

Utf8Char utf8_char_at(const std::string& s, size_t i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const unsigned char c = p[i];
  if (c < 0x80) return {c, 1};
  size_t len;
  uint32_t cp;
  if ((c & 0xE0) == 0xC0) {
    len = 2, cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3, cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4, cp = c & 0x07;
  } else {
    return {-1, 1};
  }
  if (i + len > s.size()) return {-1, 1};
  for (size_t k = 1; k < len; ++k) {
    if ((p[i + k] & 0xC0) != 0x80) return {-1, 1};
    cp = (cp << 6) | (p[i + k] & 0x3F);
  }
  // overlong forms, surrogates and code points past U+10FFFF are invalid too
  if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10FFFF ||
      (cp >= 0xD800 && cp <= 0xDFFF))
    return {-1, 1};
  return {static_cast<int32_t>(cp), len};
}

long invalid_utf8_at(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const Utf8Char u = utf8_char_at(s, i);
    if (u.cp < 0) return static_cast<long>(i);
    i += u.len;
  }
  return -1;
}

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

namespace {
// A line this long is not a sentence: /dev/zero or a binary file would otherwise grow one
// line until memory runs out.
constexpr size_t kMaxLineBytes = 1 << 20;

Error line_too_long(const std::vector<std::string>& out, const std::string& name) {
  return Error(fmt::format("{}:{}: line longer than {} bytes (not a text corpus?)", name, out.size() + 1, kMaxLineBytes));
}

void finish_line(std::string& line, std::vector<std::string>& out, const std::string& name) {
  if (!line.empty() && line.back() == '\r') line.pop_back();
  long bad = invalid_utf8_at(line);
  TP_CHECK(bad < 0, "{}:{}: invalid UTF-8 at byte {}", name, out.size() + 1, bad + 1);
  out.push_back(std::move(line));
  line.clear();
}
}  // namespace

std::vector<std::string> read_lines(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  TP_CHECK(f != nullptr, "{}: cannot open: {}", path, std::strerror(errno ? errno : ENOENT));
  std::vector<std::string> out;
  std::string line;
  char buf[1 << 16];
  int n;
  try {
    while ((n = gzread(f, buf, sizeof buf)) > 0) {
      for (int i = 0; i < n; ++i) {
        if (buf[i] == '\n') {
          finish_line(line, out, path);
        } else {
          line.push_back(buf[i]);
          if (line.size() > kMaxLineBytes) throw line_too_long(out, path);
        }
      }
    }
    if (n < 0) {
      int code;
      std::string msg = gzerror(f, &code);
      throw Error(fmt::format("{}: read error after line {}: {}", path, out.size(), msg));
    }
    // A .gz cut short reads like a shorter file unless the end of the stream is checked: zlib
    // reports a truncated stream as Z_BUF_ERROR ("unexpected end of file") once reading stops.
    int code = Z_OK;
    std::string msg = gzerror(f, &code);
    TP_CHECK(code == Z_OK || code == Z_STREAM_END, "{}: the compressed file is truncated or damaged after line {}: {}",
             path, out.size(), msg);
    if (!line.empty()) finish_line(line, out, path);
  } catch (...) {
    gzclose(f);
    throw;
  }
  gzclose(f);
  return out;
}

std::vector<std::string> read_lines(std::istream& in, const std::string& name) {
  std::vector<std::string> out;
  std::string line;
  bool any = false;  // a last line without '\n' still counts
  for (std::istreambuf_iterator<char> it(in), end; it != end; ++it) {
    any = true;
    if (*it == '\n') {
      finish_line(line, out, name);
      any = false;
    } else {
      line.push_back(*it);
      if (line.size() > kMaxLineBytes) throw line_too_long(out, name);
    }
  }
  if (any) finish_line(line, out, name);
  return out;
}

}  // namespace tapestry::apps
