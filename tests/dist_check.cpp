// Data-parallel checks for tests/dist.sh, run once alone and once under `mpirun -np 2`:
//   dist_check train OUT.safetensors [float32|float64 [ACCUMULATE]]
//   dist_check reducer   (GradReducer's bucket order on ranks whose backwards differ)
//     trains a tiny GPT (dropout 0) for one epoch of 6 global batches of 8 windows on a fixed
//     token stream through the Trainer (AdamW with parameter groups, clipping), then rank 0
//     writes the weights to OUT. Every rank also counts the windows it was given; the counts,
//     summed over the ranks, must be exactly 1 for every window of the epoch (the shards are
//     disjoint and cover the epoch), else it fails. It prints the all-reduce time per step.
//   dist_check compare A.safetensors B.safetensors TOLERANCE
//     the largest absolute difference between the two weight files; fails above TOLERANCE.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "apps/train/trainer.h"
#include "tapestry/dist/dist.h"
#include "tapestry/tapestry.h"
#define DOCTEST_CONFIG_DISABLE  // helpers.h without doctest's runner: a program, not a test suite
#include "tests/checker.h"
#include "tests/helpers.h"  // max_diff

using namespace tapestry;

namespace {

constexpr int64_t kBlock = 16, kBatch = 8, kVocab = 50, kSteps = 6;

std::vector<int64_t> token_stream() {
  std::vector<int64_t> s;
  uint64_t x = 12345;
  for (int64_t i = 0; i < kBlock * kBatch * kSteps + 1; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    s.push_back(static_cast<int64_t>((x >> 33) % kVocab));
  }
  return s;
}

// Global batch i holds windows i*kBatch .. i*kBatch + kBatch - 1 (window w starts at w*kBlock).
class Windows : public apps::DataSource {
 public:
  Windows(models::GPT& model, std::vector<int64_t> stream) : model_(model), stream_(std::move(stream)) {}
  int64_t plan(int64_t) override { return kSteps; }
  apps::TrainBatch batch(int64_t index) override {
    std::vector<int64_t> windows;
    for (int64_t w = index * kBatch; w < (index + 1) * kBatch; ++w) windows.push_back(w);
    windows = apps::shard_of(windows, shard_rank_, shard_world_);
    if (windows.empty()) return {0, {}};
    std::vector<int64_t> x, y;
    for (int64_t w : windows) {
      seen[static_cast<size_t>(w)] += 1;
      for (int64_t t = 0; t < kBlock; ++t) {
        x.push_back(stream_[static_cast<size_t>(w * kBlock + t)]);
        y.push_back(stream_[static_cast<size_t>(w * kBlock + t + 1)]);
      }
    }
    const int64_t rows = static_cast<int64_t>(windows.size());
    Tensor xs = tensor(x, {rows, kBlock}), ys = tensor(y, {rows, kBlock});
    return {rows * kBlock, [this, xs, ys] { return model_.loss(xs, ys); }};
  }
  std::vector<int64_t> seen = std::vector<int64_t>(kBatch * kSteps, 0);

