// Soak test (ctest label `soak`, not in the default run): STEPS (default 5000) Trainer steps of a
// tiny Transformer on random batches of varying length, Adam + Noam + clipping, sampling the
// resident memory every 250 steps (the evaluation hook). Memory must stay flat after warm-up: a leak in the tape, the
// allocator settings or the optimizer grows it step by step. Prints the samples and exits 1 when
// the last sample exceeds the post-warm-up one by more than 10% (and 8 MiB).
//   soak [STEPS]
#include <unistd.h>

#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <vector>

#include "apps/train/trainer.h"
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

// Random batches whose lengths vary from step to step, so the allocator sees many block sizes.
struct RandomBatches : apps::DataSource {
  RandomBatches(models::Transformer& model, int64_t steps) : model(model), steps(steps) {}
  int64_t plan(int64_t) override { return steps; }
  apps::TrainBatch batch(int64_t i) override {
    const int64_t step = i + 1, B = 8 + step % 5, S = 6 + step % 7, T = 5 + (step * 3) % 8;
    Tensor src = randint(4, 64, {B, S}, DType::Int64, &gen);
    Tensor tgt = randint(4, 64, {B, T + 1}, DType::Int64, &gen);
    Tensor tgt_in = tgt.slice(1, 0, T).contiguous(), tgt_out = tgt.slice(1, 1, T + 1).contiguous();
    return {B * T, [this, src, tgt_in, tgt_out] { return model.loss(src, tgt_in, tgt_out, 0.1); }};
  }
  models::Transformer& model;
  int64_t steps;
  Generator gen{11};
};

int main(int argc, char** argv) {
  const int64_t steps = argc > 1 ? std::atoll(argv[1]) : 5000;
  const int64_t every = std::max<int64_t>(1, std::min<int64_t>(250, steps / 20));
  manual_seed(3);
  models::TransformerConfig cfg = models::TransformerConfig::named("tiny", 64, 64);
  cfg.pad_id = 0;
  models::Transformer model(cfg);
  optim::AdamOptions ao;
  optim::Adam adam(model.parameters(), ao);
  optim::NoamSchedule schedule(cfg.d_model, 100, 1.0);
  // The Trainer's own loop (apps/train/trainer.h), with clipping; its evaluation hook samples RSS.
  apps::TrainerOptions to;
  to.clip_norm = 1.0, to.eval_every = every, to.progress = false;
  apps::Trainer trainer(model, adam, &schedule, to);
  std::vector<std::pair<int64_t, double>> samples;
  trainer.evaluate = [&](int64_t, int64_t step) {
    samples.emplace_back(step, rss_mib());
    return apps::Metrics{{"rss", "RSS MiB", samples.back().second, 1, "", false}};
  };
  RandomBatches data(model, steps);
  trainer.fit(data);
  // The first sample at or after min(500, steps / 4) steps ends the warm-up.
  int64_t warmup_steps = samples.back().first;
  for (auto& [step, mib] : samples)
    if (step >= std::min<int64_t>(500, steps / 4)) {
      warmup_steps = step;
      break;
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
