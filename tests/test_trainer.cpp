// The Trainer on its own, with a toy task (least squares on y = 2x - 1 + noise, a Linear model):
// what every task relies on, whatever its model. The translation and copy tasks test it end to
// end (tests/test_translation.cpp, tests/test_transformer.cpp).
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "apps/train/trainer.h"
#include "tests/helpers.h"

using namespace tapestry;
using namespace tapestry::testing;

namespace {

// 40 rows cut into batches of 3, 5, 7, ... rows (varying, so that token weighting matters), in an
// order that follows from the epoch. A row whose index is in `poison` gives a NaN loss.
struct ToyData : apps::DataSource {
  ToyData(nn::Linear& model) : model(model) {
    Generator g(7);
    x = randn({40, 1}, {}, &g);
    y = x * 2.0 - 1.0 + randn({40, 1}, {}, &g) * 0.1;
  }
  int64_t plan(int64_t epoch) override {
    starts.clear();
    for (int64_t start = 0, size = 3; start < 40; start += size, size += 2) starts.push_back({start, std::min<int64_t>(size, 40 - start)});
    if (epoch % 2 == 0) std::reverse(starts.begin(), starts.end());
    return static_cast<int64_t>(starts.size());
  }
  apps::TrainBatch batch(int64_t i) override {
    auto [start, rows] = starts.at(static_cast<size_t>(i));
    return rows_batch(start, rows);
  }
  apps::TrainBatch rows_batch(int64_t start, int64_t rows) {
    Tensor xs = x.slice(0, start, start + rows), ys = y.slice(0, start, start + rows);
    bool bad = poison >= start && poison < start + rows;
    return {rows, [this, xs, ys, bad] {
              Tensor loss = (model.forward(xs) - ys).pow(2.0).mean();
              return bad ? loss * std::nan("") : loss;
            }};
  }
  nn::Linear& model;
  Tensor x, y;
  std::vector<std::pair<int64_t, int64_t>> starts;
  int64_t poison = -1;
};


// A Trainer data source of 5 batches per epoch fitting y = 1 with a Linear on x = 1.
struct OnesData : apps::DataSource {
  explicit OnesData(nn::Linear& m) : model(m) {}
  int64_t plan(int64_t) override { return 5; }
  apps::TrainBatch batch(int64_t) override {
    return {4, [this] { return (model.forward(ones({4, 1})) - 1.0).pow(2.0).mean(); }};
  }
  nn::Linear& model;
};

// OnesData whose every batch sleeps 40 ms: an epoch of 5 takes at least 0.2 s, for the tests of
// planning to a time limit.
struct SlowData : OnesData {
  using OnesData::OnesData;
  apps::TrainBatch batch(int64_t i) override {
    usleep(40000);
    return OnesData::batch(i);
  }
};

// A Linear(1, 1) from `seed` with SGD at 0.01 under an inverse-sqrt schedule: the deadline and
// cooldown tests' model, whose logged learning rate they compare with the schedule's.
struct ScheduledLinear {
  struct Seeded {
    explicit Seeded(uint64_t seed) { manual_seed(seed); }
  } seeded;
  nn::Linear model{1, 1};
  optim::SGD sgd{model.parameters(), [] {
                   optim::SGDOptions so;
                   so.lr = 0.01;
                   return so;
                 }()};
  const optim::InverseSqrtSchedule schedule{0.01, 1};
  explicit ScheduledLinear(uint64_t seed) : seeded(seed) {}
};

// The lines of a --step-log file: step, epoch and the learning rate used.
struct LoggedStep {
  int64_t step = 0, epoch = 0;
  double lr = 0;
};
std::vector<LoggedStep> read_step_log(const std::string& path) {
  std::vector<LoggedStep> steps;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> f;
    std::stringstream cells(line);
    for (std::string c; std::getline(cells, c, '\t');) f.push_back(c);
    REQUIRE(f.size() >= 5);
    steps.push_back({std::stoll(f[0]), std::stoll(f[1]), std::stod(f[4])});
  }
  return steps;
}
// The logged learning rate over the schedule's, step by step: the cooldown's ramp (1 outside it).
double scale_of(const LoggedStep& l, const optim::Schedule& schedule) { return l.lr / schedule.lr(l.step); }


