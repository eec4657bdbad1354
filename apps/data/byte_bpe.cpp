// Byte-level BPE (see byte_bpe.h).
#include "apps/data/byte_bpe.h"
#include "apps/data/text.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <map>
#include <queue>
#include <unordered_map>

#include "tapestry/ops/error.h"

namespace tapestry::apps {

namespace {

struct CodePointRange {
  uint32_t first, last;
};
#include "apps/data/unicode_classes.inc"

constexpr const char* kFetchHint = "tools/get-gpt2-tokenizer.sh fetches GPT-2's tokenizer files";
// Pre-tokens are words, so a small cache answers almost all of them; it is emptied when full
// rather than grown without bound over a large corpus, and skips the rare long pre-token.
constexpr size_t kMaxCacheEntries = size_t{1} << 17;
constexpr size_t kMaxCachedBytes = 256;
constexpr size_t kNone = static_cast<size_t>(-1);

template <size_t N>
bool in_ranges(const CodePointRange (&ranges)[N], uint32_t cp) {
  const CodePointRange* it =
      std::lower_bound(ranges, ranges + N, cp, [](const CodePointRange& r, uint32_t c) { return r.last < c; });
  return it != ranges + N && it->first <= cp;
}

enum class Cls : uint8_t { kLetter, kNumber, kSpace, kOther };

Cls classify(int32_t cp) {
  if (cp < 0) return Cls::kOther;  // an invalid byte
  if (cp < 0x80) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return Cls::kLetter;
    if (cp >= '0' && cp <= '9') return Cls::kNumber;
    if (cp == ' ' || (cp >= '\t' && cp <= '\r')) return Cls::kSpace;
    return Cls::kOther;
  }
  const auto c = static_cast<uint32_t>(cp);
  if (in_ranges(kLetterRanges, c)) return Cls::kLetter;
  if (in_ranges(kNumberRanges, c)) return Cls::kNumber;
  if (in_ranges(kSpaceRanges, c)) return Cls::kSpace;
  return Cls::kOther;
}

// The end of the pre-token that starts at byte i. The pattern's alternatives are tried in order,
// so: a contraction; else an optional ' ' and a run of letters, of digits or of other characters
// (the ' ' is taken only when such a character follows it); else whitespace, of which a run
// followed by more text gives back its last character to prefix what follows (\s+(?!\S)), unless
// it is a single character (then \s+ takes it).
// The end of a contraction ('s 't 're 've 'm 'll 'd) at byte i, 0 where there is none; with
// fold_case its letters may be upper case too.
size_t contraction_end(const std::string& s, size_t i, bool fold_case) {
  const size_t n = s.size();
  auto letter = [&](size_t k) {
    const char c = s[k];
    return static_cast<char>(fold_case && c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  };
  if (s[i] != '\'' || i + 1 >= n) return 0;
  const char c1 = letter(i + 1);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return i + 2;
  if (i + 2 < n) {
    const char c2 = letter(i + 2);
    if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return i + 3;
  }
  return 0;
}

size_t gpt2_pretoken_end(const std::string& s, size_t i) {
  const size_t n = s.size();
  auto run = [&](size_t k, Cls cls) {
    while (k < n) {
      Utf8Char u = utf8_char_at(s, k);
      if (classify(u.cp) != cls) break;
      k += u.len;
    }
    return k;
  };
  // ASCII bytes never occur inside a multibyte sequence, so they can be tested as bytes.
  const char c = s[i];
  if (const size_t end = contraction_end(s, i, false)) return end;
  if (c == ' ' && i + 1 < n) {
    const Cls next = classify(utf8_char_at(s, i + 1).cp);
    if (next != Cls::kSpace) return run(i + 1, next);
  }
  const Cls cls = classify(utf8_char_at(s, i).cp);
  if (cls != Cls::kSpace) return run(i, cls);
  size_t k = i, last = i;  // last: where the run's last character starts
  while (k < n) {
    Utf8Char u = utf8_char_at(s, k);
    if (classify(u.cp) != Cls::kSpace) break;
    last = k;
    k += u.len;
  }
  if (k == n) return n;
  return last > i ? last : k;
}

// The same for Llama 3's pattern, alternative by alternative: a contraction (ASCII letters of
// any case); an optional character that is not \r, \n, a letter or a digit, then letters; one to
// three digits; an optional ' ', a run of other characters, then any \r and \n; whitespace up to
// its last \r or \n; else whitespace as in GPT-2's pattern.
size_t llama3_pretoken_end(const std::string& s, size_t i) {
  const size_t n = s.size();
  auto run = [&](size_t k, Cls cls, size_t max_chars) {
    for (size_t count = 0; k < n && count < max_chars; ++count) {
      Utf8Char u = utf8_char_at(s, k);
      if (classify(u.cp) != cls) break;
      k += u.len;
    }
    return k;
  };
  const size_t all = static_cast<size_t>(-1);
  const char c = s[i];
  if (const size_t end = contraction_end(s, i, true)) return end;
  const Utf8Char first = utf8_char_at(s, i);
  const Cls cls = classify(first.cp);
  if (cls == Cls::kLetter) return run(i, Cls::kLetter, all);
  if (cls != Cls::kNumber && c != '\r' && c != '\n' && i + first.len < n &&
      classify(utf8_char_at(s, i + first.len).cp) == Cls::kLetter)
    return run(i + first.len, Cls::kLetter, all);
  if (cls == Cls::kNumber) return run(i, Cls::kNumber, 3);
  auto other_then_newlines = [&](size_t k) {
    k = run(k, Cls::kOther, all);
    while (k < n && (s[k] == '\r' || s[k] == '\n')) ++k;
    return k;
  };
  if (c == ' ' && i + 1 < n && classify(utf8_char_at(s, i + 1).cp) == Cls::kOther) return other_then_newlines(i + 1);
  if (cls == Cls::kOther) return other_then_newlines(i);
  // Whitespace: up to the end of its last \r or \n, if it has one.
  size_t k = i, last = i, newline_end = 0;
  while (k < n) {
    Utf8Char u = utf8_char_at(s, k);
    if (classify(u.cp) != Cls::kSpace) break;
    last = k;
    k += u.len;
    if (s[last] == '\r' || s[last] == '\n') newline_end = k;
  }
  if (newline_end > 0) return newline_end;
  if (k == n) return n;
  return last > i ? last : k;
}

// Llama 3's pre-tokenizer regex as tokenizer.json spells it.
constexpr const char* kLlama3Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// GPT-2 spells each byte as one printable code point, so that no token holds a space or a control
// character: the bytes that print (! to ~, ¡ to ¬, ® to ÿ) as themselves, the other 68 as 256,
// 257, ... in byte order. Returns the byte of each code point of that alphabet, -1 elsewhere.
std::array<int, 324> byte_of_code_point() {
  std::array<int, 324> byte_of;
  byte_of.fill(-1);
  int extra = 256;
  for (int b = 0; b < 256; ++b) {
    const bool prints = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    byte_of[prints ? b : extra++] = b;
  }
  return byte_of;
}

std::string quote_text(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// The bytes a token of encoder.json or vocab.bpe stands for; `where` names the file (and line).
std::string token_bytes(const std::string& token, const std::string& where) {
  static const std::array<int, 324> byte_of = byte_of_code_point();
  TP_CHECK(!token.empty(), "{}: empty token", where);
  std::string bytes;
  for (size_t i = 0; i < token.size();) {
    Utf8Char u = utf8_char_at(token, i);
    TP_CHECK(u.cp >= 0 && u.cp < static_cast<int32_t>(byte_of.size()) && byte_of[u.cp] >= 0,
             "{}: token {} has a character outside GPT-2's byte alphabet", where, quote_text(token));
    bytes.push_back(static_cast<char>(byte_of[u.cp]));
    i += u.len;
  }
  return bytes;
}

std::string read_file(const std::string& path, const char* hint = kFetchHint) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  TP_CHECK(f != nullptr, "{}: cannot open: {} ({})", path, std::strerror(errno ? errno : ENOENT), hint);
  std::string bytes;
  char buf[1 << 16];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, f)) > 0) bytes.append(buf, got);
  const bool failed = std::ferror(f) != 0;
  const int err = errno;
  std::fclose(f);
  TP_CHECK(!failed, "{}: cannot read: {}", path, std::strerror(err ? err : EIO));
  TP_CHECK(!bytes.empty(), "{}: empty file ({})", path, hint);
  return bytes;
}

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

}  // namespace

