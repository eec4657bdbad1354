// Parallel corpora and token-count batching (see data.h).
#include "apps/data/parallel_corpus.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <random>

#include "apps/data/text.h"
#include "tapestry/ops/factory.h"

namespace tapestry::apps {

std::string default_data_dir() {
  const char* env = std::getenv("TAPESTRY_DATA");
  return env && *env ? env : "../shared/data/multi30k";
}

namespace {
std::string find_file(const std::string& dir, const std::string& name) {
  for (const std::string& candidate : {dir + "/" + name + ".gz", dir + "/" + name})
    if (std::ifstream(candidate).good()) return candidate;
  throw Error(fmt::format("{}/{}: missing (looked for {}.gz and {}; set --data DIR or TAPESTRY_DATA)", dir, name, name,
                          name));
}

std::vector<std::string> read_nonempty(const std::string& path) {
  std::vector<std::string> lines = read_lines(path);
  for (size_t i = 0; i < lines.size(); ++i) {
    bool blank = lines[i].find_first_not_of(" \t") == std::string::npos;
    TP_CHECK(!blank, "{}:{}: empty line (every line must hold one sentence)", path, i + 1);
  }
  return lines;
}
}  // namespace

ParallelCorpus load_parallel(const std::string& dir, const std::string& split, const std::string& src_lang,
                             const std::string& tgt_lang) {
  std::string src_path = find_file(dir, split + "." + src_lang), tgt_path = find_file(dir, split + "." + tgt_lang);
  ParallelCorpus c{read_nonempty(src_path), read_nonempty(tgt_path), src_path, tgt_path};
  TP_CHECK(c.src.size() == c.tgt.size(), "{} has {} lines but {} has {}: the files are not aligned", src_path,
           c.src.size(), tgt_path, c.tgt.size());
  TP_CHECK(!c.src.empty(), "{}: no sentences", src_path);
  return c;
}

TokenBatcher::TokenBatcher(std::vector<std::vector<int64_t>> src, std::vector<std::vector<int64_t>> tgt,
                           int64_t max_tokens, int64_t pad, int64_t bos, int64_t eos)
    : src_(std::move(src)), tgt_(std::move(tgt)), max_tokens_(max_tokens), pad_(pad), bos_(bos), eos_(eos) {
  TP_CHECK(src_.size() == tgt_.size(), "TokenBatcher: {} source and {} target sentences", src_.size(), tgt_.size());
  TP_CHECK(max_tokens_ > 0, "TokenBatcher: max_tokens must be positive, got {}", max_tokens_);
}

std::vector<std::vector<int64_t>> TokenBatcher::plan(uint64_t seed, int64_t epoch) const {
  std::mt19937_64 rng(seed * 1000003ULL + static_cast<uint64_t>(epoch));
  std::vector<int64_t> order(src_.size());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);  // random ties in the sort below
  auto width = [&](int64_t i) {
    return std::max<int64_t>(static_cast<int64_t>(src_[i].size()), static_cast<int64_t>(tgt_[i].size()) + 1);
  };
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return width(a) < width(b); });
  std::vector<std::vector<int64_t>> batches;
  std::vector<int64_t> cur;
  int64_t cur_width = 0;
  for (int64_t i : order) {
    int64_t w = std::max(cur_width, width(i));
    if (!cur.empty() && w * static_cast<int64_t>(cur.size() + 1) > max_tokens_) {
      batches.push_back(std::move(cur));
      cur.clear();
      w = width(i);
    }
    cur.push_back(i);
    cur_width = w;
  }
  if (!cur.empty()) batches.push_back(std::move(cur));
  std::shuffle(batches.begin(), batches.end(), rng);
  return batches;
}

Batch TokenBatcher::make(const std::vector<int64_t>& rows) const {
  TP_CHECK(!rows.empty(), "TokenBatcher::make: empty batch");
  int64_t S = 0, T = 0;
  for (int64_t r : rows) {
    S = std::max<int64_t>(S, static_cast<int64_t>(src_.at(r).size()));
    T = std::max<int64_t>(T, static_cast<int64_t>(tgt_.at(r).size()) + 1);
  }
  const int64_t B = static_cast<int64_t>(rows.size());
  std::vector<int64_t> src(B * S, pad_), tin(B * T, pad_), tout(B * T, pad_);
  Batch b;
  for (int64_t i = 0; i < B; ++i) {
    const auto& s = src_[rows[i]];
    const auto& t = tgt_[rows[i]];
    std::copy(s.begin(), s.end(), src.begin() + i * S);
    tin[i * T] = bos_;
    std::copy(t.begin(), t.end(), tin.begin() + i * T + 1);
    std::copy(t.begin(), t.end(), tout.begin() + i * T);
    tout[i * T + static_cast<int64_t>(t.size())] = eos_;
    b.src_tokens += static_cast<int64_t>(s.size());
    b.tgt_tokens += static_cast<int64_t>(t.size()) + 1;
  }
  b.src = tensor(src, {B, S});
  b.tgt_in = tensor(tin, {B, T});
  b.tgt_out = tensor(tout, {B, T});
  b.index = rows;
  return b;
}

}  // namespace tapestry::apps