// A Linear(1, 1) from seed 3 fitted on ToyData with Adam into the run folder `dir` (recipe rows
// = 40), with the options `set` gives; its weight in `weight` when asked.
apps::FitResult fit_toy(const std::string& dir, const std::function<void(apps::TrainerOptions&)>& set,
                        std::vector<double>* weight = nullptr) {
  manual_seed(3);
  nn::Linear model(1, 1);
  ToyData data(model);
  optim::Adam adam(model.parameters(), optim::AdamOptions{});
  apps::TrainerOptions o;
  o.progress = false, o.out_dir = dir, o.recipe = {{"rows", "40"}};
  set(o);
  std::filesystem::create_directories(dir);
  apps::Trainer trainer(model, adam, nullptr, o);
  apps::FitResult r = trainer.fit(data);
  if (weight) *weight = values(model.weight.detach());
  return r;
}

int64_t lines(const std::string& path) {
  std::ifstream in(path);
  return std::count(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>(), '\n');
}

}  // namespace

TEST_CASE("Trainer::step: accumulated batches give the gradient of one batch, weighted by tokens") {
  manual_seed(1);
  nn::Linear a(1, 1), b(1, 1);
  b.load_state_dict({{"weight", a.weight.detach()}, {"bias", a.bias.detach()}});
  ToyData da(a), db(b);
  optim::SGDOptions so;
  so.lr = 0.1;
  optim::SGD sa(a.parameters(), so), sb(b.parameters(), so);
  apps::TrainerOptions o;
  o.progress = false;
  apps::Trainer ta(a, sa, nullptr, o), tb(b, sb, nullptr, o);
  apps::StepResult one = ta.step({da.rows_batch(0, 8)});
  apps::StepResult two = tb.step({db.rows_batch(0, 3), db.rows_batch(3, 5)});
  CHECK(one.tokens == 8);
  CHECK(two.tokens == 8);
  CHECK(two.loss == doctest::Approx(one.loss).epsilon(1e-6));
  CHECK(two.grad_norm == doctest::Approx(one.grad_norm).epsilon(1e-5));
  check_values(b.weight.detach(), values(a.weight.detach()), 1e-6);
  check_values(b.bias.detach(), values(a.bias.detach()), 1e-6);
  CHECK(ta.steps_taken() == 1);
  CHECK(error_of([&] { ta.step({}); }).find("at least one batch") != std::string::npos);
}

