// sacreBLEU-compatible corpus BLEU (see bleu.h). The tokenizer mirrors sacreBLEU's regular
// expressions rule by rule, including their left-to-right, non-overlapping matching.
#include "apps/eval/bleu.h"

#include <fmt/format.h>

#include <cmath>
#include <map>

#include "tapestry/ops/error.h"

namespace tapestry::apps {

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// [\{-\~\[-\` -\&\(-\+\:-\@\/]: the symbols 13a pads with spaces (not ' - . , or letters).
bool is_13a_symbol(char c) {
  unsigned char u = static_cast<unsigned char>(c);
  return (u >= '{' && u <= '~') || (u >= '[' && u <= '`') || (u >= ' ' && u <= '&') || (u >= '(' && u <= '+') ||
         (u >= ':' && u <= '@') || u == '/';
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t pos = 0; (pos = s.find(from, pos)) != std::string::npos; pos += to.size()) s.replace(pos, from.size(), to);
}

// Python's str.split() on the ASCII whitespace that can occur here.
std::vector<std::string> split_ws(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    bool ws = c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f' || (u >= 0x1c && u <= 0x1f);
    if (ws) {
      if (!cur.empty()) out.push_back(std::move(cur));
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  if (!cur.empty()) out.push_back(std::move(cur));
  return out;
}

}  // namespace

std::vector<std::string> tokenize_13a(const std::string& input) {
  std::string line = input;
  replace_all(line, "<skipped>", "");
  replace_all(line, "-\n", "");
  replace_all(line, "\n", " ");
  if (line.find('&') != std::string::npos) {
    replace_all(line, "&quot;", "\"");
    replace_all(line, "&amp;", "&");
    replace_all(line, "&lt;", "<");
    replace_all(line, "&gt;", ">");
  }
  line = " " + line + " ";
  // 1. ([\{-\~\[-\` -\&\(-\+\:-\@\/]) -> " \1 "
  std::string a;
  for (char c : line) {
    if (is_13a_symbol(c)) {
      a += ' ';
      a += c;
      a += ' ';
    } else {
      a += c;
    }
  }
  // 2. ([^0-9])([\.,]) -> "\1 \2 "
  std::string b;
  for (size_t i = 0; i < a.size();) {
    if (i + 1 < a.size() && !is_digit(a[i]) && (a[i + 1] == '.' || a[i + 1] == ',')) {
      b += a[i];
      b += ' ';
      b += a[i + 1];
      b += ' ';
      i += 2;
    } else {
      b += a[i++];
    }
  }
  // 3. ([\.,])([^0-9]) -> " \1 \2"
  std::string c;
  for (size_t i = 0; i < b.size();) {
    if (i + 1 < b.size() && (b[i] == '.' || b[i] == ',') && !is_digit(b[i + 1])) {
      c += ' ';
      c += b[i];
      c += ' ';
      c += b[i + 1];
      i += 2;
    } else {
      c += b[i++];
    }
  }
  // 4. ([0-9])(-) -> "\1 \2 "
  std::string d;
  for (size_t i = 0; i < c.size();) {
    if (i + 1 < c.size() && is_digit(c[i]) && c[i + 1] == '-') {
      d += c[i];
      d += " - ";
      i += 2;
    } else {
      d += c[i++];
    }
  }
  return split_ws(d);
}

namespace {
using Ngrams = std::map<std::vector<std::string>, int64_t>;
Ngrams count_ngrams(const std::vector<std::string>& toks, size_t n) {
  Ngrams counts;
  for (size_t i = 0; i + n <= toks.size(); ++i) ++counts[std::vector<std::string>(toks.begin() + i, toks.begin() + i + n)];
  return counts;
}
}  // namespace

BleuScore corpus_bleu(const std::vector<std::string>& hyps, const std::vector<std::string>& refs) {
  TP_CHECK(hyps.size() == refs.size(), "bleu: {} hypotheses but {} references; the files must have as many lines",
           hyps.size(), refs.size());
  BleuScore s;
  for (size_t i = 0; i < hyps.size(); ++i) {
    auto h = tokenize_13a(hyps[i]), r = tokenize_13a(refs[i]);
    s.hyp_len += static_cast<int64_t>(h.size());
    s.ref_len += static_cast<int64_t>(r.size());
    for (size_t n = 1; n <= 4; ++n) {
      Ngrams hc = count_ngrams(h, n), rc = count_ngrams(r, n);
      for (auto& [g, c] : hc) {
        auto it = rc.find(g);
        if (it != rc.end()) s.correct[n - 1] += std::min(c, it->second);
      }
      s.total[n - 1] += h.size() >= n ? static_cast<int64_t>(h.size() - n + 1) : 0;
    }
  }
  // sacreBLEU's compute_bleu with smooth_method='exp' and no effective order.
  double smooth = 1;
  for (int n = 0; n < 4; ++n) {
    if (s.total[n] == 0) break;
    if (s.correct[n] == 0) {
      smooth *= 2;
      s.precisions[n] = 100.0 / (smooth * static_cast<double>(s.total[n]));
    } else {
      s.precisions[n] = 100.0 * static_cast<double>(s.correct[n]) / static_cast<double>(s.total[n]);
    }
  }
  if (s.hyp_len < s.ref_len)
    s.bp = s.hyp_len > 0 ? std::exp(1.0 - static_cast<double>(s.ref_len) / static_cast<double>(s.hyp_len)) : 0.0;
  double log_sum = 0;
  for (double p : s.precisions) log_sum += p == 0.0 ? -9999999999.0 : std::log(p);
  s.score = s.bp * std::exp(log_sum / 4);
  s.ratio = s.ref_len > 0 ? static_cast<double>(s.hyp_len) / static_cast<double>(s.ref_len) : 0.0;
  return s;
}

std::string BleuScore::format() const {
  return fmt::format("BLEU = {:.2f} {:.1f}/{:.1f}/{:.1f}/{:.1f} (BP = {:.3f} ratio = {:.3f} hyp_len = {} ref_len = {})",
                     score, precisions[0], precisions[1], precisions[2], precisions[3], bp, ratio, hyp_len, ref_len);
}

std::string BleuScore::signature() { return "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.3.1"; }

}  // namespace tapestry::apps
