// BLEU as sacreBLEU computes it by default, on corpora small enough to count by hand, and the
// 13a tokenizer rule by rule. Expected values are worked out in the comments.
#include <cmath>
#include <fstream>

#include <unistd.h>

#include "apps/eval/bleu.h"
#include "apps/data/text.h"
#include "tests/helpers.h"

using namespace tapestry;
using namespace tapestry::testing;
using apps::corpus_bleu;
using apps::tokenize_13a;
using Toks = std::vector<std::string>;

TEST_CASE("13a tokenizer splits what mteval-v13a splits") {
  CHECK(tokenize_13a("Hello, world.") == Toks{"Hello", ",", "world", "."});
  // period and comma between digits stay: 3.14, 1,000
  CHECK(tokenize_13a("3.14 and 1,000") == Toks{"3.14", "and", "1,000"});
  // after a non-digit: split; before a non-digit: split
  CHECK(tokenize_13a("end.5") == Toks{"end", ".", "5"});
  CHECK(tokenize_13a("5.x") == Toks{"5", ".", "x"});
  // a dash after a digit splits; other dashes and apostrophes stay
  CHECK(tokenize_13a("a 10-year-old's toy") == Toks{"a", "10", "-", "year-old's", "toy"});
  // HTML entities are unescaped, then the symbols are padded
  CHECK(tokenize_13a("&quot;Hi&quot; &amp; bye") == Toks{"\"", "Hi", "\"", "&", "bye"});
  CHECK(tokenize_13a("$5/hour (approx.)") == Toks{"$", "5", "/", "hour", "(", "approx", ".", ")"});
  CHECK(tokenize_13a("  a \t b  ") == Toks{"a", "b"});
  CHECK(tokenize_13a("Straße, café.") == Toks{"Straße", ",", "café", "."});
  // matches do not overlap: in "a.," the period is taken with the a, so the comma is split by rule 3
  CHECK(tokenize_13a("a.,b") == Toks{"a", ".", ",", "b"});
  CHECK(tokenize_13a("").empty());
}

TEST_CASE("BLEU of identical corpora is 100") {
  auto s = corpus_bleu({"The cat sat on the mat."}, {"The cat sat on the mat."});
  CHECK(s.score == doctest::Approx(100.0));
  CHECK(s.bp == 1.0);
  CHECK(s.hyp_len == 7);
  CHECK(s.format() == "BLEU = 100.00 100.0/100.0/100.0/100.0 (BP = 1.000 ratio = 1.000 hyp_len = 7 ref_len = 7)");
}

TEST_CASE("BLEU by hand: partial matches") {
  // hyp: the cat sat on a mat / ref: the cat sat on the mat (6 tokens each, BP 1)
  // 1-grams: the cat sat on mat match, a does not: 5/6
  // 2-grams: the cat, cat sat, sat on match; on a, a mat do not: 3/5
  // 3-grams: the cat sat, cat sat on: 2/4; 4-grams: the cat sat on: 1/3
  // BLEU = 100 * (5/6 * 3/5 * 2/4 * 1/3)^(1/4) = 100 * (1/12)^(1/4) = 53.728...
  auto s = corpus_bleu({"the cat sat on a mat"}, {"the cat sat on the mat"});
  CHECK(s.correct[0] == 5);
  CHECK(s.total[1] == 5);
  CHECK(s.score == doctest::Approx(100 * std::pow(1.0 / 12, 0.25)));
  CHECK(s.format() == "BLEU = 53.73 83.3/60.0/50.0/33.3 (BP = 1.000 ratio = 1.000 hyp_len = 6 ref_len = 6)");
}

TEST_CASE("BLEU by hand: zero matches use the exp smoothing") {
  // 4 tokens, nothing matches: totals 4, 3, 2, 1. 'exp' smoothing gives the n-th zero order
  // 100 / (2^k * total), k counting the zero orders so far: 12.5, 8.333, 6.25, 6.25.
  // BLEU = (12.5 * 8.333.. * 6.25 * 6.25)^(1/4) = 7.98...
  auto s = corpus_bleu({"a b c d"}, {"e f g h"});
  CHECK(s.precisions[0] == doctest::Approx(12.5));
  CHECK(s.precisions[1] == doctest::Approx(100.0 / 12));
  CHECK(s.precisions[3] == doctest::Approx(6.25));
  CHECK(s.score == doctest::Approx(std::pow(12.5 * (100.0 / 12) * 6.25 * 6.25, 0.25)));
}

