// Parallel corpora (alignment, empty lines, missing files) and token-count batching.
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <set>

#include "apps/data/parallel_corpus.h"
#include "tests/helpers.h"

using namespace tapestry;
using namespace tapestry::testing;

namespace {
std::string make_dir() {
  std::string dir = fmt::format("/tmp/tapestry_test_{}_data", ::getpid());
  ::mkdir(dir.c_str(), 0755);
  return dir;
}
void write(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }
}  // namespace

TEST_CASE("load_parallel reads aligned files and names the file and line of every fault") {
  std::string dir = make_dir();
  write(dir + "/train.de", "ein Hund\nzwei Katzen\n");
  write(dir + "/train.en", "a dog\ntwo cats\n");
  auto c = apps::load_parallel(dir, "train", "de", "en");
  CHECK(c.src == std::vector<std::string>{"ein Hund", "zwei Katzen"});
  CHECK(c.tgt[1] == "two cats");

  write(dir + "/bad.de", "eins\nzwei\ndrei\n");
  write(dir + "/bad.en", "one\ntwo\n");
  CHECK(error_of([&] { apps::load_parallel(dir, "bad", "de", "en"); }) ==
        dir + "/bad.de has 3 lines but " + dir + "/bad.en has 2: the files are not aligned");
  write(dir + "/gap.de", "eins\n\ndrei\n");
  write(dir + "/gap.en", "one\ntwo\nthree\n");
  CHECK(error_of([&] { apps::load_parallel(dir, "gap", "de", "en"); }) ==
        dir + "/gap.de:2: empty line (every line must hold one sentence)");
  CHECK(error_of([&] { apps::load_parallel(dir, "nope", "de", "en"); }).find("/nope.de: missing") !=
        std::string::npos);
  write(dir + "/utf.de", "gut\n\xff\n");
  write(dir + "/utf.en", "good\nbad\n");
  CHECK(error_of([&] { apps::load_parallel(dir, "utf", "de", "en"); }) == dir + "/utf.de:2: invalid UTF-8 at byte 1");
  for (const char* f : {"train.de", "train.en", "bad.de", "bad.en", "gap.de", "gap.en", "utf.de", "utf.en"})
    std::remove((dir + "/" + f).c_str());
  ::rmdir(dir.c_str());

  // The shared Multi30k files, when they are next to the checkout: 29000 / 1014 / 1000 pairs.
  std::string shared = "../../shared/data/multi30k";
  if (std::ifstream(shared + "/val.de.gz").good()) {
    CHECK(apps::load_parallel(shared, "val", "de", "en").src.size() == 1014);
    CHECK(apps::load_parallel(shared, "test_2016_flickr", "de", "en").tgt.size() == 1000);
  }
}

TEST_CASE("TokenBatcher: every pair once per epoch, batches within the token budget, reproducible") {
  Generator gen(3);
  std::vector<std::vector<int64_t>> src, tgt;
  std::vector<int64_t> lens = randint(1, 30, {500}, kInt64, &gen).to_vector<int64_t>();
  for (size_t i = 0; i < lens.size(); ++i) {
    src.emplace_back(static_cast<size_t>(lens[i]), 5);
    tgt.emplace_back(static_cast<size_t>((lens[i] * 7) % 29 + 1), 6);
  }
  apps::TokenBatcher batcher(src, tgt, 256, 0, 1, 2);
  auto plan = batcher.plan(42, 0);
  std::multiset<int64_t> seen;
  for (auto& rows : plan) {
    int64_t width = 0;
    for (int64_t r : rows) {
      seen.insert(r);
      width = std::max<int64_t>(width, std::max<int64_t>(src[r].size(), tgt[r].size() + 1));
    }
    CHECK(width * static_cast<int64_t>(rows.size()) <= 256);
  }
  CHECK(seen.size() == 500);
  CHECK(std::set<int64_t>(seen.begin(), seen.end()).size() == 500);
  CHECK(batcher.plan(42, 0) == plan);
  CHECK(batcher.plan(42, 1) != plan);
  CHECK(plan.size() < 100);  // similar lengths together: far fewer batches than pairs

  apps::TokenBatcher small({{7, 8, 9}, {7}}, {{4, 5}, {3, 3, 3}}, 100, 0, 1, 2);
  auto b = small.make({0, 1});
  CHECK(b.src.sizes() == Shape{2, 3});
  CHECK(b.src.to_vector<int64_t>() == std::vector<int64_t>{7, 8, 9, 7, 0, 0});
  CHECK(b.tgt_in.to_vector<int64_t>() == std::vector<int64_t>{1, 4, 5, 0, 1, 3, 3, 3});
  CHECK(b.tgt_out.to_vector<int64_t>() == std::vector<int64_t>{4, 5, 2, 0, 3, 3, 3, 2});
  CHECK(b.src_tokens == 4);
  CHECK(b.tgt_tokens == 7);
}
