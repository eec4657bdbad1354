// The decoder-only models' shared parts (see causal_lm.h): the loss, the weight-decay split, and
// text generation: batched prompts (left-padded), the KV cache, and sampling with temperature,
// top-k and top-p (nucleus), drawn from a seeded Generator.
#include "tapestry/models/causal_lm.h"

#include <algorithm>
#include <limits>

namespace tapestry::models {

Tensor CausalLM::loss(const Tensor& ids, const Tensor& targets) {
  TP_CHECK(targets.sizes() == ids.sizes() && targets.dtype() == DType::Int64,
           "loss: targets must be int64 {} like the ids, got {} {}", ids.sizes(), targets.dtype(), targets.sizes());
  Tensor logits = forward(ids);
  return cross_entropy(logits.reshape({-1, vocab_size()}), targets.to(logits.device()).reshape({-1}), 0.0, -100);
}

void CausalLM::check_ids(const Tensor& ids, int64_t past, const char* model, const char* context_field,
                         const char* remedy) const {
  TP_CHECK(ids.dtype() == DType::Int64 && ids.dim() == 2 && ids.size(1) > 0,
           "{}: expected token ids int64 [B, T] with T > 0, got {} {}", model, ids.dtype(), ids.sizes());
  TP_CHECK(past + ids.size(1) <= context_length(), "{}: {} positions{} exceed the context of {} ({}); {}", model,
           past + ids.size(1), past ? fmt::format(" ({} cached)", past) : std::string(), context_length(),
           context_field, remedy);
  if (ids.numel() == 0 || !ids.device().is_cpu()) return;
  const int64_t lo = min(ids).item<int64_t>(), hi = max(ids).item<int64_t>();
  TP_CHECK(lo >= 0 && hi < vocab_size(), "{}: token ids must be in [0, {}), got values in [{}, {}]", model,
           vocab_size(), lo, hi);
}

Tensor CausalLM::mask_after_cache(const Tensor& range, const Tensor& masked_out, int64_t past, int64_t T) {
  if (past == 0 || T == 1) return masked_out;
  Tensor future = gt(range.slice(0, 0, past + T).unsqueeze(0), range.slice(0, past, past + T).unsqueeze(1));
  return masked_out.defined() ? logical_or(masked_out, future) : future;
}

std::vector<Tensor> CausalLM::decay_parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, p] : named_parameters())
    if (p.dim() >= 2 && p.requires_grad()) out.push_back(p);
  return out;
}

std::vector<Tensor> CausalLM::no_decay_parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, p] : named_parameters())
    if (p.dim() < 2 && p.requires_grad()) out.push_back(p);
  return out;
}

Tensor sample_next(const Tensor& logits_in, const SampleOptions& o, Generator& gen) {
  TP_CHECK(logits_in.dim() == 2 && logits_in.size(1) > 0, "sample_next: expected logits [B, V], got {}",
           logits_in.sizes());
  if (o.greedy) return argmax(logits_in, 1, true);
  TP_CHECK(o.temperature > 0, "sample_next: temperature must be positive (use greedy for argmax), got {}",
           o.temperature);
  TP_CHECK(o.top_k >= 0, "sample_next: top_k must be non-negative (0: off), got {}", o.top_k);
  TP_CHECK(o.top_p > 0 && o.top_p <= 1, "sample_next: top_p must be in (0, 1], got {}", o.top_p);
  const double neg_inf = -std::numeric_limits<double>::infinity();
  Tensor logits = logits_in.to(DType::Float32) / o.temperature;
  const int64_t V = logits.size(1);
  if (o.top_k > 0 && o.top_k < V) {
    // Keep the k largest: everything below the k-th value per row is dropped.
    Tensor kth = topk(logits, o.top_k, 1, true, true).values.slice(1, o.top_k - 1, o.top_k);  // [B, 1]
    logits = masked_fill(logits, lt(logits, kth), neg_inf);
  }
  if (o.top_p < 1) {
    // Keep the most likely tokens until their mass reaches top_p (at least one): the cut is the
    // logit of the last token kept, and everything below it goes.
    Tensor sorted = sort(logits, 1, true, true).values;  // [B, V], descending
    Tensor probs = softmax(sorted, 1);
    Tensor mass_before = sub(cumsum(probs, 1), probs);  // mass of the tokens ranked above
    std::vector<int64_t> keep = sum(lt(mass_before, o.top_p), {1}).to_vector<int64_t>();
    std::vector<float> cut(keep.size());
    Tensor sorted_c = sorted.to(Device::CPU).contiguous();
    const float* ps = sorted_c.data_ptr<float>();
    for (size_t b = 0; b < keep.size(); ++b)
      cut[b] = ps[static_cast<int64_t>(b) * V + std::max<int64_t>(keep[b], 1) - 1];
    logits = masked_fill(logits, lt(logits, tensor(cut, {static_cast<int64_t>(cut.size()), 1}).to(logits.device())), neg_inf);
  }
  return multinomial(softmax(logits, 1), 1, false, &gen);  // [B, 1]
}

