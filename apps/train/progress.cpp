// What a training run shows (see progress.h).
#include "apps/train/progress.h"

#include <unistd.h>

#include <cstdio>

#include "apps/eval/plot.h"

namespace tapestry::apps {

namespace {

// One line redrawn in place on a terminal; on a pipe, a line each time `done` (batches, moving
// from `before`) crosses a tenth of the epoch.
void progress_line(int64_t epoch, int64_t before, int64_t done, int64_t total, int64_t step, double loss, double rate,
                   const std::string& unit, double lr, double eta, bool tty) {
  const int width = 24;
  int filled = static_cast<int>(width * done / std::max<int64_t>(total, 1));
  std::string bar = std::string(filled, '#') + std::string(width - filled, '.');
  std::string line = fmt::format("epoch {:>2} [{}] {:>4}/{} step {} | loss {:.3f} | {:.0f} {}/s | lr {:.2e} | ETA {}",
                                 epoch, bar, done, total, step, loss, rate, unit, lr, clock_text(eta));
  if (tty) {
    std::fprintf(stderr, "\r%s", line.c_str());
    if (done == total) std::fprintf(stderr, "\n");
  } else if (done == total || done * 10 / std::max<int64_t>(total, 1) != before * 10 / std::max<int64_t>(total, 1)) {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

}  // namespace

std::string metrics_text(const Metrics& metrics) {
  std::string text;
  for (const Metric& m : metrics) text += fmt::format(", {} {:.{}f}{}", m.label, m.value, m.decimals, m.note);
  return text;
}

Progress::Progress(const TrainerOptions& options)
    : o_(options), shows_(options.progress && dist::is_main()), tty_(shows_ && ::isatty(2)) {}

void Progress::begin_epoch(int64_t epoch, int64_t batches, int64_t first_batch, int64_t first_tokens) {
  epoch_ = epoch, batches_ = batches, first_batch_ = first_batch, first_tokens_ = first_tokens;
  epoch_start_ = std::chrono::steady_clock::now();
}

double Progress::epoch_seconds() const { return seconds_since(epoch_start_); }

void Progress::after_step(int64_t before, int64_t done, int64_t step, double loss_sum, int64_t tokens, double lr) {
  if (!shows_) return;
  const double el = epoch_seconds();
  progress_line(epoch_, before, done, batches_, step, loss_sum / static_cast<double>(tokens),
                static_cast<double>(tokens - first_tokens_) / el, o_.rate_unit, lr,
                el / static_cast<double>(done - first_batch_) * static_cast<double>(batches_ - done), tty_);
}

void Progress::end_line() {
  if (tty_) std::fprintf(stderr, "\n");
}

void Progress::log_step(int64_t step, int64_t epoch, const StepResult& r, double lr) {
  if (o_.step_log.empty() || !dist::is_main()) return;
  // Appended and closed each step, so that the log survives a kill up to the last step.
  FILE* f = std::fopen(o_.step_log.c_str(), "a");
  TP_CHECK(f, "train: cannot write the step log {}", o_.step_log);
  std::fprintf(f, "%lld\t%lld\t%.17g\t%lld\t%.17g\t%.17g\n", (long long)step, (long long)epoch, r.loss,
               (long long)r.tokens, lr, r.grad_norm);
  std::fclose(f);
}

void Progress::epoch_line(const EpochRecord& rec, double run_seconds, int64_t skipped_steps) {
  std::string line = fmt::format("epoch {}: train loss {:.3f}{}", rec.epoch, rec.train_loss, metrics_text(rec.metrics));
  line += fmt::format(", {:.0f} s, {:.0f} {}/s, elapsed {}", rec.seconds, rec.tokens_per_s, o_.rate_unit,
                      clock_text(run_seconds));
  if (skipped_steps) line += fmt::format(", {} steps skipped so far", skipped_steps);
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

// The curves so far (an interrupted run keeps its picture); epochs before a resume are not in
// this process, so a resumed run plots from where it resumed.
void Progress::draw_curves(const std::vector<EpochRecord>& epochs) {
  if (o_.out_dir.empty() || !dist::is_main() || epochs.empty()) return;
  std::vector<Series> series{{"train loss", "#1f77b4", {}}};
  const char* colors[] = {"#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"};
  for (size_t k = 0; k < epochs.back().metrics.size(); ++k) {
    const Metric& m = epochs.back().metrics[k];
    series.push_back({m.label + m.note, colors[k % 5], {}, m.own_axis});
  }
  for (const EpochRecord& e : epochs) {
    series[0].y.push_back(e.train_loss);
    for (size_t k = 0; k + 1 < series.size() && k < e.metrics.size(); ++k) series[k + 1].y.push_back(e.metrics[k].value);
  }
  write_svg_chart(o_.out_dir + "/curves.svg", o_.curves_title, series);
}

void Progress::dist_summary(const dist::GradReducer& reducer, double steps, double allreduce_seconds,
                            double train_seconds) {
  const double per_step = allreduce_seconds / steps;
  std::printf("dist: %d ranks; each step all-reduces %.1f MiB of gradients in %zu bucket(s), %s: %.2f ms per step "
              "(%.2f ms waiting after the backward, %.2f ms in its hooks), %.1f%% of the training time\n",
              dist::world_size(), static_cast<double>(reducer.bytes()) / (1 << 20), reducer.buckets(),
              reducer.overlap() ? fmt::format("{:.1f} per step started during the backward",
                                              static_cast<double>(reducer.started_early()) / steps).c_str()
                                : fmt::format("after the backward ({})", reducer.overlap_note()).c_str(),
              1e3 * per_step, 1e3 * reducer.seconds() / steps, 1e3 * reducer.hook_seconds() / steps,
              100 * allreduce_seconds / std::max(1e-9, train_seconds));
}

}  // namespace tapestry::apps
