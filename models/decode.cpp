// Greedy and beam-search decoding, batched over sentences, with per-layer key/value caches so
// each step runs the decoder on one new position. With use_cache off, every step re-runs the
// whole prefix instead: slower, and the reference the cache is tested against.
#include <algorithm>
#include <cmath>
#include <limits>

#include "tapestry/models/transformer.h"

namespace tapestry::models {

namespace {

// Source lengths (non-pad tokens) per sentence.
std::vector<int64_t> source_lengths(const Tensor& src, int64_t pad) {
  std::vector<int64_t> ids = src.to_vector<int64_t>(), lens(static_cast<size_t>(src.size(0)), 0);
  for (int64_t b = 0; b < src.size(0); ++b)
    for (int64_t s = 0; s < src.size(1); ++s) lens[b] += ids[b * src.size(1) + s] != pad;
  return lens;
}

// Runs the decoder for the next position of every row: tokens holds each row's prefix
// (bos first). Returns log-probs [rows, V] of the next token.
Tensor next_log_probs(Transformer& model, const std::vector<std::vector<int64_t>>& prefixes, const Tensor& memory,
                      const Tensor& src_mask, DecoderCache* cache) {
  const int64_t rows = static_cast<int64_t>(prefixes.size()), len = static_cast<int64_t>(prefixes[0].size());
  Tensor hidden;
  if (cache) {
    std::vector<int64_t> last;
    for (auto& p : prefixes) last.push_back(p.back());
    hidden = model.decode(tensor(last, {rows, 1}).to(memory.device()), memory, src_mask, Tensor(), cache, len - 1);
  } else {
    std::vector<int64_t> all;
    for (auto& p : prefixes) all.insert(all.end(), p.begin(), p.end());
    Tensor ys = tensor(all, {rows, len}).to(memory.device());
    hidden = model.decode(ys, memory, src_mask, model.target_mask(ys)).select(1, len - 1).unsqueeze(1);
  }
  Tensor lp = log_softmax(model.generate(hidden).select(1, 0), -1);
  // Padding is never an output: it would also be masked as a key when the prefix is re-read.
  lp.select(1, model.config.pad_id).fill_(-std::numeric_limits<double>::infinity());
  return lp;
}

// Eval mode for the decoder's lifetime; the caller's mode comes back even if decoding throws.
struct EvalScope {
  explicit EvalScope(nn::Module& m) : module(m), was_training(m.is_training()) { m.eval(); }
  ~EvalScope() { module.train(was_training); }
  nn::Module& module;
  bool was_training;
};

double length_penalty(int64_t len, double alpha) { return std::pow((5.0 + static_cast<double>(len)) / 6.0, alpha); }

}  // namespace

std::vector<Hypothesis> greedy_decode(Transformer& model, const Tensor& src, const DecodeOptions& opt) {
  NoGradGuard no_grad;
  EvalScope eval_scope(model);
  const int64_t B = src.size(0), pad = model.config.pad_id;
  Tensor src_mask = model.source_mask(src);
  Tensor memory = model.encode(src, src_mask);
  std::vector<int64_t> lens = source_lengths(src, pad);
  std::vector<std::vector<int64_t>> prefixes(static_cast<size_t>(B), std::vector<int64_t>{opt.bos});
  std::vector<Hypothesis> out(static_cast<size_t>(B));
  std::vector<bool> done(static_cast<size_t>(B), false);
  DecoderCache cache;
  const int64_t max_steps = *std::max_element(lens.begin(), lens.end()) + opt.max_extra;
  for (int64_t t = 0; t < max_steps; ++t) {
    Tensor lp = next_log_probs(model, prefixes, memory, src_mask, opt.use_cache ? &cache : nullptr);
    // Only what the search needs comes to the host: each row's best token and its log-prob, in one
    // copy of [2, B] (ids are exact in double), not the [B, V] distribution.
    auto [best_lp, best_id] = max(lp, -1);
    const std::vector<double> picked =
        stack({best_lp.to(DType::Float64), best_id.to(DType::Float64)}, 0).to_vector<double>();
    bool all_done = true;
    for (int64_t b = 0; b < B; ++b) {
      int64_t tok = done[b] ? pad : static_cast<int64_t>(picked[static_cast<size_t>(B + b)]);
      if (!done[b]) {
        out[b].tokens.push_back(tok);
        out[b].score += picked[static_cast<size_t>(b)];
        done[b] = tok == opt.eos || static_cast<int64_t>(out[b].tokens.size()) >= lens[b] + opt.max_extra;
      }
      prefixes[b].push_back(tok);
      all_done = all_done && done[b];
    }
    if (all_done) break;
  }
  return out;
}

std::vector<Hypothesis> beam_search(Transformer& model, const Tensor& src, int64_t K, double alpha,
                                    const DecodeOptions& opt) {
  TP_CHECK(K >= 1, "beam_search: beam size must be at least 1, got {}", K);
  // The early-stop bound assumes the length penalty grows with length.
  TP_CHECK(alpha >= 0, "beam_search: length penalty alpha must be non-negative, got {}", alpha);
  NoGradGuard no_grad;
  EvalScope eval_scope(model);
  const int64_t B = src.size(0), pad = model.config.pad_id;
  const double NEG = -std::numeric_limits<double>::infinity();
  Tensor src_mask0 = model.source_mask(src);
  Tensor memory0 = model.encode(src, src_mask0);
  // Each sentence's memory repeated for its K beams: rows b*K .. b*K+K-1.
  std::vector<int64_t> rep;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t k = 0; k < K; ++k) rep.push_back(b);
  Tensor rep_idx = tensor(rep).to(src.device());
  Tensor memory = index_select(memory0, 0, rep_idx), src_mask = index_select(src_mask0, 0, rep_idx);
  std::vector<int64_t> lens = source_lengths(src, pad);