TEST_CASE("BLEU by hand: short hypotheses, brevity penalty and missing orders") {
  // hyp "the cat" (2 tokens) vs a 6-token ref: p1 = 2/2, p2 = 1/1, no 3- or 4-grams at all, so
  // those precisions stay 0 (log taken as -9999999999) and BLEU is 0; BP = exp(1 - 6/2).
  auto s = corpus_bleu({"the cat"}, {"the cat sat on the mat"});
  CHECK(s.score == 0.0);
  CHECK(s.bp == doctest::Approx(std::exp(-2.0)));
  CHECK(s.format() == "BLEU = 0.00 100.0/100.0/0.0/0.0 (BP = 0.135 ratio = 0.333 hyp_len = 2 ref_len = 6)");
  // Over a corpus the counts add up first: the second sentence supplies the longer n-grams.
  // sentence 1 as above; sentence 2 identical 5 tokens "a b c d e".
  // correct/total: 1-grams 2+5 / 2+5, 2-grams 1+4 / 1+4, 3-grams 0+3 / 0+3, 4-grams 0+2 / 0+2
  // all precisions 100; BP = exp(1 - 11/7)
  auto c = corpus_bleu({"the cat", "a b c d e"}, {"the cat sat on the mat", "a b c d e"});
  CHECK(c.score == doctest::Approx(100 * std::exp(1 - 11.0 / 7)));
  CHECK(c.hyp_len == 7);
  CHECK(c.ref_len == 11);
}

TEST_CASE("BLEU: punctuation and digits the 13a rules split or keep") {
  // The hypothesis is written without spaces around punctuation, the reference with them; 13a
  // makes them the same tokens except for the price, which it keeps whole (5.50) in both.
  auto s = corpus_bleu({"It costs $5.50, ok."}, {"It costs $ 5.50 , ok ."});
  CHECK(s.score == doctest::Approx(100.0));
  CHECK(s.hyp_len == 7);
  // "1,000" stays one token, while "1, 000" is three (1 , 000): hyp {1,000 people} against ref
  // {1 , 000 people} matches only "people" among the 2 hypothesis 1-grams.
  auto d = corpus_bleu({"1,000 people"}, {"1, 000 people"});
  CHECK(d.correct[0] == 1);
  CHECK(d.total[0] == 2);
  CHECK(d.ref_len == 4);
  CHECK(error_of([] { corpus_bleu({"a"}, {"a", "b"}); }).find("bleu: 1 hypotheses but 2 references") !=
        std::string::npos);
}

TEST_CASE("reading corpora: plain and gz, and clear errors for bad UTF-8 and missing files") {
  std::string path = fmt::format("/tmp/tapestry_test_{}_text.txt", ::getpid());
  {
    std::ofstream f(path, std::ios::binary);
    f << "eins\r\nzwei\n\ndrei";
  }
  CHECK(apps::read_lines(path) == Toks{"eins", "zwei", "", "drei"});
  {
    std::ofstream f(path, std::ios::binary);
    f << "gut\nschl\xc3\n";
  }
  CHECK(error_of([&] { apps::read_lines(path); }) == path + ":2: invalid UTF-8 at byte 5");
  CHECK(error_of([] { apps::read_lines("/nonexistent/corpus.de.gz"); }).find("/nonexistent/corpus.de.gz: cannot open") !=
        std::string::npos);
  CHECK(apps::invalid_utf8_at("\xed\xa0\x80") == 0);  // a surrogate
  CHECK(apps::invalid_utf8_at("\xc0\xaf") == 0);      // overlong
  CHECK(apps::invalid_utf8_at("Grüße") == -1);
  std::remove(path.c_str());
  // The shared Multi30k test set, when present next to the checkout, reads as 1000 lines.
  std::string test_de = "../../shared/data/multi30k/test_2016_flickr.de.gz";
  if (std::ifstream(test_de).good()) CHECK(apps::read_lines(test_de).size() == 1000);
}
