// Benchmarks (`tapestry bench`). A workload is a Transformer size and a synthetic batch drawn
// from a seed; the figures are: the train step (forward + label-smoothed loss + backward + Adam
// step, the Trainer's step) as the median over `steps` after `warmup`, target tokens/s and achieved GFLOP/s;
// forward-only time; greedy decoding tokens/s with the KV cache; sgemm GFLOP/s of our matmul on
// the workload's feed-forward shape (B*T x D) @ (D x d_ff); and peak RSS. tools/reference/bench_torch.py measures the same.
// The `lm` workload is the GPT language model's default recipe instead (config mini, block 64,
// batch 32, vocabulary 4000, AdamW with parameter groups, clipping 1): train step, forward and
// sampled decoding with the KV cache; tools/lm-compare.sh is its same-budget comparison with PyTorch.
#include "tools/bench.h"
#include "tools/cli.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <thread>

#include "apps/train/trainer.h"
#include "tapestry/models/gpt.h"
#include "tapestry/models/transformer.h"
#include "tapestry/models/vit.h"
#include "tapestry/ops/autocast.h"
#include "tapestry/ops/cuda.h"
#include "tapestry/ops/profile.h"
#include "tapestry/ops/runtime.h"
#include "tapestry/optim/optimizer.h"

namespace tapestry::tools {

namespace {

struct Workload {
  int64_t d_model, enc_layers, dec_layers, heads, d_ff, vocab, batch, src_len, tgt_len;
};

const std::map<std::string, Workload>& workloads() {
  static const std::map<std::string, Workload> w = {
      {"copy", {512, 2, 2, 8, 2048, 11, 80, 10, 10}},
      {"small", {256, 3, 3, 8, 1024, 8000, 64, 32, 32}},
      {"base", {512, 6, 6, 8, 2048, 37000, 32, 32, 32}},
  };
  return w;
}

// Matmul FLOPs (2 m n k) of one forward pass; the backward costs twice the forward.
double forward_flops(const Workload& w) {
  const double B = w.batch, S = w.src_len, T = w.tgt_len, D = w.d_model, F = w.d_ff, V = w.vocab;
  double enc = 4 * 2 * B * S * D * D + 2 * 2 * B * S * S * D + 2 * 2 * B * S * D * F;
  double dec = 4 * 2 * B * T * D * D + 2 * 2 * B * T * T * D       // self-attention
               + 2 * 2 * B * T * D * D + 2 * 2 * B * S * D * D      // cross: q, o; k, v of memory
               + 2 * 2 * B * T * S * D + 2 * 2 * B * T * D * F;    // cross scores and values; FFN
  return w.enc_layers * enc + w.dec_layers * dec + 2 * B * T * D * V;
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double peak_rss_mib() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

// The device the workload runs on (bench --device); kernels there are asynchronous, so every
// timed call ends by waiting for them.
Device bench_device = Device::CPU;
void wait_for_device() { cuda::synchronize(bench_device); }

// What ran the train step's float32 matmuls (the JSON's "gemm"): the CPU's library, or cuBLAS in its mode.
std::string gemm_name(const BenchOptions& o) {
  return gemm_library(bench_device, o.precision == "bf16" ? Precision::BFloat16 : Precision::Float32);
}

// The peak resident memory, and the GPU's peak in tensors when the workload ran there.
void print_memory() {
  std::printf("peak RSS          %8.1f MiB\n", peak_rss_mib());
  if (bench_device.is_cuda())
    std::printf("peak GPU memory   %8.1f MiB in tensors (caching allocator, %s)\n",
                static_cast<double>(cuda::memory_stats(bench_device).peak_allocated) / (1 << 20),
                device_name(bench_device).c_str());
}

// Wall ms of each of `runs` calls of f, after `skip` untimed ones.
std::vector<double> time_calls(int skip, int runs, const std::function<void()>& f) {
  std::vector<double> ms;
  for (int s = 0; s < skip + runs; ++s) {
    double t0 = now_ms();
    f();
    wait_for_device();
    if (s >= skip) ms.push_back(now_ms() - t0);
  }
  return ms;
}

// Host synchronisations and kernel launches of one more call of `step` (ops/runtime.h).
runtime::Counts count_step(const std::function<void()>& step) {
  runtime::reset_counts();
  step();
  return runtime::counts();
}

void print_counts(const runtime::Counts& n) {
  std::printf("per train step    %8lld host syncs, %lld kernel launches (%s)\n", (long long)n.syncs,
              (long long)n.launches, device_name(bench_device).c_str());
}

// Per-op times over `o.steps` more calls of `step`, printed to stdout (stderr with --json).
void print_profile(const BenchOptions& o, const std::function<void()>& step) {
  profile::reset();
  profile::set_enabled(true);
  double t0 = now_ms();
  for (int s = 0; s < o.steps; ++s) step();
  wait_for_device();
  double total = (now_ms() - t0) / o.steps;
  profile::set_enabled(false);
  FILE* to = o.json ? stderr : stdout;  // --json keeps stdout to one JSON line
  std::fprintf(to, "profile: %.1f ms per train step; forward kernels by op, backward by node (outermost scope):\n",
               total);
  double seen = 0;
  for (auto& [name, e] : profile::report()) {
    double per = e.ms / o.steps;
    seen += per;
    if (per >= 0.05 * total / 100)
      std::fprintf(to, "  %-26s %9.2f ms %6.1f%% %8lld calls\n", name.c_str(), per, 100 * per / total,
                   (long long)(e.calls / o.steps));
  }
  std::fprintf(to, "  %-26s %9.2f ms %6.1f%%\n", "(engine, allocation, rest)", total - seen,
               100 * (total - seen) / total);
}

// The GPT language model's train step (the `lm` workload).
int run_lm_bench(const BenchOptions& o, int threads) {
  const int64_t vocab = 4000, block = 64, batch = 32;
  models::GPTConfig c = models::GPTConfig::named("mini", vocab);
  c.block_size = block, c.dropout = 0.1;
  models::GPT model(c);
  model.to(bench_device);
  optim::AdamWOptions ao;
  ao.lr = 2e-3, ao.beta1 = 0.9, ao.beta2 = 0.95, ao.eps = 1e-8, ao.weight_decay = 0.1;
  optim::AdamW adamw({{model.decay_parameters(), std::nullopt, 0.1}, {model.no_decay_parameters(), std::nullopt, 0.0}},
                     ao);
  Generator data(42);
  Tensor ids = randint(0, vocab, {batch, block + 1}, DType::Int64, &data);
  Tensor x = ids.slice(1, 0, block).contiguous().to(bench_device), y = ids.slice(1, 1, block + 1).contiguous().to(bench_device);
  apps::TrainerOptions to;
  to.checkpoint_activations = o.checkpoint_activations;
  to.precision = o.precision;
  to.tf32 = o.tf32;
  to.progress = false, to.clip_norm = 1.0;
  apps::Trainer trainer(model, adamw, nullptr, to);
  const std::vector<apps::TrainBatch> step_batch = {{batch * block, [&] { return model.loss(x, y); }}};
  const std::vector<double> train_ms = time_calls(o.warmup, o.steps, [&] { trainer.step(step_batch); });
  const runtime::Counts per_step = count_step([&] { trainer.step(step_batch); });
  if (o.profile) print_profile(o, [&] { trainer.step(step_batch); });
  const std::vector<double> fwd_ms = time_calls(0, std::max(3, o.steps / 2), [&] {
    NoGradGuard no_grad;
    model.forward(x);
  });
  // Sampled decoding: `batch` one-token prompts, block - 1 new tokens each, with the KV cache.
  model.eval();
  models::SampleOptions so;
  so.max_new = block - 1, so.seed = 7;
  std::vector<std::vector<int64_t>> prompts(batch, std::vector<int64_t>{1});
  double d0 = now_ms();
  auto out = models::generate(model, prompts, so);
  double decode_ms = now_ms() - d0;
  int64_t decoded = 0;
  for (auto& r : out) decoded += static_cast<int64_t>(r.size()) - 1;
  model.train();

  const double step_ms = median(train_ms), tokens = static_cast<double>(batch * block);
  const double tok_s = tokens / (step_ms / 1000), dec_tok_s = decoded / (decode_ms / 1000);
  const double mn = *std::min_element(train_ms.begin(), train_ms.end());
  const double mx = *std::max_element(train_ms.begin(), train_ms.end());
  if (o.json) {
    std::printf("{\"impl\": \"tapestry\", \"precision\": \"%s\", \"gemm\": \"%s\", \"device\": \"%s\", \"attention\": \"%s\", \"workload\": \"lm\", \"threads\": %d, \"train_ms_median\": %.3f, "
                "\"train_ms_min\": %.3f, \"train_ms_max\": %.3f, \"tgt_tokens_per_s\": %.1f, \"forward_ms_median\": "
                "%.3f, \"decode_tokens_per_s\": %.1f, \"peak_rss_mib\": %.1f, \"params\": %lld, \"syncs_per_step\": %lld, "
                "\"launches_per_step\": %lld}\n",
                o.precision.c_str(), gemm_name(o).c_str(), o.device.c_str(), o.attention.c_str(), threads, step_ms, mn, mx, tok_s, median(fwd_ms), dec_tok_s, peak_rss_mib(),
                static_cast<long long>(model.num_parameters()), (long long)per_step.syncs, (long long)per_step.launches);
    return 0;
  }
  std::printf("workload lm: GPT mini (%lld layers, %lld heads, d_model %lld), vocab %lld, batch %lldx%lld, "
              "%lld parameters, %d threads\n",
              (long long)c.layers, (long long)c.heads, (long long)c.d_model, (long long)vocab, (long long)batch,
              (long long)block, (long long)model.num_parameters(), threads);
  std::printf("train step        %8.2f ms median (min %.2f, max %.2f, %d steps)\n", step_ms, mn, mx, o.steps);
  std::printf("train tokens/s    %8.0f\n", tok_s);
  std::printf("forward           %8.2f ms median\n", median(fwd_ms));
  std::printf("sampled decode    %8.0f tokens/s (KV cache, %lld tokens)\n", dec_tok_s, (long long)decoded);
  print_counts(per_step);
  print_memory();
  return 0;
}

// The image task's train step (the `vit` workload): ViT fmnist on a batch of 128 random 28x28 images.
int run_vit_bench(const BenchOptions& o, int threads) {
  const int64_t batch = 128;
  models::ViT model(models::ViTConfig::named("fmnist"));
  model.to(bench_device);
  optim::AdamWOptions ao;
  ao.lr = 1e-3, ao.weight_decay = 0.05;
  optim::AdamW adamw(model.parameters(), ao);
  Generator data(42);
  Tensor x = rand({batch, 1, 28, 28}, DType::Float32, &data).to(bench_device);
  Tensor y = randint(0, 10, {batch}, DType::Int64, &data).to(bench_device);
  apps::TrainerOptions to;
  to.checkpoint_activations = o.checkpoint_activations;
  to.precision = o.precision;
  to.tf32 = o.tf32;
  to.progress = false;
  apps::Trainer trainer(model, adamw, nullptr, to);
  const std::vector<apps::TrainBatch> step_batch = {{batch, [&] { return model.loss(x, y); }}};
  const std::vector<double> train_ms = time_calls(o.warmup, o.steps, [&] { trainer.step(step_batch); });
  const runtime::Counts per_step = count_step([&] { trainer.step(step_batch); });
  if (o.profile) print_profile(o, [&] { trainer.step(step_batch); });
  const double step_ms = median(train_ms), img_s = static_cast<double>(batch) / (step_ms / 1000);
  const double mn = *std::min_element(train_ms.begin(), train_ms.end());
  const double mx = *std::max_element(train_ms.begin(), train_ms.end());
  if (o.json) {
    std::printf("{\"impl\": \"tapestry\", \"precision\": \"%s\", \"gemm\": \"%s\", \"device\": \"%s\", \"workload\": \"vit\", \"threads\": %d, "
                "\"train_ms_median\": %.3f, \"train_ms_min\": %.3f, \"train_ms_max\": %.3f, \"images_per_s\": %.1f, "
                "\"peak_rss_mib\": %.1f, \"params\": %lld}\n",
                o.precision.c_str(), gemm_name(o).c_str(), o.device.c_str(), threads, step_ms, mn, mx, img_s, peak_rss_mib(),
                static_cast<long long>(model.num_parameters()));
    return 0;
  }
  std::printf("workload vit: ViT fmnist (8x8 patches every 4 pixels, 4 layers, 4 heads, d_model 64), batch %lld of 28x28, %lld parameters, "
              "%d threads\n",
              (long long)batch, (long long)model.num_parameters(), threads);
  std::printf("train step        %8.2f ms median (min %.2f, max %.2f, %d steps)\n", step_ms, mn, mx, o.steps);
  std::printf("train images/s    %8.0f\n", img_s);
  print_counts(per_step);
  print_memory();
  return 0;
}

// x W^T as the `small` Transformer's decoder and training meet it, rows x in -> out, with W read
// transposed from its [out, in] storage (linear's training path) against a contiguous W^T
// [in, out] (nn::Linear's copy for inference): median microseconds and GFLOP/s of each.
// tools/reference/bench_torch.py --layouts times torch's x @ W.t() on the same shapes.
int run_layouts(const BenchOptions& o, int threads) {
  NoGradGuard no_grad;
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{256, 8000}, {256, 256}, {256, 1024}, {1024, 256}};
  if (!o.json) std::printf("x W^T, %d threads, %s: microseconds (GFLOP/s), W read transposed -> W^T contiguous\n", threads, gemm_library().c_str());
  std::string json;
  for (int64_t rows : {8, 32, 64, 256, 2048}) {
    if (!o.json) std::printf("rows %5lld", static_cast<long long>(rows));
    for (auto [in, out] : shapes) {
      Tensor x = randn({rows, in}), w = randn({out, in}), wt = w.t().contiguous();
      auto time = [&](const Tensor& b) {
        std::vector<double> ms;
        const int reps = rows >= 2048 ? 5 : 50;
        for (int r = 0; r < reps + 3; ++r) {
          const double t0 = now_ms();
          matmul(x, b);
          if (r >= 3) ms.push_back(now_ms() - t0);
        }
        return 1000 * median(ms);
      };
      const double read_t = time(w.t()), contig = time(wt), flop = 2.0 * static_cast<double>(rows * in * out);
      if (o.json)
        json += fmt::format("{}{{\"rows\": {}, \"in\": {}, \"out\": {}, \"transposed_us\": {:.1f}, \"contiguous_us\": {:.1f}}}",
                            json.empty() ? "" : ", ", rows, in, out, read_t, contig);
      else
        std::printf("  %4lld->%-4lld %7.1f (%3.0f) -> %7.1f (%3.0f)", static_cast<long long>(in), static_cast<long long>(out),
                    read_t, flop / read_t / 1e3, contig, flop / contig / 1e3);
    }
    if (!o.json) std::printf("\n");
  }
  if (o.json) std::printf("{\"impl\": \"tapestry\", \"threads\": %d, \"layouts\": [%s]}\n", threads, json.c_str());
  return 0;
}

}  // namespace

// Attention alone (`--workload attention`): causal scaled_dot_product_attention, head size 64,
// 8 heads, sequence lengths 256, 1024 and 4096 (batch 8, 4, 1), forward and forward + backward,
// on --device with --attention's kernel; one line (JSON with --json) per length.
// bench_torch.py --workload attention times torch's F.scaled_dot_product_attention the same way.
int run_attention_bench(const BenchOptions& o) {
  for (const auto& [T, B] : std::vector<std::pair<int64_t, int64_t>>{{256, 8}, {1024, 4}, {4096, 1}}) {
    Generator g(7);
    const Shape shape = {B, 8, T, 64};
    Tensor q = randn(shape, DType::Float32, &g).to(bench_device).requires_grad_();
    Tensor k = randn(shape, DType::Float32, &g).to(bench_device).requires_grad_();
    Tensor v = randn(shape, DType::Float32, &g).to(bench_device).requires_grad_();
    Tensor dout = randn(shape, DType::Float32, &g).to(bench_device);
    const int runs = std::max(3, o.steps / 2);
    const std::vector<double> fwd = time_calls(1, runs, [&] {
      NoGradGuard no_grad;
      scaled_dot_product_attention(q, k, v, Tensor(), true);
    });
    const std::vector<double> both = time_calls(1, runs, [&] {
      sum(mul(scaled_dot_product_attention(q, k, v, Tensor(), true), dout)).backward();
    });
    const double flops = 4.0 * B * 8 * T * T * 64 / 2;  // causal: half of QK^T and PV
    if (o.json)
      std::printf("{\"impl\": \"tapestry\", \"workload\": \"attention\", \"device\": \"%s\", \"attention\": \"%s\", "
                  "\"batch\": %lld, \"heads\": 8, \"seq\": %lld, \"head_dim\": 64, \"forward_ms\": %.4f, "
                  "\"forward_backward_ms\": %.4f, \"forward_tflops\": %.3f}\n",
                  o.device.c_str(), o.attention.c_str(), (long long)B, (long long)T, median(fwd), median(both),
                  flops / (median(fwd) * 1e9));
    else
      std::printf("attention (%s) batch %lld, 8 heads, %lld x 64, causal: forward %.3f ms (%.2f TFLOP/s), forward + "
                  "backward %.3f ms\n", o.attention.c_str(), (long long)B, (long long)T, median(fwd),
                  flops / (median(fwd) * 1e9), median(both));
  }
  return 0;
}

int run_bench(const BenchOptions& o) {
  if (o.peak) {
    int threads = o.threads > 0 ? o.threads : static_cast<int>(std::thread::hardware_concurrency());
    const char* isa = "";
    double g1 = peak_gflops(1, &isa), gn = peak_gflops(threads, &isa);
    if (o.json)
      std::printf("{\"impl\": \"tapestry\", \"peak_gflops_1_thread\": %.1f, \"peak_gflops\": %.1f, \"threads\": %d, "
                  "\"isa\": \"%s\"}\n", g1, gn, threads, isa);
    else
      std::printf("fp32 FMA peak (%s): %.1f GFLOP/s on 1 thread, %.1f GFLOP/s on %d threads\n", isa, g1, gn, threads);
    return 0;
  }
  int threads = o.threads > 0 ? o.threads : static_cast<int>(std::thread::hardware_concurrency());
  set_num_threads(threads);
  manual_seed(1234);
  if (o.layouts) return run_layouts(o, threads);
  bench_device = Device::parse(o.device);
  cuda::set_attention_kernel(cuda::parse_attention_kernel(o.attention));
  if (bench_device.is_cuda()) cuda::reset_peak_memory(bench_device);
  if (o.workload == "lm") return run_lm_bench(o, threads);
  if (o.workload == "vit") return run_vit_bench(o, threads);
  if (o.workload == "attention") return run_attention_bench(o);
  auto it = workloads().find(o.workload);
  TP_CHECK(it != workloads().end(), "bench: unknown workload '{}' (expected copy, small, base, lm or vit)", o.workload);
  const Workload w = it->second;
  Generator data(42);

  models::TransformerConfig c;
  c.src_vocab = c.tgt_vocab = w.vocab;
  c.d_model = w.d_model, c.heads = w.heads, c.d_ff = w.d_ff, c.enc_layers = w.enc_layers, c.dec_layers = w.dec_layers;
  c.dropout = 0.1, c.pad_id = 0;
  models::Transformer model(c);
  model.to(bench_device);
  optim::AdamOptions ao;
  ao.lr = 1e-4, ao.beta1 = 0.9, ao.beta2 = 0.98, ao.eps = 1e-9;
  optim::Adam adam(model.parameters(), ao);
  // Tokens in [3, vocab): no padding, so every target token counts.
  Tensor src = randint(3, w.vocab, {w.batch, w.src_len}, DType::Int64, &data);
  Tensor tgt = randint(3, w.vocab, {w.batch, w.tgt_len + 1}, DType::Int64, &data);
  Tensor tgt_in = tgt.slice(1, 0, w.tgt_len).contiguous().to(bench_device);
  Tensor tgt_out = tgt.slice(1, 1, w.tgt_len + 1).contiguous().to(bench_device);
  src = src.to(bench_device);

  // The step training runs (apps/train/trainer.h): forward, loss, backward, gradient norm (the
  // non-finite guard), Adam step; no schedule, no clipping.
  apps::TrainerOptions to;
  to.checkpoint_activations = o.checkpoint_activations;
  to.precision = o.precision;
  to.tf32 = o.tf32;
  to.progress = false;
  apps::Trainer trainer(model, adam, nullptr, to);
  const std::vector<apps::TrainBatch> batch = {
      {w.batch * w.tgt_len, [&] { return model.loss(src, tgt_in, tgt_out, 0.1); }}};
  const std::vector<double> train_ms = time_calls(o.warmup, o.steps, [&] { trainer.step(batch); });
  const runtime::Counts per_step = count_step([&] { trainer.step(batch); });
  if (o.profile) print_profile(o, [&] { trainer.step(batch); });
  const std::vector<double> fwd_ms = time_calls(0, std::max(3, o.steps / 2), [&] {
    NoGradGuard no_grad;
    model.forward(src, tgt_in);
  });
  // Greedy decoding of the batch's sources for exactly tgt_len tokens (no end symbol).
  models::DecodeOptions dec;
  dec.bos = 1, dec.eos = -1, dec.max_extra = w.tgt_len - w.src_len;
  double d0 = now_ms();
  auto hyps = models::greedy_decode(model, src, dec);
  double decode_ms = now_ms() - d0;
  int64_t decoded = 0;
  for (auto& h : hyps) decoded += static_cast<int64_t>(h.tokens.size());
  // sgemm on the workload's feed-forward shape: (B*T, D) @ (D, F).
  Tensor a = randn({w.batch * w.tgt_len, w.d_model}, bench_device), b = randn({w.d_model, w.d_ff}, bench_device);
  std::vector<double> gemm_ms = time_calls(1, 10, [&] { matmul(a, b); });

  const double step_ms = median(train_ms);
  const double tokens = static_cast<double>(w.batch * w.tgt_len);
  const double train_gflops = 3 * forward_flops(w) / (step_ms * 1e6);
  const double sgemm_gflops = 2.0 * w.batch * w.tgt_len * w.d_model * w.d_ff / (median(gemm_ms) * 1e6);
  const double tok_s = tokens / (step_ms / 1000);
  const double dec_tok_s = static_cast<double>(decoded) / (decode_ms / 1000);
  if (o.json) {
    std::printf(
        "{\"impl\": \"tapestry\", \"precision\": \"%s\", \"gemm\": \"%s\", \"device\": \"%s\", \"attention\": \"%s\", \"workload\": \"%s\", \"threads\": %d, \"train_ms_median\": %.3f, \"train_ms_min\": "
        "%.3f, \"train_ms_max\": %.3f, \"tgt_tokens_per_s\": %.1f, \"train_gflops\": %.2f, \"forward_ms_median\": "
        "%.3f, \"decode_tokens_per_s\": %.1f, \"sgemm_gflops\": %.2f, \"peak_rss_mib\": %.1f, \"params\": %lld, "
        "\"syncs_per_step\": %lld, \"launches_per_step\": %lld, \"checkpoint_activations\": %s}\n",
        o.precision.c_str(), gemm_name(o).c_str(), o.device.c_str(), o.attention.c_str(), o.workload.c_str(), threads, step_ms, *std::min_element(train_ms.begin(), train_ms.end()),
        *std::max_element(train_ms.begin(), train_ms.end()), tok_s, train_gflops, median(fwd_ms), dec_tok_s,
        sgemm_gflops, peak_rss_mib(), static_cast<long long>(model.num_parameters()), (long long)per_step.syncs,
        (long long)per_step.launches, o.checkpoint_activations ? "true" : "false");
    return 0;
  }
  std::printf("workload %s: d_model %lld, %lld+%lld layers, %lld heads, d_ff %lld, vocab %lld, batch %lldx%lldx%lld, "
              "%lld parameters, %d threads\n",
              o.workload.c_str(), (long long)w.d_model, (long long)w.enc_layers, (long long)w.dec_layers,
              (long long)w.heads, (long long)w.d_ff, (long long)w.vocab, (long long)w.batch, (long long)w.src_len,
              (long long)w.tgt_len, (long long)model.num_parameters(), threads);
  std::printf("gemm %s; train step matmuls in %s\n", gemm_name(o).c_str(),
              o.precision == "bf16" ? "bfloat16" : (o.tf32 && bench_device.is_cuda() ? "TF32" : "float32"));
  if (o.checkpoint_activations)
    std::printf("activation checkpointing: each layer recomputed in backward (GFLOP/s counts no recomputation)\n");
  std::printf("train step        %8.2f ms median (min %.2f, max %.2f, %d steps)\n", step_ms,
              *std::min_element(train_ms.begin(), train_ms.end()), *std::max_element(train_ms.begin(), train_ms.end()),
              o.steps);
  std::printf("target tokens/s   %8.0f\n", tok_s);
  std::printf("train GFLOP/s     %8.1f (matmul FLOPs: %.2f GFLOP per step)\n", train_gflops, 3 * forward_flops(w) / 1e9);
  std::printf("forward           %8.2f ms median\n", median(fwd_ms));
  std::printf("greedy decode     %8.0f tokens/s (KV cache, %lld tokens)\n", dec_tok_s, (long long)decoded);
  std::printf("sgemm             %8.1f GFLOP/s (%lldx%lld @ %lldx%lld)\n", sgemm_gflops,
              (long long)(w.batch * w.tgt_len), (long long)w.d_model, (long long)w.d_model, (long long)w.d_ff);
  print_counts(per_step);
  print_memory();
  return 0;
}

}  // namespace tapestry::tools