  std::vector<std::vector<int64_t>> prefixes(static_cast<size_t>(B * K), std::vector<int64_t>{opt.bos});
  std::vector<double> scores(static_cast<size_t>(B * K), NEG);
  for (int64_t b = 0; b < B; ++b) scores[b * K] = 0.0;  // one live beam at the start
  std::vector<std::vector<Hypothesis>> finished(static_cast<size_t>(B));
  std::vector<bool> done(static_cast<size_t>(B), false);
  DecoderCache cache;
  const int64_t max_steps = *std::max_element(lens.begin(), lens.end()) + opt.max_extra;

  for (int64_t t = 0; t < max_steps; ++t) {
    Tensor lp = next_log_probs(model, prefixes, memory, src_mask, opt.use_cache ? &cache : nullptr);
    const int64_t V = lp.size(1);
    // Only what the search needs comes to the host: each row's M best continuations (score and
    // token), one copy of [2, rows, M]. The 2K best of a sentence over all its beams are among
    // its rows' 2K best each. Scores are added on the device in double, as the host would, so
    // the ranking (ties: lower beam, then lower token) is the full search's exactly.
    const int64_t M = std::min<int64_t>(2 * K, V);
    Tensor row_scores = lp.to(DType::Float64) + tensor(scores, {B * K, 1}).to(lp.device());
    auto [top_scores, top_tokens] = topk(row_scores, M, -1, /*largest=*/true, /*sorted=*/true);
    const std::vector<double> top = stack({top_scores, top_tokens.to(DType::Float64)}, 0).to_vector<double>();
    std::vector<int64_t> origin(static_cast<size_t>(B * K));
    std::vector<std::vector<int64_t>> next_prefixes(static_cast<size_t>(B * K));
    std::vector<double> next_scores(static_cast<size_t>(B * K), NEG);
    for (int64_t b = 0; b < B; ++b) {
      if (done[b]) {
        for (int64_t k = 0; k < K; ++k) {
          origin[b * K + k] = b * K + k;
          next_prefixes[b * K + k] = prefixes[b * K + k];
          next_prefixes[b * K + k].push_back(pad);
        }
        continue;
      }
      // The 2K best continuations over all beams of this sentence.
      std::vector<std::pair<double, int64_t>> cand;  // (score, k * V + token)
      for (int64_t k = 0; k < K; ++k) {
        if (scores[b * K + k] == NEG) continue;
        for (int64_t m = 0; m < M; ++m) {
          const size_t at = static_cast<size_t>((b * K + k) * M + m);
          cand.emplace_back(top[at], k * V + static_cast<int64_t>(top[static_cast<size_t>(B * K * M) + at]));
        }
      }
      int64_t take = std::min<int64_t>(2 * K, static_cast<int64_t>(cand.size()));
      std::partial_sort(cand.begin(), cand.begin() + take, cand.end(),
                        [](auto& x, auto& y) { return x.first > y.first || (x.first == y.first && x.second < y.second); });
      const int64_t gen_len = t + 1;  // tokens generated including this one
      const bool at_limit = gen_len >= lens[b] + opt.max_extra;
      int64_t live = 0;
      for (int64_t c = 0; c < take && live < K; ++c) {
        auto [s, idx] = cand[c];
        int64_t k = idx / V, tok = idx % V;
        const auto& prefix = prefixes[b * K + k];
        if (tok == opt.eos || at_limit) {
          if (c < K) {  // an ending counts only if it ranks among the top K
            Hypothesis h{std::vector<int64_t>(prefix.begin() + 1, prefix.end()), s / length_penalty(gen_len, alpha)};
            h.tokens.push_back(tok);
            finished[b].push_back(std::move(h));
          }
          continue;
        }
        int64_t row = b * K + live++;
        origin[row] = b * K + k;
        next_prefixes[row] = prefix;
        next_prefixes[row].push_back(tok);
        next_scores[row] = s;
      }
      for (int64_t k = live; k < K; ++k) {  // unused rows: keep a valid prefix, never extend them
        origin[b * K + k] = b * K;
        next_prefixes[b * K + k] = prefixes[b * K];
        next_prefixes[b * K + k].push_back(pad);
      }
      // Early stop: K endings, and no live hypothesis can beat the worst of them even at the
      // longest allowed length (scores only fall as tokens are added; lp grows with length).
      if (static_cast<int64_t>(finished[b].size()) >= K) {
        std::sort(finished[b].begin(), finished[b].end(), [](auto& x, auto& y) { return x.score > y.score; });
        double best_live = NEG;
        for (int64_t k = 0; k < K; ++k) best_live = std::max(best_live, next_scores[b * K + k]);
        double bound = best_live == NEG ? NEG : best_live / length_penalty(lens[b] + opt.max_extra, alpha);
        if (bound <= finished[b][K - 1].score) done[b] = true;
      }
      if (at_limit || live == 0) done[b] = true;
    }
    prefixes = std::move(next_prefixes);
    scores = std::move(next_scores);
    if (std::all_of(done.begin(), done.end(), [](bool d) { return d; })) break;
    if (opt.use_cache) {  // each row continues the beam it came from
      Tensor idx = tensor(origin).to(src.device());
      for (auto& c : cache.self_attn) {
        c.k = index_select(c.k, 0, idx);
        c.v = index_select(c.v, 0, idx);
      }
    }
  }
  std::vector<Hypothesis> out(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    auto& f = finished[b];
    if (f.empty()) {  // cannot happen (at_limit ends every beam), kept as a guard
      out[b].tokens.assign(prefixes[b * K].begin() + 1, prefixes[b * K].end());
      out[b].score = scores[b * K];
      continue;
    }
    out[b] = *std::max_element(f.begin(), f.end(), [](auto& x, auto& y) { return x.score < y.score; });
  }
  return out;
}

}  // namespace tapestry::models