std::vector<std::vector<int64_t>> generate(CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                                           const SampleOptions& o, const std::function<void(size_t, int64_t)>& on_token) {
  TP_CHECK(!prompts.empty(), "generate: no prompts");
  TP_CHECK(o.max_new >= 0, "generate: max_new must be non-negative, got {}", o.max_new);
  for (size_t b = 0; b < prompts.size(); ++b)
    TP_CHECK(!prompts[b].empty(), "generate: prompt {} is empty; start it with a token (e.g. the end-of-text id)", b);
  const int64_t B = static_cast<int64_t>(prompts.size()), block = model.context_length();

  const bool was_training = model.is_training();
  model.eval();
  NoGradGuard no_grad;
  Generator gen(o.seed);
  const Device device = model.parameters().front().device();  // inputs go where the model is

  // Each row's tokens so far (prompt, then what was generated); the model sees the last `block` of
  // them. Past the context the window slides, as in nanoGPT: the cache is rebuilt from the window's
  // last `block` tokens (positions from 0 again) and every further token costs a full forward.
  std::vector<std::vector<int64_t>> seqs(prompts.begin(), prompts.end());
  std::vector<int64_t> length(static_cast<size_t>(B));  // tokens of each row in the cache
  Tensor keys_masked;                                   // [B, cached], true at padding
  bool any_pad = false;
  LMCache cache;
  auto mask_now = [&]() { return any_pad ? keys_masked.unsqueeze(1).unsqueeze(1) : Tensor(); };
  // A fresh cache from each row's last (at most `block`) tokens. Left padding: every row's last
  // token sits in the last column, so one step serves all rows; pads are masked out as keys and
  // positions count from each row's first token.
  auto prime = [&]() {
    int64_t L = 0;
    for (auto& s : seqs) L = std::max<int64_t>(L, std::min<int64_t>(static_cast<int64_t>(s.size()), block));
    std::vector<int64_t> ids(static_cast<size_t>(B * L), o.pad), pos(static_cast<size_t>(B * L), 0);
    std::vector<int64_t> pad_mask(static_cast<size_t>(B * L), 0);
    for (int64_t b = 0; b < B; ++b) {
      const auto& s = seqs[static_cast<size_t>(b)];
      const int64_t n = std::min<int64_t>(static_cast<int64_t>(s.size()), block), start = L - n;
      const size_t first = s.size() - static_cast<size_t>(n);
      length[b] = n;
      for (int64_t j = 0; j < L; ++j) {
        if (j < start) pad_mask[b * L + j] = 1;
        else {
          ids[b * L + j] = s[first + static_cast<size_t>(j - start)];
          pos[b * L + j] = j - start;
        }
      }
    }
    keys_masked = ne(tensor(pad_mask, {B, L}).to(device), 0.0);
    any_pad = std::any_of(pad_mask.begin(), pad_mask.end(), [](int64_t m) { return m != 0; });
    cache = LMCache();
    return model.forward(tensor(ids, {B, L}).to(device), o.use_cache ? &cache : nullptr, tensor(pos, {B, L}).to(device),
                         mask_now());
  };

  std::vector<std::vector<int64_t>> out(prompts.size());
  std::vector<bool> done(prompts.size(), false);
  Tensor logits = o.max_new > 0 ? prime() : Tensor();
  for (int64_t step = 0; step < o.max_new; ++step) {
    Tensor last = logits.select(1, logits.size(1) - 1);  // [B, V]
    std::vector<int64_t> next = sample_next(last, o, gen).reshape({B}).to_vector<int64_t>();
    bool all_done = true;
    for (size_t b = 0; b < prompts.size(); ++b) {
      seqs[b].push_back(next[b]);
      if (done[b]) continue;
      out[b].push_back(next[b]);
      if (on_token) on_token(b, next[b]);
      if (next[b] == o.eos) done[b] = true;
      all_done = all_done && done[b];
    }
    if (all_done || step + 1 == o.max_new) break;
    if (!o.use_cache || cache.length() >= block) {  // no cache, or the context is full: slide the window
      logits = prime();
      continue;
    }
    std::vector<int64_t> step_pos(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) step_pos[b] = length[b]++;
    if (any_pad) keys_masked = cat({keys_masked, zeros({B, 1}, TensorOptions(DType::Bool, keys_masked.device()))}, 1);
    logits = model.forward(tensor(next, {B, 1}).to(device), &cache, tensor(step_pos, {B, 1}).to(device), mask_now());
  }
  if (was_training) model.train();
  return out;
}

}  // namespace tapestry::models
