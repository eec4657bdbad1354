// Greedy and beam-search decoding, batched over sentences, with per-layer key/value caches so
// each step runs the decoder on one new position. With use_cache off, every step re-runs the
// whole prefix instead: slower, and the reference the cache is tested against. A sentence that
// has ended leaves the batch (as in fairseq), so a batch's last steps decode only the long ones.
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

// Gathers the decoder's per-row state for the next step: every layer's cached self-attention keys
// and values by `rows` (of the current batch, in their new order), and with `sentences` also the
// encoder memory, its mask and the cross-attention's cached keys and values by sentence (beam
// search keeps one memory row per sentence for its K rows, see nn::MultiHeadAttention). Beam
// search reorders the self-attention rows every step; both searches drop the rows of finished
// sentences, as fairseq does, so the steps after a sentence ends cost only what is still decoded.
void gather_rows(const std::vector<int64_t>& rows, const std::vector<int64_t>* sentences, Tensor& memory,
                 Tensor& src_mask, DecoderCache& cache) {
  const Tensor idx = tensor(rows).to(memory.device());
  for (nn::KVCache& c : cache.self_attn) c.select_rows(idx);
  if (!sentences) return;
  const Tensor sidx = tensor(*sentences).to(memory.device());
  for (nn::KVCache& c : cache.src_attn) c.select_rows(sidx);
  memory = index_select(memory, 0, sidx);
  src_mask = index_select(src_mask, 0, sidx);
}

}  // namespace

