// libFuzzer target: sacreBLEU-compatible BLEU (apps/eval/bleu.h).
// The input is split at its first 0 byte into reference text and hypothesis text (no 0 byte: the
// hypothesis text is empty), each split into lines as read_lines does ('\n', a trailing '\r'
// dropped, a last unterminated line kept). Every line goes through tokenize_13a; corpus_bleu
// scores the pair when the line counts match and must refuse (tapestry::Error) when they do not.
// Checked: the score is finite and within [0, 100], and so are the precisions; BP is in [0, 1];
// the n-gram and length counts agree with the tokenizer; a corpus scored against itself gets 100
// whenever it has any 4-gram (0 when it has none: 'exp' smoothing stops at the first empty order).
// Any failed check aborts.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "apps/eval/bleu.h"
#include "tapestry/ops/error.h"

namespace {

using tapestry::apps::BleuScore;

// exp(log(100)) is 100.00000000000004 in IEEE doubles: a perfect score lands a few ulps above 100
// (sacreBLEU reports the same). Anything further out is a bug.
constexpr double kSlack = 1e-9;

[[noreturn]] void fail(const std::string& what) { tapestry_fuzz::fail("fuzz_bleu", what); }

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::string line;
  auto finish = [&] {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(line);
    line.clear();
  };
  for (char c : text) {
    if (c == '\n') finish();
    else line.push_back(c);
  }
  if (!line.empty()) finish();
  return lines;
}

int64_t token_count(const std::vector<std::string>& lines) {
  int64_t n = 0;
  for (const auto& line : lines) {
    auto tokens = tapestry::apps::tokenize_13a(line);
    for (const auto& t : tokens) {
      if (t.empty()) fail("tokenize_13a gave an empty token");
      for (char c : t)
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') fail("tokenize_13a gave a token with whitespace: '" + t + "'");
    }
    n += static_cast<int64_t>(tokens.size());
  }
  return n;
}

void check_score(const char* what, const BleuScore& s, int64_t hyp_len, int64_t ref_len) {
  auto bad = [&](const std::string& why) { fail(std::string(what) + ": " + why + " (" + s.format() + ")"); };
  if (!std::isfinite(s.score) || s.score < 0 || s.score > 100 + kSlack) bad("score outside [0, 100]");
  for (int n = 0; n < 4; ++n) {
    if (!std::isfinite(s.precisions[n]) || s.precisions[n] < 0 || s.precisions[n] > 100)
      bad("precision " + std::to_string(n + 1) + " outside [0, 100]");
    if (s.correct[n] < 0 || s.correct[n] > s.total[n]) bad("more correct " + std::to_string(n + 1) + "-grams than total");
    // A sentence of L tokens has max(0, L - n) (n+1)-grams, so the total is at most hyp_len.
    if (s.total[n] < 0 || s.total[n] > hyp_len) bad("n-gram total exceeds the hypothesis length");
  }
  if (s.total[0] != hyp_len) bad("unigram total differs from the hypothesis length");
  if (!std::isfinite(s.bp) || s.bp < 0 || s.bp > 1) bad("brevity penalty outside [0, 1]");
  if (!std::isfinite(s.ratio) || s.ratio < 0) bad("ratio not finite and non-negative");
  if (s.hyp_len != hyp_len || s.ref_len != ref_len)
    bad("lengths differ from tokenize_13a's: hyp " + std::to_string(hyp_len) + ", ref " + std::to_string(ref_len));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t zero = input.find('\0');
  const std::string ref_text = input.substr(0, zero);
  const std::string hyp_text = zero == std::string::npos ? std::string() : input.substr(zero + 1);
  const std::vector<std::string> refs = split_lines(ref_text), hyps = split_lines(hyp_text);
  const int64_t ref_len = token_count(refs), hyp_len = token_count(hyps);

  if (refs.size() != hyps.size()) {
    bool refused = false;
    try {
      tapestry::apps::corpus_bleu(hyps, refs);
    } catch (const tapestry::Error&) {
      refused = true;
    }
    if (!refused)
      fail("corpus_bleu accepted " + std::to_string(hyps.size()) + " hypotheses for " + std::to_string(refs.size()) +
           " references");
  } else {
    check_score("hyp vs ref", tapestry::apps::corpus_bleu(hyps, refs), hyp_len, ref_len);
  }

  // The references against themselves: every n-gram matches.
  BleuScore self = tapestry::apps::corpus_bleu(refs, refs);
  check_score("ref vs ref", self, ref_len, ref_len);
  for (int n = 0; n < 4; ++n)
    if (self.correct[n] != self.total[n]) fail("ref vs ref: not every n-gram matched (" + self.format() + ")");
  if (self.bp != 1) fail("ref vs ref: brevity penalty " + std::to_string(self.bp) + ", expected 1");
  const double expected = self.total[3] > 0 ? 100.0 : 0.0;
  if (std::fabs(self.score - expected) > kSlack)
    fail("ref vs ref: score " + std::to_string(self.score) + ", expected " + std::to_string(expected));
  return 0;
}