struct ByteLevelBPE::Impl {
  struct Merge {
    int32_t rank, id;  // id: the token the pair becomes
  };
  std::vector<std::string> bytes_of;  // id -> bytes
  std::array<int32_t, 256> byte_id{};
  std::unordered_map<uint64_t, Merge> merges;  // pair_key(left id, right id) -> merge
  std::unordered_map<std::string, int32_t> id_of;  // bytes (or an added token's text) -> id
  int32_t eot = -1;
  bool llama3_pattern = false;  // else GPT-2's
  bool ignore_merges = false;   // a pre-token in the vocabulary is taken whole

  mutable std::mutex mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

  // byte_id and eot from id_of; `where` names the file for the error.
  void index_bytes(const std::string& where) {
    for (int b = 0; b < 256; ++b) {
      auto it = id_of.find(std::string(1, static_cast<char>(b)));
      TP_CHECK(it != id_of.end(), "{}: no token for byte {} (byte-level BPE needs all 256)", where, b);
      byte_id[static_cast<size_t>(b)] = it->second;
    }
    auto eot_it = id_of.find("<|endoftext|>");
    eot = eot_it == id_of.end() ? -1 : eot_it->second;
  }

  void bpe(const char* p, size_t n, std::vector<int32_t>& out) const;
  void append(const char* p, size_t n, std::vector<int64_t>& out) const;
};

