// Soak test (ctest label `soak`, not in the default run): STEPS (default 5000) train steps of a
// tiny Transformer on random batches of varying length, Adam + Noam + clipping, sampling the
// resident memory every 250 steps. Memory must stay flat after warm-up: a leak in the tape, the
// allocator settings or the optimizer grows it step by step. Prints the samples and exits 1 when
// the last sample exceeds the post-warm-up one by more than 10% (and 8 MiB).
//   soak [STEPS]
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <vector>

#include "tapestry/models/transformer.h"
#include "tapestry/optim/optimizer.h"
#include "tapestry/tapestry.h"

using namespace tapestry;

namespace {
double rss_mib() {
  std::ifstream statm("/proc/self/statm");
  long pages = 0, resident = 0;
  statm >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(::sysconf(_SC_PAGESIZE)) / (1024.0 * 1024.0);
}
}  // namespace

int main(int argc, char** argv) {
  const int64_t steps = argc > 1 ? std::atoll(argv[1]) : 5000;
  const int64_t warmup_steps = std::min<int64_t>(500, steps / 4);
  manual_seed(3);
  models::TransformerConfig cfg = models::TransformerConfig::named("tiny", 64, 64);
  cfg.pad_id = 0;
  models::Transformer model(cfg);
  optim::AdamOptions ao;
  optim::Adam adam(model.parameters(), ao);
  optim::NoamSchedule schedule(cfg.d_model, 100, 1.0);
  Generator gen(11);
  std::vector<std::pair<int64_t, double>> samples;
  for (int64_t step = 1; step <= steps; ++step) {
    // Lengths vary from step to step, so the allocator sees many block sizes.
    const int64_t B = 8 + step % 5, S = 6 + step % 7, T = 5 + (step * 3) % 8;
    Tensor src = randint(4, 64, {B, S}, DType::Int64, &gen);
    Tensor tgt = randint(4, 64, {B, T + 1}, DType::Int64, &gen);
    Tensor tgt_in = tgt.slice(1, 0, T).contiguous(), tgt_out = tgt.slice(1, 1, T + 1).contiguous();
    schedule.apply(adam, step);
    Tensor loss = model.loss(src, tgt_in, tgt_out, 0.1);
    loss.backward();
    optim::clip_grad_norm(model.parameters(), 1.0);
    adam.step();
    adam.zero_grad();
    if (step % 250 == 0 || step == warmup_steps) samples.emplace_back(step, rss_mib());
  }
  double after_warmup = 0, last = samples.back().second, peak = 0;
  for (auto& [step, mib] : samples) {
    std::printf("soak: step %5lld  RSS %.1f MiB\n", (long long)step, mib);
    if (step == warmup_steps) after_warmup = mib;
    if (step >= warmup_steps) peak = std::max(peak, mib);
  }
  const double growth = last - after_warmup;
  std::printf("soak: %lld steps, RSS %.1f MiB after %lld warm-up steps, %.1f MiB at the end (%+.1f MiB, %+.1f%%), "
              "peak %.1f MiB\n",
              (long long)steps, after_warmup, (long long)warmup_steps, last, growth, 100 * growth / after_warmup, peak);
  const bool flat = growth <= std::max(8.0, 0.10 * after_warmup);
  std::printf("soak: %s\n", flat ? "memory flat after warm-up" : "MEMORY GROWS after warm-up");
  return flat ? 0 : 1;
}
