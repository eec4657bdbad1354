// A training task added from outside the library, as a user adds one: this file and the one
// register_task line at its end. Linked into the tapestry command line (the ctest
// `task_registry`, tests/task_registry.sh), it is `tapestry train --task regression`: its flags,
// help, --print-config, run folder, checkpoints and resume come from the registry, the shared
// option rows and the run set-up (apps/tasks/task.h, apps/train/run_setup.h).
//
// The task: least squares on y = X w + 0.1 noise (w fixed by --seed), one Linear layer, SGD.
// It exits 0 when the final val mean squared error is within twice the noise's variance.
#include <cmath>
#include <cstdio>

#include "apps/tasks/task.h"
#include "apps/train/run_setup.h"
#include "apps/train/trainer.h"
#include "tapestry/nn/layers.h"
#include "tapestry/tapestry.h"

namespace {

using namespace tapestry;
using namespace tapestry::apps;

struct RegressionOptions {
  TrainerOptions trainer = [] {
    TrainerOptions t;
    t.epochs = 8, t.seed = 1, t.keep = 1, t.average = 0, t.out_dir = "runs/regression";
    return t;
  }();
  int64_t samples = 512, features = 8, batch = 32;
  double lr = 0.05;
};

OptionTable regression_table(RegressionOptions& o) {
  OptionTable trainer = trainer_options(o.trainer), t("regression");
  t.take(trainer, "out");
  t.add("samples", o.samples, "training samples (as many again are drawn for val)").positive().recipe();
  t.add("features", o.features, "inputs per sample").positive().recipe();
  t.add("batch", o.batch, "samples per batch").positive().recipe();
  t.take(trainer, "epochs");
  t.add("lr", o.lr, "SGD learning rate").above(0);
  t.take(trainer, "seed").recipe();
  add_run_rows(t, trainer);
  return t;
}

Tensor squared_error(const Tensor& prediction, const Tensor& target) {
  const Tensor d = prediction - target;
  return (d * d).mean();
}

// Batches of consecutive rows, in a seeded order per epoch.
class RegressionData : public DataSource {
 public:
  RegressionData(nn::Linear& model, Tensor x, Tensor y, int64_t batch, uint64_t seed)
      : model_(model), x_(std::move(x)), y_(std::move(y)), batch_(batch), seed_(seed) {}
  int64_t plan(int64_t epoch) override {
    Generator gen(seed_ * 1000 + static_cast<uint64_t>(epoch));
    order_ = randperm(x_.size(0), DType::Int64, &gen);
    return (x_.size(0) + batch_ - 1) / batch_;
  }
  TrainBatch batch(int64_t i) override {
    const Tensor rows = order_.slice(0, i * batch_, std::min(x_.size(0), (i + 1) * batch_));
    const Tensor x = x_.index_select(0, rows), y = y_.index_select(0, rows);
    return {x.size(0), [this, x, y] { return squared_error(model_.forward(x), y); }};
  }

 private:
  nn::Linear& model_;
  Tensor x_, y_, order_;
  int64_t batch_;
  uint64_t seed_;
};

int run_regression(const RegressionOptions& options) {
  RegressionOptions o = options;
  RunSetup run(regression_table(o), o.trainer);
  Generator data_gen(o.trainer.seed);
  const Tensor w = randn({o.features, 1}, {}, &data_gen);
  auto draw = [&](Tensor& x, Tensor& y) {
    x = randn({o.samples, o.features}, {}, &data_gen);
    y = matmul(x, w) + randn({o.samples, 1}, {}, &data_gen) * 0.1;
  };
  Tensor x, y, val_x, val_y;
  draw(x, y), draw(val_x, val_y);
  run.open();

  nn::Linear model(o.features, 1);
  optim::SGDOptions so;
  so.lr = o.lr;
  optim::SGD sgd(model.parameters(), so);
  Trainer trainer(model, sgd, nullptr, run.record({{"task", "regression"}}, {{"task", "regression"}}, "least squares"));
  trainer.evaluate = [&](int64_t, int64_t) {
    NoGradGuard no_grad;
    return Metrics{{"val_mse", "val MSE", squared_error(model.forward(val_x), val_y).item<double>(), 5, "", false}};
  };
  RegressionData data(model, x, y, o.batch, o.trainer.seed);
  const FitResult fit = trainer.fit(data);
  if (fit.stopped || fit.interrupted) return exit_status(fit.interrupted);
  const double mse = metric(fit.last_metrics, "val_mse");
  std::printf("final: val MSE %.5f after %lld steps (the noise's variance is 0.01)\n", mse, (long long)fit.steps);
  return mse < 0.02 ? 0 : 1;
}

Task regression_task() {
  TaskSpec<RegressionOptions> t;
  t.name = "regression", t.summary = "least squares, the task a test adds";
  t.table = regression_table;
  t.run = run_regression;
  return make_task(std::move(t));
}

const bool registered = (register_task(regression_task()), true);  // the one registry line

}  // namespace