TEST_CASE("Trainer::fit: epochs, the evaluation hook, the step log, keep, best, averaging and curves") {
  manual_seed(2);
  nn::Linear model(1, 1);
  ToyData data(model);
  optim::AdamOptions ao;
  ao.lr = 0.05;
  optim::Adam adam(model.parameters(), ao);
  apps::TrainerOptions o;
  o.epochs = 4, o.accumulate = 2, o.progress = false, o.keep = 2, o.average = 2;
  o.out_dir = fresh_temp_dir("fit");
  o.step_log = o.out_dir + ".steps.tsv";
  o.best_metric = "neg_loss";
  o.recipe = {{"toy", "1"}};
  o.model_metadata = {{"kind", "linear"}};
  o.run_files = {{"notes.txt", "toy run\n"}};
  o.curves_title = "toy";
  std::filesystem::create_directories(o.out_dir);
  std::remove(o.step_log.c_str());
  apps::Trainer trainer(model, adam, nullptr, o);
  int evaluations = 0;
  trainer.evaluate = [&](int64_t, int64_t) {
    ++evaluations;
    CHECK_FALSE(model.is_training());
    NoGradGuard no_grad;
    double mse = (model.forward(data.x) - data.y).pow(2.0).mean().item<double>();
    return apps::Metrics{{"val_loss", "val loss", mse, 4, "", false}, {"neg_loss", "-val loss", -mse, 4, "", true}};
  };
  apps::FitResult r = trainer.fit(data);
  CHECK(evaluations == 4);
  REQUIRE(r.epochs.size() == 4);
  CHECK(r.steps == 4 * 3);  // 40 rows in 6 batches, 2 per step
  CHECK(lines(o.step_log) == r.steps);
  CHECK(r.epochs[3].train_loss < r.epochs[0].train_loss);
  CHECK(apps::metric(r.epochs[3].metrics, "val_loss") < apps::metric(r.epochs[0].metrics, "val_loss"));
  CHECK(r.best_epoch >= 1);
  CHECK(r.averaged == 2);
  for (const char* f : {"checkpoint.safetensors", "model.safetensors", "model.best.safetensors", "model.avg.safetensors",
                        "model.epoch3.safetensors", "model.epoch4.safetensors", "curves.svg", "notes.txt"}) {
    INFO(f);
    CHECK(std::filesystem::exists(o.out_dir + "/" + f));
  }
  CHECK_FALSE(std::filesystem::exists(o.out_dir + "/model.epoch2.safetensors"));  // keep = 2
  auto best = nn::load_safetensors(o.out_dir + "/model.best.safetensors").metadata;
  CHECK(best.at("kind") == "linear");
  CHECK(best.at("epoch") == std::to_string(r.best_epoch));
  CHECK(apps::metric(r.epochs[3].metrics, "neg_loss") == -apps::metric(r.epochs[3].metrics, "val_loss"));
  CHECK(error_of([&] { apps::metric(r.epochs[0].metrics, "bleu"); }).find("no metric 'bleu'") != std::string::npos);
  std::filesystem::remove_all(o.out_dir);
  std::remove(o.step_log.c_str());
}

TEST_CASE("Trainer::fit: interrupted and resumed, the run ends where an uninterrupted one does, to the bit") {
  auto run = [](int64_t stop_after, bool resume, const std::string& dir) {
    std::vector<double> weight;
    apps::FitResult r = fit_toy(dir, [&](apps::TrainerOptions& o) {
      o.epochs = 3, o.stop_after = stop_after, o.resume = resume, o.save_every = 4, o.average = 0;
    }, &weight);
    return std::make_pair(r, weight);
  };
  const std::string straight_dir = fresh_temp_dir("straight"), dir = fresh_temp_dir("resumed");
  auto [straight, w_straight] = run(0, false, straight_dir);
  auto [first, w_first] = run(9, false, dir);  // mid-epoch 2 (6 steps per epoch)
  CHECK(first.stopped);
  auto [resumed, w_resumed] = run(0, true, dir);
  CHECK(w_resumed == w_straight);  // exactly
  REQUIRE(resumed.epochs.size() == 2);
  CHECK(resumed.epochs[1].train_loss == straight.epochs[2].train_loss);
  CHECK(resumed.epochs[0].train_loss == straight.epochs[1].train_loss);  // the epoch's loss carried over
  // Resume refuses a checkpoint of another recipe.
  manual_seed(3);
  nn::Linear model(1, 1);
  ToyData data(model);
  optim::Adam adam(model.parameters(), optim::AdamOptions{});
  apps::TrainerOptions o;
  o.progress = false, o.out_dir = dir, o.resume = true, o.recipe = {{"rows", "80"}};
  apps::Trainer trainer(model, adam, nullptr, o);
  CHECK(error_of([&] { trainer.fit(data); }).find("was trained with rows = 40, but this run has rows = 80") !=
        std::string::npos);
  // A checkpoint written by 2 processes (mpirun -np 2) is refused on 1, with the way out named,
  // unless reshard; one without the entry (older) counts as 1 process.
  {
    const std::string ckpt = dir + "/checkpoint.safetensors";
    auto file = nn::load_safetensors(ckpt);
    CHECK(file.metadata.at("world_size") == "1");
    file.metadata["world_size"] = "2";
    file.metadata.erase(nn::kChecksumKey);
    nn::save_safetensors(ckpt, file.tensors, file.metadata);
    manual_seed(3);
    nn::Linear m2(1, 1);
    ToyData d2(m2);
    optim::Adam a2(m2.parameters(), optim::AdamOptions{});
    apps::TrainerOptions o2;
    o2.epochs = 3, o2.progress = false, o2.out_dir = dir, o2.resume = true, o2.average = 0;
    o2.recipe = {{"rows", "40"}};
    apps::Trainer t2(m2, a2, nullptr, o2);
    const std::string e = error_of([&] { t2.fit(d2); });
    CHECK(e.find("was written by a run on 2 processes, and this one has 1") != std::string::npos);
    CHECK(e.find("mpirun -np 2") != std::string::npos);
    CHECK(e.find("--reshard") != std::string::npos);
    o2.reshard = true;
    apps::Trainer t3(m2, a2, nullptr, o2);
    CHECK(t3.fit(d2).steps == 18);
  }
  std::filesystem::remove_all(straight_dir);
  std::filesystem::remove_all(dir);
}

