// Corpus BLEU computed as sacreBLEU computes it by default: the 13a tokenizer (mteval-v13a),
// mixed case, n-grams up to 4, 'exp' smoothing, brevity penalty, one reference per sentence.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tapestry::apps {

// sacreBLEU's tokenizer_13a: unescapes &quot; &amp; &lt; &gt;, splits punctuation and symbols
// off, splits period and comma unless between digits, splits a dash after a digit.
std::vector<std::string> tokenize_13a(const std::string& line);

struct BleuScore {
  double score = 0;             // 0..100
  double precisions[4] = {0};   // 0..100, after smoothing
  int64_t correct[4] = {0}, total[4] = {0};
  double bp = 1, ratio = 0;
  int64_t hyp_len = 0, ref_len = 0;
  // "BLEU = 35.12 66.7/42.3/28.1/19.5 (BP = 1.000 ratio = 1.012 hyp_len = 12345 ref_len = 12198)"
  std::string format() const;
  static std::string signature();  // "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:..."
};

// hypotheses[i] is scored against references[i]; the counts must match.
BleuScore corpus_bleu(const std::vector<std::string>& hypotheses, const std::vector<std::string>& references);

}  // namespace tapestry::apps
