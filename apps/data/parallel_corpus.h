// Parallel text for translation: loading aligned files with clear errors, and the paper's
// batching (sentence pairs of similar length grouped into batches of about N tokens).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tapestry/ops/tensor.h"

namespace tapestry::apps {

struct ParallelCorpus {
  std::vector<std::string> src, tgt;  // line i of src translates to line i of tgt
  std::string src_path, tgt_path;      // the files they came from, for messages
};

// The data directory: $TAPESTRY_DATA if set, else ../shared/data/multi30k (next to the checkout).
std::string default_data_dir();

// Reads DIR/SPLIT.SRC and DIR/SPLIT.TGT, each plain or with .gz appended (the .gz wins when both
// exist). Throws a tapestry::Error naming the file (and line) for a missing file, invalid UTF-8,
// an empty line, or files whose line counts differ.
ParallelCorpus load_parallel(const std::string& dir, const std::string& split, const std::string& src_lang,
                             const std::string& tgt_lang);

// One batch as model inputs: src [B, S], tgt_in [B, T] (bos + tokens), tgt_out [B, T]
// (tokens + eos), padded with pad; `index` holds the corpus line of each row.
struct Batch {
  Tensor src, tgt_in, tgt_out;
  std::vector<int64_t> index;
  int64_t src_tokens = 0, tgt_tokens = 0;  // real (non-pad) tokens, eos included on the target side
};

// Token-count batching: pairs are sorted by length (ties broken at random per epoch) and cut
// into batches whose padded size, max(src len, tgt len + 1) x rows, stays within max_tokens; the
// batch order is shuffled per epoch. Everything follows from the seed and the epoch number.
class TokenBatcher {
 public:
  TokenBatcher(std::vector<std::vector<int64_t>> src, std::vector<std::vector<int64_t>> tgt, int64_t max_tokens,
               int64_t pad, int64_t bos, int64_t eos);
  // The batches of one epoch, as row indices into the corpus.
  std::vector<std::vector<int64_t>> plan(uint64_t seed, int64_t epoch) const;
  Batch make(const std::vector<int64_t>& rows) const;
  size_t size() const { return src_.size(); }

 private:
  std::vector<std::vector<int64_t>> src_, tgt_;
  int64_t max_tokens_, pad_, bos_, eos_;
};

}  // namespace tapestry::apps