TEST_CASE("Trainer::fit: should_stop ends early - a non-finite loss stops, or is skipped with on_nan = skip") {
  manual_seed(4);
  nn::Linear model(1, 1);
  ToyData data(model);
  optim::SGDOptions so;
  so.lr = 0.05;
  optim::SGD sgd(model.parameters(), so);
  apps::TrainerOptions o;
  o.epochs = 50, o.progress = false, o.eval_every = 2;
  apps::Trainer trainer(model, sgd, nullptr, o);
  trainer.evaluate = [&](int64_t, int64_t step) { return apps::Metrics{{"step", "step", double(step), 0, "", false}}; };
  trainer.should_stop = [](const apps::Metrics& m) { return apps::metric(m, "step") >= 5; };
  apps::FitResult r = trainer.fit(data);
  CHECK(r.finished_early);
  CHECK(r.steps == 6);  // evaluated every 2 steps: 2, 4, 6

  data.poison = 0;  // the batch holding row 0 gives NaN
  o.epochs = 1, o.eval_every = 0;
  apps::Trainer stops(model, sgd, nullptr, o);
  CHECK(error_of([&] { stops.fit(data); }).find("a non-finite loss") != std::string::npos);
  o.on_nan = "skip";
  apps::Trainer skips(model, sgd, nullptr, o);
  Tensor before = model.weight.detach().clone();
  apps::FitResult s = skips.fit(data);
  CHECK(s.skipped_steps == 1);
  CHECK(s.steps == 5);
  CHECK(std::isfinite(values(model.weight.detach())[0]));
  CHECK(values(model.weight.detach()) != values(before));
}

TEST_CASE("TrainerOptions are checked") {
  nn::Linear model(1, 1);
  optim::SGD sgd(model.parameters(), optim::SGDOptions{});
  auto error_with = [&](auto change) {
    apps::TrainerOptions o;
    change(o);
    return error_of([&] { apps::Trainer t(model, sgd, nullptr, o); });
  };
  CHECK(error_with([](auto& o) { o.accumulate = 0; }).find("train: --accumulate: must be a positive integer, got '0'") != std::string::npos);
  CHECK(error_with([](auto& o) { o.clip_norm = -1; }).find("train: --clip-norm: must be a number >= 0, got '-1.0'") != std::string::npos);
  CHECK(error_with([](auto& o) { o.on_nan = "maybe"; }).find("train: --on-nan: must be stop or skip, got 'maybe'") != std::string::npos);
  CHECK(error_with([](auto& o) { o.epochs = 0; }).find("train: --epochs: must be a positive integer, got '0'") != std::string::npos);
  apps::TrainerOptions o;
  o.save_every = 5;  // without a run folder
  apps::Trainer t(model, sgd, nullptr, o);
  ToyData data(model);
  CHECK(error_of([&] { t.fit(data); }).find("need a run folder") != std::string::npos);
}