// Byte-level BPE of one pre-token. The reference merges, round after round, every occurrence
// (left to right) of the pair of lowest rank; a heap of adjacent pairs ordered by (rank, position)
// over a linked list of symbols does the same in O(n log n) instead of O(n^2), because load_gpt2()
// checked that a merge's result only ever takes part in merges of higher rank, so no merge can
// create a pair that outranks the one being applied. For tokenizer.json the heap is itself the
// reference: Hugging Face's BPE merges by (rank, position) from a priority queue the same way.
void ByteLevelBPE::Impl::bpe(const char* p, size_t n, std::vector<int32_t>& out) const {
  std::vector<int32_t> id(n);
  std::vector<size_t> next(n), prev(n);
  std::vector<char> dead(n, 0);
  for (size_t i = 0; i < n; ++i) {
    id[i] = byte_id[static_cast<unsigned char>(p[i])];
    next[i] = i + 1 < n ? i + 1 : kNone;
    prev[i] = i > 0 ? i - 1 : kNone;
  }
  struct Cand {
    int32_t rank;
    size_t left;
    int32_t a, b, merged;
  };
  auto later = [](const Cand& x, const Cand& y) { return x.rank != y.rank ? x.rank > y.rank : x.left > y.left; };
  std::priority_queue<Cand, std::vector<Cand>, decltype(later)> heap(later);
  auto push = [&](size_t i) {
    const size_t j = next[i];
    if (j == kNone) return;
    auto it = merges.find(pair_key(id[i], id[j]));
    if (it != merges.end()) heap.push({it->second.rank, i, id[i], id[j], it->second.id});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    const size_t j = next[c.left];
    // stale: the left symbol was merged away, or one side has changed since the push
    if (dead[c.left] || j == kNone || id[c.left] != c.a || id[j] != c.b) continue;
    id[c.left] = c.merged;
    dead[j] = 1;
    next[c.left] = next[j];
    if (next[j] != kNone) prev[next[j]] = c.left;
    if (prev[c.left] != kNone) push(prev[c.left]);
    push(c.left);
  }
  for (size_t i = 0; i != kNone; i = next[i]) out.push_back(id[i]);
}