 private:
  models::GPT& model_;
  std::vector<int64_t> stream_;
};

int train(testing::Checker& check, const std::string& out, const std::string& dtype, int64_t accumulate) {
  manual_seed(7);
  models::GPTConfig c = models::GPTConfig::named("tiny", kVocab);
  c.block_size = kBlock, c.dropout = 0.0;
  models::GPT model(c);
  if (dtype == "float64") model.to(DType::Float64);
  // DIST_CHECK_DEVICE=emulated: the same run on the emulated device (tests/dist.sh, section 7).
  const char* device = std::getenv("DIST_CHECK_DEVICE");
  if (device && *device) model.to(Device::parse(device));
  optim::AdamWOptions ao;
  ao.lr = 3e-3, ao.beta1 = 0.9, ao.beta2 = 0.95, ao.weight_decay = 0.1;
  optim::AdamW adamw({{model.decay_parameters(), std::nullopt, 0.1}, {model.no_decay_parameters(), std::nullopt, 0.0}},
                     ao);
  apps::TrainerOptions to;
  to.progress = false, to.clip_norm = 1.0, to.seed = 3, to.accumulate = accumulate;
  // Small buckets: many of them, so that the overlapped all-reduce starts some during the backward
  // and has to keep them in order.
  to.first_bucket_bytes = 2048, to.bucket_bytes = 8192;
  apps::Trainer trainer(model, adamw, nullptr, to);
  Windows data(model, token_stream());
  auto result = trainer.fit(data);
  // Disjoint and complete: every window of the epoch was given to exactly one rank.
  Tensor seen = tensor(data.seen, {static_cast<int64_t>(data.seen.size())});
  dist::allreduce_(seen);
  for (int64_t count : seen.to_vector<int64_t>())
    if (!check.expect(count == 1, fmt::format("a window was given to {} ranks (expected exactly 1)", count)))
      return testing::Checker::kFailed;
  if (const dist::GradReducer* r = trainer.reducer(); r && r->overlap())
    check.expect(r->started_early() > 0, "overlap is on, but no bucket's all-reduce started during a backward");
  if (dist::is_main()) {
    if (const dist::GradReducer* r = trainer.reducer())
      check.note(fmt::format("{} buckets, overlap {}, {} started during a backward over {} steps", r->buckets(),
                             r->overlap() ? "on" : "off", r->started_early(), result.steps));
    model.save(out, {});
    check.note(fmt::format("{} rank(s), {} steps, loss {:.6f}, {} windows each given to one rank; all-reduce {:.3f} ms "
                           "per step", dist::world_size(), result.steps, result.last_loss, data.seen.size(),
                           1e3 * trainer.allreduce_seconds() / static_cast<double>(std::max<int64_t>(result.steps, 1))));
  }
  return testing::Checker::kPassed;
}

// GradReducer alone, with a graph that differs by rank: c takes no gradient on rank 1, so there
// its bucket, and every bucket after it, can start only in reduce(), while rank 0 starts them all
// from the backward. The buckets must still meet in the same order: one parameter each, each of
// its own size, so a mismatched pair would fail in MPI or not sum to the values checked.
int reducer_check(testing::Checker& check) {
  const int rank = dist::rank(), world = dist::world_size();
  auto param = [](int64_t n) { return zeros({n}, kFloat64).requires_grad_(); };
  Tensor a = param(5), b = param(6), c = param(7), d = param(8);
  // Registered before the reducer's hooks: runs before its hook on a, the last gradient finished.
  const dist::GradReducer* seen_by = nullptr;
  int64_t started_before_a = -1;
  a.register_post_accumulate_grad_hook([&](const Tensor&) { started_before_a = seen_by->started_early(); });
  dist::GradReducer reducer({a, b, c, d}, 1, 1, true);  // 1-byte buckets: one per parameter
  seen_by = &reducer;
  if (!check.expect((world == 1 || reducer.overlap()) && reducer.buckets() == 4,
                    "reducer: expected 4 buckets with overlap on"))
    return testing::Checker::kFailed;
  // Rank r: loss = (r + 1) * ((((a.sum() * 2 + b.sum()) * 3 + c.sum()) * 4 + d.sum()), c on rank 0 only.
  const double ranks = world * (world + 1) / 2.0;  // the sum of (r + 1) over the ranks
  const double want_a = 24 * ranks, want_b = 12 * ranks, want_c = 4, want_d = ranks;
  for (int step = 0; step < 2; ++step) {
    for (Tensor* p : {&a, &b, &c, &d}) p->zero_grad();
    started_before_a = -1;
    reducer.prepare();
    Tensor x = a.sum() * 2.0 + b.sum();
    x = x * 3.0;
    if (rank == 0) x = x + c.sum();
    Tensor loss = (x * 4.0 + d.sum()) * static_cast<double>(rank + 1);
    loss.backward();
    reducer.reduce(0.5);
    auto grad_is = [&](const Tensor& p, double want, const char* name) {
      for (double v : p.grad().to_vector<double>())
        if (!check.expect(std::abs(v - 0.5 * want) <= 1e-12, fmt::format("reducer: step {}: {}'s gradient is {}, "
                                                                         "expected {}", step, name, v, 0.5 * want)))
          return false;
      return true;
    };
    if (!grad_is(a, want_a, "a") || !grad_is(b, want_b, "b") || !grad_is(c, want_c, "c") || !grad_is(d, want_d, "d"))
      return testing::Checker::kFailed;
    // d's bucket is first and finished first: it started before the backward reached a.
    check.expect(world == 1 || started_before_a >= 1, "reducer: no bucket had started when a's gradient was done");
  }
  // Rank 0 started every bucket from the backward; rank 1 only d's (c's held back the rest).
  const int64_t want_early = world == 1 ? 0 : rank == 0 ? 8 : 2;
  check.expect(reducer.started_early() == want_early, fmt::format("reducer: {} buckets started from the backward, "
                                                                 "expected {}", reducer.started_early(), want_early));
  check.note(fmt::format("reducer: {} rank(s), buckets in one order across ranks whose gradients finish differently",
                         world));
  return testing::Checker::kPassed;
}

int compare(testing::Checker& check, const std::string& a, const std::string& b, double tolerance) {
  auto ta = nn::load_safetensors(a).as_map(), tb = nn::load_safetensors(b).as_map();
  if (!check.expect(ta.size() == tb.size(), fmt::format("{} holds {} tensors, {} {}", a, ta.size(), b, tb.size())))
    return testing::Checker::kFailed;
  double worst = 0;
  std::string where;
  for (auto& [name, t] : ta) {
    if (!check.expect(tb.count(name) > 0, fmt::format("{} has no tensor {}", b, name))) return testing::Checker::kFailed;
    const double d = testing::max_diff(t, tb.at(name));
    if (d > worst) worst = d, where = name;
  }
  check.note(fmt::format("largest difference {:.3g} (in {}), tolerance {:.3g}", worst, where, tolerance));
  check.expect(worst <= tolerance, fmt::format("the weights differ by {:.3g} > {:.3g}", worst, tolerance));
  return testing::Checker::kPassed;
}

}  // namespace

int main(int argc, char** argv) {
  dist::init(&argc, &argv);
  if (!dist::is_main() && !std::freopen("/dev/null", "w", stdout)) return 1;  // rank 0 prints
  testing::Checker check(fmt::format("dist_check (rank {})", dist::rank()));
  const int rc = check.run([&] {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "train" && argc >= 3)
      return train(check, argv[2], argc >= 4 ? argv[3] : "float64", argc >= 5 ? std::atoll(argv[4]) : 1);
    if (mode == "reducer") return reducer_check(check);
    if (mode == "compare" && argc == 5) return compare(check, argv[2], argv[3], std::atof(argv[4]));
    std::fprintf(stderr, "usage: dist_check train OUT [float32|float64 [ACCUMULATE]] | reducer | compare A B TOLERANCE\n");
    return testing::Checker::kUsage;
  });
  // A failed rank stops the others rather than leave them waiting in a collective.
  if (rc != testing::Checker::kPassed && dist::world_size() > 1) dist::abort(rc);
  dist::finalize();
  return rc;
}