TEST_CASE("Trainer: resume refuses damaged metadata - a batch past the epoch, a NaN loss sum") {
  // Issue 44: a huge next_batch skipped an epoch silently (train loss 0.000, 0 tok/s), and a NaN
  // loss sum resumed.
  const std::string dir = fresh_temp_dir("damaged_meta");
  auto run = [&](int64_t stop_after, bool resume) {
    return error_of([&] {
      fit_toy(dir, [&](apps::TrainerOptions& o) {
        o.epochs = 3, o.stop_after = stop_after, o.resume = resume, o.average = 0;
      });
    });
  };
  CHECK(run(9, false).empty());  // stops mid-epoch 2, at batch 3 of 6
  const std::string ckpt = dir + "/checkpoint.safetensors";
  const auto saved = nn::load_safetensors(ckpt);
  auto damage = [&](const std::string& key, const std::string& value) {
    auto file = saved;
    file.metadata[key] = value;
    file.metadata.erase(nn::kChecksumKey);
    nn::save_safetensors(ckpt, file.tensors, file.metadata);
  };
  damage("next_batch", "1000000");
  CHECK(run(0, true).find("next batch 1000000 is past the 6 batches of epoch 2") != std::string::npos);
  damage("epoch_loss_sum", "nan");
  CHECK(run(0, true).find("'epoch_loss_sum' is 'nan', not a finite number") != std::string::npos);
  damage("next_batch", "3");  // as saved: resumes
  CHECK(run(0, true).empty());
  std::filesystem::remove_all(dir);
}