std::vector<Hypothesis> greedy_decode(Transformer& model, const Tensor& src, const DecodeOptions& opt) {
  NoGradGuard no_grad;
  EvalScope eval_scope(model);
  const int64_t B = src.size(0), pad = model.config.pad_id;
  Tensor src_mask = model.source_mask(src);
  Tensor memory = model.encode(src, src_mask);
  std::vector<int64_t> lens = source_lengths(src, pad);
  // Row r of the batch decodes sentence active[r]; finished sentences leave the batch.
  std::vector<int64_t> active(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) active[b] = b;
  std::vector<std::vector<int64_t>> prefixes(static_cast<size_t>(B), std::vector<int64_t>{opt.bos});
  std::vector<Hypothesis> out(static_cast<size_t>(B));
  DecoderCache cache;
  const int64_t max_steps = *std::max_element(lens.begin(), lens.end()) + opt.max_extra;
  for (int64_t t = 0; t < max_steps && !active.empty(); ++t) {
    const int64_t rows = static_cast<int64_t>(active.size());
    Tensor lp = next_log_probs(model, prefixes, memory, src_mask, opt.use_cache ? &cache : nullptr);
    // Only what the search needs comes to the host: each row's best token and its log-prob, in one
    // copy of [2, rows] (ids are exact in double), not the [rows, V] distribution.
    auto [best_lp, best_id] = max(lp, -1);
    const std::vector<double> picked =
        stack({best_lp.to(DType::Float64), best_id.to(DType::Float64)}, 0).to_vector<double>();
    std::vector<int64_t> going;  // rows whose sentence goes on
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t b = active[r], tok = static_cast<int64_t>(picked[static_cast<size_t>(rows + r)]);
      out[b].tokens.push_back(tok);
      out[b].score += picked[static_cast<size_t>(r)];
      prefixes[r].push_back(tok);
      if (tok != opt.eos && static_cast<int64_t>(out[b].tokens.size()) < lens[b] + opt.max_extra) going.push_back(r);
    }
    if (static_cast<int64_t>(going.size()) == rows) continue;
    // Note [Rows leaving a batch]: a finished row's place goes to a row from the end of the batch,
    // so only those rows move (the caches move them in place, nn::KVCache::select_rows), not
    // every row after the first to finish. Greedy rows are independent: their order is free.
    const int64_t n = static_cast<int64_t>(going.size());
    std::vector<int64_t> keep(going.begin(), going.end());
    {
      std::vector<bool> goes(static_cast<size_t>(rows), false);
      for (int64_t r : going) goes[static_cast<size_t>(r)] = true;
      int64_t filler = rows;  // the next going row from the end, at or past n
      for (int64_t i = 0; i < n; ++i) {
        if (goes[static_cast<size_t>(i)]) {
          keep[static_cast<size_t>(i)] = i;
          continue;
        }
        do --filler;
        while (!goes[static_cast<size_t>(filler)]);
        keep[static_cast<size_t>(i)] = filler;
      }
    }
    std::vector<int64_t> next_active;
    std::vector<std::vector<int64_t>> next_prefixes;
    for (int64_t r : keep) {
      next_active.push_back(active[r]);
      next_prefixes.push_back(std::move(prefixes[r]));
    }
    active = std::move(next_active);
    prefixes = std::move(next_prefixes);
    if (!keep.empty()) gather_rows(keep, &keep, memory, src_mask, cache);
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
  Tensor src_mask = model.source_mask(src);
  Tensor memory = model.encode(src, src_mask);
  // Rows a*K .. a*K+K-1 decode sentence active[a], all against memory row a: the memory is not
  // repeated K times, the cross-attention groups a sentence's K rows (nn::MultiHeadAttention).
  std::vector<int64_t> active(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) active[b] = b;
  std::vector<int64_t> lens = source_lengths(src, pad);

  std::vector<std::vector<int64_t>> prefixes(static_cast<size_t>(B * K), std::vector<int64_t>{opt.bos});
  std::vector<double> scores(static_cast<size_t>(B * K), NEG);
  for (int64_t b = 0; b < B; ++b) scores[b * K] = 0.0;  // one live beam at the start
  std::vector<std::vector<Hypothesis>> finished(static_cast<size_t>(B));
  DecoderCache cache;
  const int64_t max_steps = *std::max_element(lens.begin(), lens.end()) + opt.max_extra;

  for (int64_t t = 0; t < max_steps && !active.empty(); ++t) {
    const int64_t A = static_cast<int64_t>(active.size()), rows = A * K;
    Tensor lp = next_log_probs(model, prefixes, memory, src_mask, opt.use_cache ? &cache : nullptr);
    const int64_t V = lp.size(1);
    // Only what the search needs comes to the host: each row's M best continuations (score and
    // token), one copy of [2, rows, M]. The 2K best of a sentence over all its beams are among
    // its rows' 2K best each. A row's float32 log-probs are ranked first and only its M best get
    // the beam's score added, in double as the host would. Adding one double keeps their order,
    // and keeps distinct ones distinct: below log(1/2), where all but one of a row lie, float32
    // log-probs differ by 6e-8 or more, far above the sum's double rounding. So this is the full
    // search's ranking (ties: lower beam, then lower token) without [rows, V] doubles per step.
    const int64_t M = std::min<int64_t>(2 * K, V);
    auto [top_lp, top_tokens] = topk(lp, M, -1, /*largest=*/true, /*sorted=*/true);
    Tensor top_scores = top_lp.to(DType::Float64) + tensor(scores, {rows, 1}, kFloat64).to(lp.device());
    const std::vector<double> top = stack({top_scores, top_tokens.to(DType::Float64)}, 0).to_vector<double>();
    // Row r of the next step continues row origin[r]; only the sentences still going keep rows.
    std::vector<int64_t> origin, next_active, kept;  // kept: positions in active of next_active
    std::vector<std::vector<int64_t>> next_prefixes;
    std::vector<double> next_scores;
    for (int64_t a = 0; a < A; ++a) {
      const int64_t b = active[a];
      // The 2K best continuations over all beams of this sentence.
      std::vector<std::pair<double, int64_t>> cand;  // (score, k * V + token)
      for (int64_t k = 0; k < K; ++k) {
        if (scores[a * K + k] == NEG) continue;
        for (int64_t m = 0; m < M; ++m) {
          const size_t at = static_cast<size_t>((a * K + k) * M + m);
          cand.emplace_back(top[at], k * V + static_cast<int64_t>(top[static_cast<size_t>(rows * M) + at]));
        }
      }
      int64_t take = std::min<int64_t>(2 * K, static_cast<int64_t>(cand.size()));
      std::partial_sort(cand.begin(), cand.begin() + take, cand.end(),
                        [](auto& x, auto& y) { return x.first > y.first || (x.first == y.first && x.second < y.second); });
      const int64_t gen_len = t + 1;  // tokens generated including this one
      const bool at_limit = gen_len >= lens[b] + opt.max_extra;
      std::vector<int64_t> beam_origin(static_cast<size_t>(K), a * K);  // unused rows copy beam 0
      std::vector<std::vector<int64_t>> beam_prefixes(static_cast<size_t>(K));
      std::vector<double> beam_scores(static_cast<size_t>(K), NEG);
      int64_t live = 0;
      for (int64_t c = 0; c < take && live < K; ++c) {
        auto [s, idx] = cand[c];
        int64_t k = idx / V, tok = idx % V;
        const auto& prefix = prefixes[a * K + k];
        if (tok == opt.eos || at_limit) {
          if (c < K) {  // an ending counts only if it ranks among the top K
            Hypothesis h{std::vector<int64_t>(prefix.begin() + 1, prefix.end()), s / length_penalty(gen_len, alpha)};
            h.tokens.push_back(tok);
            finished[b].push_back(std::move(h));
          }
          continue;
        }
        beam_origin[live] = a * K + k;
        beam_prefixes[live] = prefix;
        beam_prefixes[live].push_back(tok);
        beam_scores[live++] = s;
      }
      for (int64_t k = live; k < K; ++k) {  // unused rows: keep a valid prefix, never extend them
        beam_prefixes[k] = prefixes[a * K];
        beam_prefixes[k].push_back(pad);
      }
      // Early stop: K endings, and no live hypothesis can beat the worst of them even at the
      // longest allowed length (scores only fall as tokens are added; lp grows with length).
      bool done = at_limit || live == 0;
      if (static_cast<int64_t>(finished[b].size()) >= K) {
        std::sort(finished[b].begin(), finished[b].end(), [](auto& x, auto& y) { return x.score > y.score; });
        double best_live = *std::max_element(beam_scores.begin(), beam_scores.end());
        double bound = best_live == NEG ? NEG : best_live / length_penalty(lens[b] + opt.max_extra, alpha);
        if (bound <= finished[b][K - 1].score) done = true;
      }
      if (done) {
        if (finished[b].empty())  // cannot happen (at_limit ends every beam), kept as a guard
          finished[b].push_back(Hypothesis{std::vector<int64_t>(prefixes[a * K].begin() + 1, prefixes[a * K].end()),
                                           scores[a * K]});
        continue;
      }
      next_active.push_back(b);
      kept.push_back(a);
      origin.insert(origin.end(), beam_origin.begin(), beam_origin.end());
      for (auto& p : beam_prefixes) next_prefixes.push_back(std::move(p));
      next_scores.insert(next_scores.end(), beam_scores.begin(), beam_scores.end());
    }
    const bool dropped = next_active.size() < active.size();
    active = std::move(next_active);
    prefixes = std::move(next_prefixes);
    scores = std::move(next_scores);
    if (active.empty()) break;
    // Each row continues the beam it came from; the finished sentences' memory rows go.
    if (opt.use_cache || dropped) gather_rows(origin, dropped ? &kept : nullptr, memory, src_mask, cache);
  }
  std::vector<Hypothesis> out(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    auto& f = finished[b];
    out[b] = *std::max_element(f.begin(), f.end(), [](auto& x, auto& y) { return x.score < y.score; });
  }
  return out;
}

}  // namespace tapestry::models