void ByteLevelBPE::Impl::append(const char* p, size_t n, std::vector<int64_t>& out) const {
  if (n == 1) {
    out.push_back(byte_id[static_cast<unsigned char>(p[0])]);
    return;
  }
  std::string key(p, n);
  if (ignore_merges) {
    auto whole = id_of.find(key);
    if (whole != id_of.end()) {
      out.push_back(whole->second);
      return;
    }
  }
  std::vector<int32_t> ids;
  if (n > kMaxCachedBytes) {
    bpe(p, n, ids);
  } else {
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = cache.find(key);
      if (it != cache.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    bpe(p, n, ids);
    std::lock_guard<std::mutex> lock(mu);
    if (cache.size() >= kMaxCacheEntries) cache.clear();
    cache.emplace(std::move(key), ids);
  }
  out.insert(out.end(), ids.begin(), ids.end());
}

ByteLevelBPE::ByteLevelBPE(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

ByteLevelBPE ByteLevelBPE::load_gpt2(const std::string& dir) {
  const std::string base = dir.empty() || dir.back() == '/' ? dir : dir + "/";
  const std::string enc_path = base + "encoder.json", bpe_path = base + "vocab.bpe";
  auto impl = std::make_shared<Impl>();

  // encoder.json: {"token": id, ...} with the ids 0..N-1, each once.
  const std::string enc_text = read_file(enc_path);
  nlohmann::json enc;
  try {
    enc = nlohmann::json::parse(enc_text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: not valid JSON: {} ({})", enc_path, e.what(), kFetchHint));
  }
  TP_CHECK(enc.is_object() && !enc.empty(), "{}: expected a JSON object of token -> id", enc_path);
  const auto n = static_cast<int64_t>(enc.size());
  impl->bytes_of.assign(static_cast<size_t>(n), std::string());
  std::vector<char> seen(static_cast<size_t>(n), 0);
  std::unordered_map<std::string, int32_t>& id_of = impl->id_of;
  id_of.reserve(static_cast<size_t>(n));
  for (auto it = enc.begin(); it != enc.end(); ++it) {
    const nlohmann::json& v = it.value();
    TP_CHECK(v.is_number_integer(), "{}: token {} has id {}, not an integer", enc_path, quote_text(it.key()), v.dump());
    const auto id = v.get<int64_t>();
    TP_CHECK(id >= 0 && id < n && !seen[static_cast<size_t>(id)],
             "{}: token {} has id {}: the ids must be 0..{}, each once", enc_path, quote_text(it.key()), id, n - 1);
    seen[static_cast<size_t>(id)] = 1;
    std::string bytes = token_bytes(it.key(), enc_path);
    impl->bytes_of[static_cast<size_t>(id)] = bytes;
    id_of.emplace(std::move(bytes), static_cast<int32_t>(id));
  }
  impl->index_bytes(enc_path);
  TP_CHECK(impl->eot >= 0, "{}: no \"<|endoftext|>\" token", enc_path);

  // vocab.bpe: a "#version" line, then one merge "left right" a line, best first.
  const std::string bpe_text = read_file(bpe_path);
  struct Line {
    int32_t left, right, merged;
    size_t line;
  };
  std::vector<Line> lines;
  std::vector<int32_t> made_at(static_cast<size_t>(n), -1);  // id -> the rank of the merge that makes it
  impl->merges.reserve(static_cast<size_t>(n));
  size_t line_no = 0;
  for (size_t pos = 0; pos < bpe_text.size();) {
    size_t end = bpe_text.find('\n', pos);
    if (end == std::string::npos) end = bpe_text.size();
    std::string line = bpe_text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    const std::string where = fmt::format("{}:{}", bpe_path, line_no);
    const size_t space = line.find(' ');
    TP_CHECK(space != std::string::npos && space > 0 && space + 1 < line.size() &&
                 line.find(' ', space + 1) == std::string::npos,
             "{}: expected two tokens separated by one space, found {}", where, quote_text(line));
    const std::string left = token_bytes(line.substr(0, space), where);
    const std::string right = token_bytes(line.substr(space + 1), where);
    auto l = id_of.find(left), r = id_of.find(right), m = id_of.find(left + right);
    TP_CHECK(l != id_of.end() && r != id_of.end() && m != id_of.end(),
             "{}: the merge {} makes or uses a token that {} does not have", where, quote_text(line), enc_path);
    const auto rank = static_cast<int32_t>(lines.size());
    TP_CHECK(impl->merges.emplace(pair_key(l->second, r->second), Impl::Merge{rank, m->second}).second,
             "{}: the merge {} is listed twice", where, quote_text(line));
    TP_CHECK(made_at[static_cast<size_t>(m->second)] < 0, "{}: the merge {} makes a token another merge makes", where,
             quote_text(line));
    made_at[static_cast<size_t>(m->second)] = rank;
    lines.push_back({l->second, r->second, m->second, line_no});
  }
  // The heap in bpe() relies on this order; GPT-2's merges keep it.
  for (size_t rank = 0; rank < lines.size(); ++rank) {
    for (int32_t part : {lines[rank].left, lines[rank].right})
      TP_CHECK(made_at[static_cast<size_t>(part)] < static_cast<int32_t>(rank),
               "{}:{}: the merge uses a token that only a later merge makes", bpe_path, lines[rank].line);
  }
  // A torn vocab.bpe still parses: every token but the bytes and <|endoftext|> needs its merge.
  for (int64_t id = 0; id < n; ++id) {
    const std::string& bytes = impl->bytes_of[static_cast<size_t>(id)];
    TP_CHECK(bytes.size() == 1 || id == impl->eot || made_at[static_cast<size_t>(id)] >= 0,
             "{}: no merge makes token {} ({}) of {}; {} merges read (a truncated file? {})", bpe_path, id,
             quote_text(bytes), enc_path, lines.size(), kFetchHint);
  }
  return ByteLevelBPE(std::move(impl));
}

ByteLevelBPE ByteLevelBPE::load_tokenizer_json(const std::string& path) {
  constexpr const char* hint = "a Hugging Face tokenizer.json";
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path, hint));
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: not valid JSON: {}", path, e.what()));
  }
  auto impl = std::make_shared<Impl>();
  TP_CHECK(j.is_object() && j.contains("model") && j.at("model").is_object(), "{}: no \"model\" object", path);
  const nlohmann::json& model = j.at("model");
  const std::string type = model.value("type", std::string("BPE"));
  TP_CHECK(type == "BPE", "{}: model type '{}' is not byte-level BPE (a SentencePiece tokenizer.model reads "
           "through sentencepiece instead)", path, type);
  auto unset = [&](const char* key) {
    return !model.contains(key) || model.at(key).is_null() || model.at(key) == false || model.at(key) == "";
  };
  for (const char* key : {"dropout", "continuing_subword_prefix", "end_of_word_suffix", "byte_fallback"})
    TP_CHECK(unset(key), "{}: model.{} = {} is not supported", path, key, model.at(key).dump());
  TP_CHECK(!j.contains("normalizer") || j.at("normalizer").is_null(), "{}: normalizer {} is not supported", path,
           j.contains("normalizer") ? j.at("normalizer").dump() : "");
  impl->ignore_merges = model.value("ignore_merges", false);

  // The pre-tokenizer: ByteLevel with GPT-2's regex, or Llama 3's Split then ByteLevel without one.
  const nlohmann::json pre = j.value("pre_tokenizer", nlohmann::json());
  auto byte_level = [](const nlohmann::json& p, bool regex) {
    return p.is_object() && p.value("type", "") == "ByteLevel" && !p.value("add_prefix_space", false) &&
           p.value("use_regex", true) == regex;
  };
  if (byte_level(pre, true)) {
    impl->llama3_pattern = false;
  } else if (pre.is_object() && pre.value("type", "") == "Sequence" && pre.contains("pretokenizers") &&
             pre.at("pretokenizers").size() == 2 && byte_level(pre.at("pretokenizers")[1], false) &&
             pre.at("pretokenizers")[0].value("type", "") == "Split" &&
             pre.at("pretokenizers")[0].value("pattern", nlohmann::json()).value("Regex", "") == kLlama3Pattern &&
             pre.at("pretokenizers")[0].value("behavior", "") == "Isolated" &&
             !pre.at("pretokenizers")[0].value("invert", false)) {
    impl->llama3_pattern = true;
  } else {
    throw Error(fmt::format("{}: pre_tokenizer {} is not supported (ByteLevel with GPT-2's pattern, or Llama 3's "
                            "Split then ByteLevel)", path, pre.dump().substr(0, 300)));
  }

  // The vocabulary, then the added tokens (their text as they stand), the ids dense from 0.
  TP_CHECK(model.contains("vocab") && model.at("vocab").is_object() && !model.at("vocab").empty(),
           "{}: no model.vocab object", path);
  std::map<int64_t, std::string> by_id;
  for (auto it = model.at("vocab").begin(); it != model.at("vocab").end(); ++it) {
    TP_CHECK(it.value().is_number_integer() && it.value().get<int64_t>() >= 0, "{}: model.vocab: token {} has id {}",
             path, quote_text(it.key()), it.value().dump());
    TP_CHECK(by_id.emplace(it.value().get<int64_t>(), token_bytes(it.key(), path + ": model.vocab")).second,
             "{}: model.vocab: id {} is given twice", path, it.value().get<int64_t>());
  }
  if (j.contains("added_tokens") && j.at("added_tokens").is_array())
    for (const nlohmann::json& t : j.at("added_tokens")) {
      TP_CHECK(t.is_object() && t.contains("id") && t.at("id").is_number_integer() && t.contains("content") &&
                   t.at("content").is_string(),
               "{}: added_tokens: expected {{\"id\": N, \"content\": \"...\"}}, got {}", path, t.dump());
      const int64_t id = t.at("id").get<int64_t>();
      const std::string content = t.at("content").get<std::string>();
      auto [it, fresh] = by_id.emplace(id, content);
      TP_CHECK(fresh || it->second == content, "{}: added token {} has id {}, which the vocabulary gives to {}", path,
               quote_text(content), id, quote_text(it->second));
    }
  const auto n = static_cast<int64_t>(by_id.size());
  TP_CHECK(by_id.begin()->first == 0 && by_id.rbegin()->first == n - 1,
           "{}: the ids of the vocabulary and the added tokens must be 0..{} without gaps, got {}..{}", path, n - 1,
           by_id.begin()->first, by_id.rbegin()->first);
  for (auto& [id, bytes] : by_id) {
    impl->bytes_of.push_back(bytes);
    impl->id_of.emplace(bytes, static_cast<int32_t>(id));
  }
  impl->index_bytes(path);

  // The merges, best first: "left right" strings, or [left, right] pairs (tokenizers >= 0.20).
  TP_CHECK(model.contains("merges") && model.at("merges").is_array(), "{}: no model.merges array", path);
  const nlohmann::json& merges = model.at("merges");
  impl->merges.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const nlohmann::json& m = merges[rank];
    std::string left, right;
    if (m.is_string()) {
      const std::string line = m.get<std::string>();
      const size_t space = line.find(' ');
      TP_CHECK(space != std::string::npos && space > 0 && space + 1 < line.size() &&
                   line.find(' ', space + 1) == std::string::npos,
               "{}: model.merges[{}]: expected two tokens separated by one space, found {}", path, rank,
               quote_text(line));
      left = line.substr(0, space), right = line.substr(space + 1);
    } else {
      TP_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
               "{}: model.merges[{}]: expected \"a b\" or [\"a\", \"b\"], found {}", path, rank, m.dump());
      left = m[0].get<std::string>(), right = m[1].get<std::string>();
    }
    const std::string where = fmt::format("{}: model.merges[{}]", path, rank);
    const std::string lb = token_bytes(left, where), rb = token_bytes(right, where);
    auto l = impl->id_of.find(lb), r = impl->id_of.find(rb), made = impl->id_of.find(lb + rb);
    TP_CHECK(l != impl->id_of.end() && r != impl->id_of.end() && made != impl->id_of.end(),
             "{}: the merge {} {} makes or uses a token that model.vocab does not have", where, quote_text(left),
             quote_text(right));
    // Hugging Face keeps the first rank of a pair listed twice.
    impl->merges.emplace(pair_key(l->second, r->second), Impl::Merge{static_cast<int32_t>(rank), made->second});
  }
  return ByteLevelBPE(std::move(impl));
}

std::vector<int64_t> ByteLevelBPE::encode(const std::string& utf8) const {
  std::vector<int64_t> out;
  out.reserve(utf8.size() / 3 + 1);
  for (size_t i = 0; i < utf8.size();) {
    const size_t end = impl_->llama3_pattern ? llama3_pretoken_end(utf8, i) : gpt2_pretoken_end(utf8, i);
    impl_->append(utf8.data() + i, end - i, out);
    i = end;
  }
  return out;
}

std::string ByteLevelBPE::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  const int64_t n = vocab_size();
  for (int64_t id : ids) {
    TP_CHECK(id >= 0 && id < n, "gpt2 decode: id {} is out of range [0, {})", id, n);
    out += impl_->bytes_of[static_cast<size_t>(id)];
  }
  return out;
}

int64_t ByteLevelBPE::vocab_size() const { return static_cast<int64_t>(impl_->bytes_of.size()); }

int64_t ByteLevelBPE::eot() const { return impl_->eot; }

int64_t ByteLevelBPE::token_id(const std::string& text) const {
  auto it = impl_->id_of.find(text);
  return it == impl_->id_of.end() ? -1 : it->second;
}

}  // namespace tapestry::apps