TEST_CASE("Trainer: a run cut by its time limit averages the last epochs it reached") {
  // Issue 47: planned for 5 epochs with average 3 and cut in epoch 3, the run must average epochs
  // 1-3 (what it has), not look for 3-5 and find epoch 3 alone. The cut is made deterministic by
  // a resume: the first session stops after epoch 2's checkpoint, the second runs out of time at
  // its first step, which ends epoch 3 (evaluated and saved).
  const std::string dir = fresh_temp_dir("cut_average");
  auto run = [&](int64_t stop_after, double time_limit, bool resume) {
    return fit_toy(dir, [&](apps::TrainerOptions& o) {
      o.epochs = 5, o.stop_after = stop_after, o.resume = resume, o.keep = 5, o.average = 3, o.time_limit = time_limit;
    });
  };
  CHECK(run(13, 0, false).stopped);  // 6 steps per epoch: the first step of epoch 3
  const apps::FitResult cut = run(0, 1e-9, true);
  CHECK(cut.out_of_time);
  REQUIRE_FALSE(cut.epochs.empty());
  CHECK(cut.epochs.back().epoch == 3);
  CHECK(cut.averaged == 3);
  for (int e = 1; e <= 3; ++e) CHECK(std::filesystem::exists(dir + "/model.epoch" + std::to_string(e) + ".safetensors"));
  CHECK(std::filesystem::exists(dir + "/model.avg.safetensors"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("Planning to the deadline: the epochs that fit, and the cooldown's ramp") {
  using apps::cooldown_lr_scale;
  using apps::epochs_that_fit;
  CHECK(epochs_that_fit(100, {}, 0, 18) == 18);           // nothing measured yet: the recipe's
  CHECK(epochs_that_fit(1000, {100}, 1, 18) == 11);       // 10 more
  CHECK(epochs_that_fit(1000, {100, 125}, 2, 18) == 10);  // with the slower of the last two: 8 more
  CHECK(epochs_that_fit(1000, {125, 100}, 2, 18) == 10);
  CHECK(epochs_that_fit(1000, {300, 100, 100}, 3, 18) == 13);  // an old slow epoch is forgotten
  CHECK(epochs_that_fit(1e6, {100}, 1, 18) == 18);        // never past the recipe
  CHECK(epochs_that_fit(50, {100}, 3, 18) == 3);          // no room for another: ends now
  CHECK(epochs_that_fit(-5, {100}, 3, 18) == 3);
  CHECK(epochs_that_fit(1000, {0.0}, 1, 18) == 18);
  // The ramp: 1 before the window, then linear to 0 at the last epoch's end, by batches.
  CHECK(cooldown_lr_scale(14, 9, 10, 18, 0) == 1.0);   // no window: the recipe's own schedule
  CHECK(cooldown_lr_scale(5, 9, 10, 10, 5) == 1.0);    // the window is epochs 6-10
  CHECK(cooldown_lr_scale(6, 0, 10, 10, 5) == 1.0);
  CHECK(cooldown_lr_scale(6, 5, 10, 10, 5) == doctest::Approx(0.9));
  CHECK(cooldown_lr_scale(8, 0, 10, 10, 5) == doctest::Approx(0.6));
  CHECK(cooldown_lr_scale(10, 9, 10, 10, 5) == doctest::Approx(0.02));
  CHECK(cooldown_lr_scale(3, 0, 10, 3, 5) == doctest::Approx(0.2));  // a window longer than the run began before
  // it (the Trainer clamps its window to the run: Trainer::cooldown_epochs)
  CHECK(cooldown_lr_scale(1, 0, 0, 3, 2) == 1.0);   // an empty epoch
}

TEST_CASE("Trainer: --cooldown ramps the schedule's rate to zero over the run's last epochs") {
  ScheduledLinear run(24);
  nn::Linear& model = run.model;
  optim::SGD& sgd = run.sgd;
  const optim::InverseSqrtSchedule& schedule = run.schedule;
  OnesData data(model);
  const std::string dir = fresh_temp_dir("cooldown"), log = dir + "/steps.tsv";
  apps::TrainerOptions o;
  o.epochs = 6, o.progress = false, o.cooldown = 2, o.step_log = log;
  apps::Trainer trainer(model, sgd, &schedule, o);
  CHECK(trainer.fit(data).epochs.size() == 6);
  std::vector<double> scale;  // step by step, 5 a epoch
  for (const LoggedStep& l : read_step_log(log)) scale.push_back(scale_of(l, schedule));
  REQUIRE(scale.size() == 30);
  for (int i = 0; i < 20; ++i) CHECK(scale[i] == doctest::Approx(1.0));  // epochs 1-4: the schedule's
  for (int i = 20; i < 30; ++i) CHECK(scale[i] == doctest::Approx(1.0 - (i - 20) / 10.0));  // 5-6: 1, 0.9, ..., 0.1
  // Without a schedule there is no rate to ramp: refused, not ignored.
  CHECK_THROWS_WITH_AS(apps::Trainer(model, sgd, nullptr, o),
                       doctest::Contains("cooldown 2 ramps a learning-rate schedule's rate"), Error);
  std::filesystem::remove_all(dir);
}

TEST_CASE("Trainer: a --cooldown longer than the run ramps over all of it, from the schedule's rate") {
  ScheduledLinear run(25);
  OnesData data(run.model);
  const std::string dir = fresh_temp_dir("long-cooldown"), log = dir + "/steps.tsv";
  apps::TrainerOptions o;
  o.epochs = 2, o.progress = false, o.cooldown = 5, o.step_log = log;  // the Multi30k recipe's 5 over --epochs 2
  apps::Trainer trainer(run.model, run.sgd, &run.schedule, o);
  trainer.fit(data);
  const std::vector<LoggedStep> steps = read_step_log(log);
  REQUIRE(steps.size() == 10);
  for (int i = 0; i < 10; ++i)  // 1, 0.9, ..., 0.1 (it began at 0.4 of the rate before the window was clamped)
    CHECK(scale_of(steps[i], run.schedule) == doctest::Approx(1.0 - i / 10.0));
  std::filesystem::remove_all(dir);
}

TEST_CASE("Trainer: a run resumed inside the ramp of its plan keeps the plan") {
  // A limit of 3 s fits about 14 epochs of 0.2 s, and --cooldown 30 (clamped to the plan) puts
  // the whole plan in the ramp. Stopped after epoch 2, the run is resumed without a time limit:
  // it still ends with the planned epoch, its rate going on falling from where it was, instead of
  // going back up to a ramp over the 30 epochs of --epochs.
  ScheduledLinear run(26);
  SlowData data(run.model);
  const std::string dir = fresh_temp_dir("resume-plan");
  apps::TrainerOptions o;
  o.epochs = 30, o.progress = false, o.time_limit = 3.0, o.cooldown = 30, o.average = 5, o.stop_after = 10;
  o.out_dir = dir + "/run", o.step_log = dir + "/first.tsv";
  std::filesystem::create_directories(o.out_dir);
  apps::Trainer first(run.model, run.sgd, &run.schedule, o);
  const apps::FitResult a = first.fit(data);
  REQUIRE(a.stopped);  // (a plan of at least 3 epochs: epochs of up to 1 s fit)
  const std::vector<LoggedStep> before = read_step_log(dir + "/first.tsv");
  REQUIRE(before.size() == 10);
  const double scale_before = scale_of(before.back(), run.schedule);
  CHECK(scale_before < 0.95);  // the plan's ramp had begun
  o.time_limit = 0, o.stop_after = 0, o.resume = true, o.step_log = dir + "/second.tsv";
  apps::Trainer second(run.model, run.sgd, &run.schedule, o);
  const apps::FitResult b = second.fit(data);
  const std::vector<LoggedStep> after = read_step_log(o.step_log);
  REQUIRE_FALSE(after.empty());
  REQUIRE_FALSE(b.epochs.empty());
  const int64_t planned = b.epochs.back().epoch;
  CHECK(planned >= 3);
  CHECK(planned < 30);
  CHECK(scale_of(after.front(), run.schedule) <= scale_before);
  CHECK(scale_of(after.back(), run.schedule) == doctest::Approx(0.2 / planned));  // the ramp's end
  CHECK(b.averaged == 2);
  std::filesystem::remove_all(dir);
}

TEST_CASE("Trainer: a time limit ends the run at the last whole epoch that fits, the learning rate falling to it") {
  // Every batch sleeps 40 ms: an epoch of 5 takes at least 0.2 s, so a limit of 2 s fits about 9
  // of the 30 epochs. The last third of the plan runs at a falling fraction of the schedule's
  // rate, which --step-log records, and the run averages its last 2 epochs, not --average's 5.
  ScheduledLinear run(23);
  nn::Linear& model = run.model;
  optim::SGD& sgd = run.sgd;
  const optim::InverseSqrtSchedule& schedule = run.schedule;
  SlowData data(model);
  const std::string dir = fresh_temp_dir("deadline"), log = dir + "/steps.tsv";
  apps::TrainerOptions o;
  o.epochs = 30, o.progress = false, o.time_limit = 2.0, o.keep = 5, o.average = 5, o.step_log = log;
  o.out_dir = dir + "/run";
  std::filesystem::create_directories(o.out_dir);
  apps::Trainer trainer(model, sgd, &schedule, o);
  const apps::FitResult r = trainer.fit(data);
  o.out_dir = "";
  CHECK(r.epochs.size() >= 3);
  CHECK(r.epochs.size() < 30);
  // The plan is made again after every epoch, so a machine whose speed drifts may move the ramp's
  // end earlier while it runs (or, after a sudden stall, end the run before its ramp): what holds
  // whatever the timing is that the rate, over the schedule's, only falls.
  const auto scales = [&] {
    std::vector<std::pair<int64_t, double>> out;  // (epoch, scale), step by step
    for (const LoggedStep& l : read_step_log(log)) out.emplace_back(l.epoch, scale_of(l, schedule));
    return out;
  };
  if (!r.out_of_time) {  // (a stalled machine can still overrun the plan: the limit then cuts as before)
    CHECK(r.averaged == 2);
    const auto s = scales();
    REQUIRE_FALSE(s.empty());
    for (size_t i = 1; i < s.size(); ++i) CHECK(s[i].second <= s[i - 1].second + 1e-12);
  }
  // --cooldown 4: the ramp spans the plan's last 4 epochs instead of a third of them. The last step
  // of an epoch E under a plan ending with P >= E runs at 1 - (E - P + 3.8) / 4 of the schedule's
  // rate: 0.05 when E is the plan's last (the whole last epoch then 0.25, 0.2, ..., 0.05), else
  // 0.3, 0.55 or 0.8, or 1 before the ramp. A third of a plan of <= 10 (3 epochs) gives none of
  // these but 1.
  std::filesystem::remove(log);
  o.cooldown = 4;
  apps::Trainer longer(model, sgd, &schedule, o);
  const apps::FitResult lr = longer.fit(data);
  const int64_t last_epoch = lr.epochs.back().epoch;
  const auto s = scales();
  REQUIRE_FALSE(s.empty());
  for (size_t i = 1; i < s.size(); ++i) CHECK(s[i].second <= s[i - 1].second + 1e-12);
  const double end = s.back().second;
  if (!lr.out_of_time && last_epoch >= 5 && last_epoch <= 10)
    CHECK((end == doctest::Approx(0.05) || end == doctest::Approx(0.3) || end == doctest::Approx(0.55) ||
           end == doctest::Approx(0.8) || end == doctest::Approx(1.0)));
  if (!lr.out_of_time && last_epoch >= 5 && last_epoch <= 10 && end == doctest::Approx(0.05)) {
    std::vector<double> last;
    for (const auto& [epoch, scale] : s)
      if (epoch == last_epoch) last.push_back(scale);
    REQUIRE(last.size() == 5);
    for (int b = 0; b < 5; ++b) CHECK(last[b] == doctest::Approx(0.25 - 0.05 * b));
  }
  o.cooldown = 0;
  // "cut" keeps training until the limit.
  o.on_time_limit = "cut", o.step_log = "";
  apps::Trainer cut(model, sgd, &schedule, o);
  CHECK(cut.fit(data).out_of_time);
  std::filesystem::remove_all(dir);
}

TEST_CASE("Trainer: time_limit ends training after the step that reaches it") {
  manual_seed(22);
  nn::Linear model(1, 1);
  OnesData data(model);
  optim::SGDOptions so;
  so.lr = 0.01;
  optim::SGD sgd(model.parameters(), so);
  apps::TrainerOptions o;
  o.epochs = 3, o.progress = false, o.time_limit = 1e-9;
  int evaluations = 0;
  auto evaluate = [&](int64_t, int64_t step) {
    ++evaluations;
    return apps::Metrics{{"step", "step", static_cast<double>(step), 0, "", false}};
  };
  apps::Trainer limited(model, sgd, nullptr, o);
  limited.evaluate = evaluate;
  apps::FitResult r = limited.fit(data);
  CHECK(r.out_of_time);
  CHECK(r.steps == 1);
  CHECK_FALSE(r.stopped);
  CHECK_FALSE(r.finished_early);
  REQUIRE(r.epochs.size() == 1);  // the epoch ends there, evaluated
  CHECK(r.epochs[0].steps == 1);
  CHECK(evaluations == 1);
  CHECK(apps::metric(r.last_metrics, "step") == 1.0);

  o.time_limit = 1e6;  // never reached
  evaluations = 0;
  apps::Trainer roomy(model, sgd, nullptr, o);
  roomy.evaluate = evaluate;
  apps::FitResult full = roomy.fit(data);
  CHECK_FALSE(full.out_of_time);
  CHECK(full.steps == 15);
  CHECK(full.epochs.size() == 3);
  CHECK(evaluations == 3);
  o.time_limit = 0;  // none
  apps::Trainer unlimited(model, sgd, nullptr, o);
  CHECK(unlimited.fit(data).steps == 15);

  for (double bad : {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    INFO(bad);
    o.time_limit = bad;
    CHECK(error_of([&] { apps::Trainer t(model, sgd, nullptr, o); }).find("--time-limit") != std::string::npos);
  }
}