namespace tapestry::tools {

Subcommand add_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  auto* bench = app.add_subcommand("bench", "time a named workload (see docs/benchmarks.md)");
  bench->add_option("--workload", o->workload, "copy, small, base (Transformer), lm (GPT), vit (ViT) or attention "
                    "(scaled_dot_product_attention alone at lengths 256, 1024, 4096)")
      ->check(CLI::IsMember({"copy", "small", "base", "lm", "vit", "attention"}))
      ->capture_default_str();
  bench->add_option("--threads", o->threads, "threads (default: all cores)")->check(positive());
  bench->add_option("--steps", o->steps, "timed train steps")->check(positive())->capture_default_str();
  bench->add_option("--warmup", o->warmup, "untimed steps first")->check(CLI::NonNegativeNumber)->capture_default_str();
  bench->add_flag("--json", o->json, "one JSON object on one line");
  bench->add_flag("--profile", o->profile, "also print per-op times of the train step");
  bench->add_flag("--peak", o->peak, "measure the machine's fp32 FMA peak instead");
  bench->add_flag("--layouts", o->layouts, "time x W^T from both weight layouts instead (nn::Linear's inference copy)");
  bench->add_flag("--checkpoint-activations", o->checkpoint_activations, "recompute each block during backward (less "
                  "memory, about one more forward)");
  bench->add_option("--precision", o->precision, "fp32, or bf16: the train step's matmuls in bfloat16 (a CPU with "
                    "AVX512-BF16, or a GPU of compute capability 8.0 or later)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  bench->add_flag("--tf32", o->tf32, "float32 matmuls on a GPU through TF32 tensor cores (as "
                  "torch.backends.cuda.matmul.allow_tf32; bench_torch.py --tf32 is PyTorch's side)");
  bench->add_option("--device", o->device, "cpu, cuda, cuda:N, or emulated (the test device: CPU kernels, GPU rules)")->check(device_flag())->capture_default_str();
  bench->add_option("--attention", o->attention,
                    "the GPU's attention kernel: gemm (cuBLAS, holds the scores), tiled (FlashAttention-style) or "
                    "auto (tiled where the scores would take over 256 MiB)")
      ->check(CLI::IsMember({"auto", "gemm", "tiled"}))
      ->capture_default_str();
  return {bench, [o] { return run_bench(*o); }};
}

}  // namespace tapestry::tools
