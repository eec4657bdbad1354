// The device-generic suite: one set of checks, instantiated per device (after PyTorch's
// device-generic tests), each comparing the device against the CPU run of the same program.
//   device_check emulated   the emulated device (Note [Emulated device], ops/dtype.h): every build,
//                           every CI run (ctest device_emulated). Its kernels are the CPU's, so
//                           everything must agree with the CPU to the bit.
//   device_check cuda       every GPU (ctest cuda, label cuda). Exits 77, which ctest reports as
//                           skipped, with one line saying why, where there is no CUDA build or no
//                           GPU: it never passes without having run.
//   device_check cuda attention steps   only the named sections (`device_check` alone lists them):
//                           what a sanitizer or a short GPU window runs (tools/gpu-window.sh). A
//                           tolerance failure names the largest difference and its element.
// The checks, on every device:
//   1. every op of the OpInfo table (tests/opinfo.h), every sample PyTorch accepts, on inputs
//      with the same layout (non-contiguous, expanded, 0-d, empty): the same outputs, the same
//      gradients and the same errors as the CPU (as ggml's test-backend-ops does);
//   2. gradcheck and gradgradcheck in float64 on the device for the differentiable float64 samples;
//   3. one Transformer and one GPT training step, dropout on (the same masks on both devices): the
//      loss, every gradient and every weight after Adam, in float64 and float32;
//   4. the optimizers (SGD with momentum and Nesterov, Adam, AdamW with groups, clipping), anomaly
//      mode, greedy decoding, beam search and sampling, a model saved and loaded on the device;
//   5. the bugs a first GPU run would have hit (issue 22), each as a regression case;
//   6. the runtime: mixed devices name both, a bad index is reported (at the next synchronisation
//      on a GPU), host reads of device memory are refused (emulated), syncs and launches counted;
//   7. the Trainer's train step on the bench's `base` workload within its budget of host
//      synchronisations and launches (kSyncBudget, kLaunchBudget);
//   and on a GPU also both attention kernels (cuda::set_attention_kernel: gemm and tiled) on shapes
//   across the tiled kernels' tiles, the tiled kernel's memory and the caching allocator.
#define DOCTEST_CONFIG_DISABLE
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>

#include "apps/train/trainer.h"
#include "tapestry/ops/autocast.h"
#include "tapestry/ops/cuda.h"
#include "tapestry/ops/detail/kernels.h"
#include "tapestry/ops/runtime.h"
#include "tests/checker.h"
#include "tests/helpers.h"
#include "tests/opinfo.h"

using namespace tapestry;
using testing::error_of;
using testing::max_diff;

namespace {

testing::Checker check("device_check");
// The emulated device runs the CPU's kernels: every comparison with the CPU must be exact there.
bool exact = false;

void expect(bool ok, const std::string& what) { check.expect(ok, what); }

// t on `device` with t's exact layout: the whole storage copied, the same view over it.
Tensor same_layout_on(const Tensor& t, Device device) {
  if (!t.defined()) return t;
  auto storage = std::make_shared<Storage>(t.storage()->nbytes, device);
  cuda::detail::copy_bytes(storage->data, device, t.storage()->data, t.device(), t.storage()->nbytes);
  Tensor moved = make_tensor(storage, t.sizes(), t.strides(), t.offset(), t.dtype());
  if (t.requires_grad()) moved.requires_grad_();
  return moved;
}

// Where `gpu` and `cpu` differ beyond atol + rtol |cpu|: how many elements, and the one furthest
// over (its |difference|, both values, its index), so that one failing run settles a tolerance
// question. Empty when every element is within.
std::string largest_difference(const Tensor& gpu, const Tensor& cpu, double rtol, double atol) {
  if (gpu.defined() != cpu.defined()) return "defined on one side only";
  if (!gpu.defined()) return "";
  if (gpu.sizes() != cpu.sizes() || gpu.dtype() != cpu.dtype())
    return fmt::format("shape or dtype differ: {} {} on the device, {} {} on the CPU", gpu.sizes(),
                       dtype_name(gpu.dtype()), cpu.sizes(), dtype_name(cpu.dtype()));
  std::vector<double> x = gpu.to_vector<double>(), y = cpu.to_vector<double>();
  size_t worst = 0, over = 0;
  double worst_excess = -1, worst_abs = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] == y[i] || (std::isnan(x[i]) && std::isnan(y[i]))) continue;
    const double d = std::fabs(x[i] - y[i]), allowed = atol + rtol * std::fabs(y[i]);
    const double excess = std::isnan(d) ? INFINITY : d / std::max(allowed, 1e-300);  // NaN on one side only
    if (!(d <= allowed)) ++over;
    if (excess > worst_excess) worst_excess = excess, worst = i, worst_abs = d;
  }
  if (over == 0) return "";
  return fmt::format("{} of {} elements over atol {:g} + rtol {:g} |cpu|; largest |difference| {:.3g} ({:.3g}x "
                     "the allowed) at element {} of {}: device {:.9g}, CPU {:.9g}",
                     over, x.size(), atol, rtol, worst_abs, worst_excess, worst, gpu.sizes(), x[worst], y[worst]);
}

// |gpu - cpu| within atol + rtol |cpu| everywhere (0 and 0 on the emulated device), NaN where NaN,
// equal infinities; a failure names the largest difference.
void expect_close(const Tensor& gpu, const Tensor& cpu, double rtol, double atol, const std::string& what) {
  if (exact) rtol = atol = 0;
  const std::string diff = largest_difference(gpu, cpu, rtol, atol);
  expect(diff.empty(), what + ": " + diff);
}

// max_diff(a, b) (|a - b| / (1 + |b|), tests/helpers.h) at most `tolerance`; a failure names the
// largest difference and its element.
void expect_within(const Tensor& a, const Tensor& b, double tolerance, const std::string& what) {
  const double d = max_diff(a, b);
  if (d <= tolerance) return;
  Tensor x = a.detach().to(Device::CPU).to(kFloat64), y = b.detach().to(Device::CPU).to(kFloat64);
  std::string where;
  if (x.sizes() == y.sizes()) {  // the worst element of |x - y| / (1 + |y|)
    const std::vector<double> xv = x.to_vector<double>(), yv = y.to_vector<double>();
    size_t worst = 0;
    double w = -1;
    for (size_t i = 0; i < xv.size(); ++i) {
      double e = std::fabs(xv[i] - yv[i]) / (1 + std::fabs(yv[i]));
      if (std::isnan(e)) e = INFINITY;
      if (e > w) w = e, worst = i;
    }
    if (!xv.empty()) where = fmt::format(" at element {} of {}: device {:.9g}, CPU {:.9g}", worst, x.sizes(), xv[worst], yv[worst]);
  }
  expect(false, fmt::format("{}: largest |difference| / (1 + |cpu|) {:.3g} over the tolerance {:g}{}", what, d,
                            tolerance, where));
}

// The ops whose names start with `prefix` (all by default).
void check_op_table(Device device, const std::string& prefix = "") {
  size_t samples = 0;
  for (const opinfo::OpInfo& op : opinfo::op_table()) {
    if (op.name.rfind(prefix, 0) != 0) continue;
    std::vector<opinfo::Sample> all = opinfo::make_samples(op, 1);
    for (size_t k = 0; k < all.size(); ++k) {
      const opinfo::Sample& s = all[k];
      const std::string where = fmt::format("{} [{}] on {}", op.name, s.desc, device_name(device));
      TensorList on_device;
      for (const Tensor& x : s.inputs) on_device.push_back(same_layout_on(x, device));
      opinfo::RunResult cpu = opinfo::run_case(op.fn, s.inputs, op.differentiable, 1000 + k);
      // Data errors found on the device surface at a synchronisation: make it the op's own call,
      // so that they count for this sample (the CPU throws them from the call).
      const opinfo::OpFn synced = [&](const TensorList& in) {
        TensorList out = op.fn(in);
        cuda::synchronize(device);
        return out;
      };
      opinfo::RunResult gpu = opinfo::run_case(synced, on_device, op.differentiable, 1000 + k);
      const std::string late = error_of([&] { cuda::synchronize(device); });  // from the backward
      if (!late.empty() && gpu.backward_error.empty()) gpu.backward_error = late;
      ++samples;
      expect(!gpu.foreign, where + ": threw something other than a tapestry::Error: " + gpu.error);
      expect(cpu.threw == gpu.threw, where + ": the CPU " + (cpu.threw ? "threw (" + cpu.error + ")" : "ran") +
                                         " but the GPU " + (gpu.threw ? "threw (" + gpu.error + ")" : "ran"));
      if (cpu.threw || gpu.threw) continue;
      for (size_t i = 0; i < cpu.outputs.size(); ++i) {
        const bool f32 = cpu.outputs[i].defined() && cpu.outputs[i].dtype() == kFloat32;
        expect(gpu.outputs[i].device() == device || !gpu.outputs[i].defined(), where + ": an output left the device");
        expect_close(gpu.outputs[i], cpu.outputs[i], f32 ? 1e-4 : 1e-10, f32 ? 1e-5 : 1e-12,
                     fmt::format("{}: output {} differs from the CPU's", where, i));
      }
      expect(cpu.backward_error.empty() == gpu.backward_error.empty(), where + ": backward errors differ: " +
                                                                            cpu.backward_error + " / " + gpu.backward_error);
      for (size_t i = 0; i < cpu.grads.size(); ++i) {
        const bool f32 = cpu.grads[i].defined() && cpu.grads[i].dtype() == kFloat32;
        expect_close(gpu.grads[i], cpu.grads[i], f32 ? 1e-3 : 1e-9, f32 ? 1e-4 : 1e-11,
                     fmt::format("{}: the gradient of input {} differs from the CPU's", where, i));
      }
      // gradcheck in float64 on the device, where the CPU suite runs it (tests/test_opinfo.cpp).
      std::vector<size_t> pos;
      bool f64 = s.no_gradcheck.empty();
      for (size_t i = 0; i < s.inputs.size(); ++i)
        if (op.is_differentiable(i) && is_floating(s.inputs[i].dtype())) {
          pos.push_back(i);
          f64 = f64 && s.inputs[i].dtype() == kFloat64 && opinfo::all_finite(s.inputs[i]) &&
                s.inputs[i].numel() > 0 && s.inputs[i].numel() <= 64;
        }
      if (pos.empty() || !f64) continue;
      TensorList leaves;
      for (size_t i : pos) {
        Tensor x = opinfo::has_expanded_dims(s.inputs[i]) ? s.inputs[i].contiguous() : s.inputs[i];
        leaves.push_back(same_layout_on(x.detach(), device).requires_grad_());
      }
      auto f = [&](const TensorList& xs) {
        TensorList in = on_device;
        for (size_t j = 0; j < pos.size(); ++j) in[pos[j]] = xs[j];
        TensorList outs = op.fn(in);
        TensorList parts;
        for (const Tensor& o : outs)
          if (o.defined() && o.dtype() == kFloat64) parts.push_back(reshape(o, {-1}));
        if (parts.empty()) return Tensor();
        return outs.size() == 1 ? outs[0] : cat(parts, 0);
      };
      // As tests/test_opinfo.cpp: the outputs must be float64 and finite too (var of one element
      // is NaN, a float32 conversion has nothing to difference).
      {
        NoGradGuard no_grad;
        Tensor probe = f(leaves);
        if (!probe.defined() || probe.dtype() != kFloat64 || !opinfo::all_finite(probe)) continue;
      }
      const std::string failed = error_of([&] { gradcheck(f, leaves); });
      expect(failed.empty(), where + ": gradcheck on the device: " + failed);
      // Second derivatives too, through a backward that records (create_graph) on the device.
      const std::string failed2 = error_of([&] { gradgradcheck(f, leaves); });
      expect(failed2.empty(), where + ": gradgradcheck on the device: " + failed2);
    }
  }
  std::printf("device_check: %zu op samples%s on %s agree with the CPU\n", samples,
              prefix.empty() ? "" : (" of " + prefix + "*").c_str(), device_name(device).c_str());
}

// lead + [a, b]: an attention operand's shape.
Shape with_rows(Shape lead, int64_t a, int64_t b) {
  lead.push_back(a);
  lead.push_back(b);
  return lead;
}

const char* kernel_name(cuda::AttentionKernel kernel) {
  return kernel == cuda::AttentionKernel::Tiled ? "tiled" : kernel == cuda::AttentionKernel::Gemm ? "gemm" : "auto";
}

// scaled_dot_product_attention with one attention kernel against the CPU on shapes that cross the
// tiled kernels' tiles and blocks: causal, masks, dropout (the same masks on both devices), both
// dtypes, every head size (32, 64, 128): the output and the gradients of q, k and v.
void check_attention(Device device, cuda::AttentionKernel kernel) {
  cuda::set_attention_kernel(kernel);
  struct Config {
    Shape lead;
    int64_t tq, tk, e, ev;
    bool causal, mask;
    double dropout;
    DType dtype;
  };
  const std::vector<Config> configs = {
      {{2, 4}, 130, 130, 64, 64, true, false, 0.0, kFloat32},   {{2, 4}, 70, 200, 64, 64, false, true, 0.1, kFloat32},
      {{3}, 65, 33, 16, 24, false, true, 0.0, kFloat64},        {{3}, 65, 33, 16, 24, true, true, 0.2, kFloat64},
      {{1, 2}, 40, 90, 100, 128, true, false, 0.0, kFloat32},   {{1, 2}, 150, 20, 100, 20, true, false, 0.3, kFloat64},
      {{}, 1, 1, 8, 8, false, false, 0.0, kFloat32},            {{2}, 5, 0, 8, 8, false, false, 0.0, kFloat64},
      {{2, 2}, 70, 70, 64, 64, true, true, 0.1, kFloat64},      {{70000}, 1, 3, 4, 4, false, false, 0.0, kFloat32},
  };
  size_t n = 0;
  for (const Config& c : configs) {
    const std::string where = fmt::format("attention ({}) lead {} {} x {}, e {} ev {}{}{} dropout {} {} on {}",
                                          kernel_name(kernel), c.lead, c.tq, c.tk, c.e, c.ev,
                                          c.causal ? ", causal" : "", c.mask ? ", mask" : "", c.dropout,
                                          dtype_name(c.dtype), device_name(device));
    auto with = [&c](int64_t a, int64_t b) { return with_rows(c.lead, a, b); };
    Generator g(31 + n);
    const Tensor q = randn(with(c.tq, c.e), c.dtype, &g), k = randn(with(c.tk, c.e), c.dtype, &g),
                 v = randn(with(c.tk, c.ev), c.dtype, &g), dout = randn(with(c.tq, c.ev), c.dtype, &g);
    Shape padding = c.lead;
    padding.insert(padding.end(), {1, c.tk});
    const Tensor mask = c.mask ? gt(rand(padding, kFloat64, &g), 0.7) : Tensor();
    auto run = [&](Device on) {
      // Fresh leaves on each device (q.to(cpu) is q itself, and its gradient would be shared).
      Tensor qd = q.detach().to(on).requires_grad_(), kd = k.detach().to(on).requires_grad_(),
             vd = v.detach().to(on).requires_grad_();
      Generator seeds(5);  // the same dropout seed on both devices
      Tensor out = scaled_dot_product_attention_masked_out(qd, kd, vd, mask.defined() ? mask.to(on) : Tensor(), c.causal,
                                                c.dropout, std::nullopt, &seeds);
      sum(mul(out, dout.to(on))).backward();
      return TensorList{out, qd.grad(), kd.grad(), vd.grad()};
    };
    const TensorList cpu = run(Device::CPU), gpu = run(device);
    const bool f32 = c.dtype == kFloat32;
    const char* names[] = {"the output", "the gradient of q", "the gradient of k", "the gradient of v"};
    for (size_t i = 0; i < cpu.size(); ++i)
      expect_close(gpu[i].to(Device::CPU), cpu[i], f32 ? 1e-4 : 1e-10, f32 ? 1e-5 : 1e-12,
                   where + ": " + names[i] + " differs from the CPU's");
    ++n;
  }
  {  // The kernel's own outputs: the saved statistics too, a fully masked row, 9 leading dims
     // (the tiled kernel copies such a mask), float64 with heads of 64.
    Generator g(77);
    const Shape lead = {1, 1, 1, 1, 1, 1, 1, 2, 2};
    auto with = [&lead](int64_t a, int64_t b) { return with_rows(lead, a, b); };
    const Tensor q = randn(with(9, 64), kFloat64, &g), k = randn(with(11, 64), kFloat64, &g),
                 v = randn(with(11, 64), kFloat64, &g);
    Tensor mask = gt(rand(with(9, 11), kFloat64, &g), 0.6);
    mask.select(-2, 4).fill_(1.0);  // query 4 sees nothing: it attends evenly
    const kernels::AttentionOut cpu = kernels::scaled_dot_product_attention(q, k, v, mask, true, 0.125, 0.0, 0);
    const kernels::AttentionOut gpu = kernels::scaled_dot_product_attention(q.to(device), k.to(device), v.to(device),
                                                                            mask.to(device), true, 0.125, 0.0, 0);
    const std::string where = fmt::format("attention ({}) with 9 leading dims and a fully masked row on {}",
                                          kernel_name(kernel), device_name(device));
    expect_close(gpu.out.to(Device::CPU), cpu.out, 1e-10, 1e-12, where + ": the output differs from the CPU's");
    expect_close(gpu.lse.to(Device::CPU), cpu.lse, 1e-10, 1e-12, where + ": the statistics differ from the CPU's");
    ++n;
  }
  check_op_table(device, "sdpa");
  std::printf("device_check: the %s attention kernel agrees with the CPU on %zu shapes\n", kernel_name(kernel), n);
  cuda::set_attention_kernel(cuda::AttentionKernel::Auto);
}

// The point of the tiled kernel: memory linear in Tq and Tk. With 8 heads of 4096 x 4096, Gemm's
// scores alone would take 512 MiB (its backward twice that); Auto must pick Tiled here.
void check_attention_memory(Device device) {
  cuda::set_attention_kernel(cuda::AttentionKernel::Auto);
  Generator g(3);
  Tensor q = randn({1, 8, 4096, 64}, kFloat32, &g).to(device).requires_grad_();
  Tensor k = randn({1, 8, 4096, 64}, kFloat32, &g).to(device).requires_grad_();
  Tensor v = randn({1, 8, 4096, 64}, kFloat32, &g).to(device).requires_grad_();
  cuda::synchronize(device);
  const int64_t before = cuda::memory_stats(device).allocated;
  cuda::reset_peak_memory(device);
  Tensor out = scaled_dot_product_attention(q, k, v, Tensor(), true);
  sum(out).backward();
  cuda::synchronize(device);
  const int64_t used = cuda::memory_stats(device).peak_allocated - before;
  expect(used < (int64_t(128) << 20), fmt::format("tiled attention over 8 x 4096 x 4096 used {} MiB (scores: 512 MiB)",
                                                  used >> 20));
  std::printf("device_check: attention over 8 heads of 4096 x 4096 peaked at %lld MiB beyond its inputs (Auto: tiled)\n",
              static_cast<long long>(used >> 20));
}

// `tol` (float64, float32), or 0 on the emulated device.
double tol(DType dtype, double f64, double f32) { return exact ? 0.0 : dtype == kFloat64 ? f64 : f32; }

// The parameters of `on_device` against those of `on_cpu` after one optimizer step each. Elements
// whose CPU gradient is rounding noise (below 1e-6 of the model's largest gradient: the attention
// key biases have zero gradient in exact arithmetic) are left out off the emulated device: Adam's
// first update is lr * g / (|g| + eps), about lr * sign(g), and the sign of noise is arbitrary
// (tools/reference/transformer_ref.py leaves them out the same way).
void expect_same_update(const std::string& where, nn::Module& on_device, nn::Module& on_cpu,
                        const std::map<std::string, Tensor>& grads_before, DType dtype) {
  double grad_max = 0;
  for (auto& [name, g] : grads_before) grad_max = std::max(grad_max, max(abs(g)).item<double>());
  std::map<std::string, Tensor> cpu_params;
  for (auto& [name, p] : on_cpu.named_parameters()) cpu_params[name] = p;
  for (auto& [name, p] : on_device.named_parameters()) {
    Tensor ours = p.detach().to(Device::CPU), ref = cpu_params[name].detach();
    auto it = grads_before.find(name);
    if (!exact && it != grads_before.end()) {
      Tensor noise = le(abs(it->second), 1e-6 * grad_max);
      ours = masked_fill(ours, noise, 0.0), ref = masked_fill(ref, noise, 0.0);
    }
    expect_within(ours, ref, tol(dtype, 1e-9, 2e-5), where + ": " + name + " after the optimizer step differs");
  }
}

// The loss, every gradient (against the CPU's) and the parameters after `cpu_opt` / `dev_opt` step.
void expect_same_step(const std::string& where, nn::Module& on_device, nn::Module& on_cpu, const Tensor& loss_dev,
                      const Tensor& loss_cpu, optim::Optimizer& dev_opt, optim::Optimizer& cpu_opt, DType dtype,
                      Device device) {
  expect_within(loss_dev, loss_cpu, tol(dtype, 1e-10, 1e-5), where + ": the loss differs");
  std::map<std::string, Tensor> cpu_params, grads;
  for (auto& [name, p] : on_cpu.named_parameters()) {
    cpu_params[name] = p;
    if (p.grad().defined()) grads[name] = p.grad().clone();
  }
  for (auto& [name, p] : on_device.named_parameters()) {
    const Tensor& q = cpu_params[name];
    expect(p.device() == device, where + ": " + name + " is not on the device");
    expect(p.grad().defined() == q.grad().defined(), where + ": " + name + " has a gradient on one device only");
    if (p.grad().defined()) {
      expect(p.grad().device() == device, where + ": the gradient of " + name + " is not on the device");
      expect_within(p.grad(), q.grad(), tol(dtype, 1e-9, 1e-4), where + ": the gradient of " + name + " differs");
    }
  }
  cpu_opt.step();
  dev_opt.step();
  expect_same_update(where, on_device, on_cpu, grads, dtype);
}

optim::AdamOptions transformer_adam() {
  optim::AdamOptions ao;
  ao.lr = 1e-3, ao.beta1 = 0.9, ao.beta2 = 0.98, ao.eps = 1e-9;
  return ao;
}

// Two models from the same seed (so the same weights): `cpu` on the CPU, `dev` on `device`, both in
// `dtype`.
template <class M> struct Twins {
  std::unique_ptr<M> cpu, dev;
};
template <class M, class... Args>
Twins<M> twins(uint64_t seed, DType dtype, Device device, const Args&... args) {
  Twins<M> t;
  manual_seed(seed);
  t.cpu = std::make_unique<M>(args...);
  manual_seed(seed);
  t.dev = std::make_unique<M>(args...);
  t.cpu->to(dtype);
  t.dev->to(dtype);
  t.dev->to(device);
  return t;
}

// A Transformer of 2 + 2 layers of width 32: the size of the step and decoding checks.
models::TransformerConfig small_transformer(int64_t vocab, double dropout) {
  models::TransformerConfig c;
  c.src_vocab = c.tgt_vocab = vocab;
  c.d_model = 32, c.heads = 4, c.d_ff = 64, c.enc_layers = c.dec_layers = 2, c.dropout = dropout, c.pad_id = 0;
  return c;
}

// One Transformer step with dropout on, on the CPU and on `device`, from the same weights and
// seeds: the loss, every gradient and every weight after Adam.
void check_transformer_step(Device device, DType dtype) {
  const models::TransformerConfig c = small_transformer(40, 0.1);
  auto twin = twins<models::Transformer>(7, dtype, device, c);
  models::Transformer &on_cpu = *twin.cpu, &on_dev = *twin.dev;
  Generator data(3);
  Tensor src = randint(1, 40, {4, 9}, kInt64, &data), tgt = randint(1, 40, {4, 8}, kInt64, &data);
  src.select(0, 0).narrow(0, 6, 3).fill_(0);  // padding in one sentence
  Tensor tgt_in = tgt.narrow(1, 0, 7).contiguous(), tgt_out = tgt.narrow(1, 1, 7).contiguous();
  optim::Adam adam_cpu(on_cpu.parameters(), transformer_adam()), adam_dev(on_dev.parameters(), transformer_adam());
  manual_seed(11);
  Tensor loss_cpu = on_cpu.loss(src, tgt_in, tgt_out, 0.1);
  loss_cpu.backward();
  manual_seed(11);  // the same dropout seeds, so the same masks
  Tensor loss_dev = on_dev.loss(src.to(device), tgt_in.to(device), tgt_out.to(device), 0.1);
  loss_dev.backward();
  const std::string where = fmt::format("Transformer step on {} in {}", device_name(device), dtype_name(dtype));
  expect(loss_dev.device() == device, where + ": the loss is not on the device");
  expect_same_step(where, on_dev, on_cpu, loss_dev, loss_cpu, adam_dev, adam_cpu, dtype, device);
  std::printf("device_check: %s agrees with the CPU (loss %.6f)\n", where.c_str(), loss_dev.item<double>());
}

// One GPT step (dropout on, tied embedding, AdamW with decay and no-decay groups, clipping).
void check_gpt_step(Device device, DType dtype) {
  models::GPTConfig c = models::GPTConfig::named("tiny", 50);
  c.block_size = 16, c.dropout = 0.1;
  auto twin = twins<models::GPT>(5, dtype, device, c);
  models::GPT &on_cpu = *twin.cpu, &on_dev = *twin.dev;
  Generator data(9);
  Tensor ids = randint(0, 50, {3, 13}, kInt64, &data);
  Tensor x = ids.narrow(1, 0, 12).contiguous(), y = ids.narrow(1, 1, 12).contiguous();
  optim::AdamWOptions ao;
  ao.lr = 2e-3, ao.beta1 = 0.9, ao.beta2 = 0.95, ao.eps = 1e-8;
  auto groups = [](models::GPT& m) {
    return std::vector<optim::ParamGroup>{{m.decay_parameters(), std::nullopt, 0.1},
                                          {m.no_decay_parameters(), std::nullopt, 0.0}};
  };
  optim::AdamW opt_cpu(groups(on_cpu), ao), opt_dev(groups(on_dev), ao);
  manual_seed(13);
  Tensor loss_cpu = on_cpu.loss(x, y);
  loss_cpu.backward();
  manual_seed(13);
  Tensor loss_dev = on_dev.loss(x.to(device), y.to(device));
  loss_dev.backward();
  const double norm_cpu = optim::clip_grad_norm(on_cpu.parameters(), 0.5);
  const double norm_dev = optim::clip_grad_norm(on_dev.parameters(), 0.5);
  const std::string where = fmt::format("GPT step on {} in {}", device_name(device), dtype_name(dtype));
  expect(std::fabs(norm_dev - norm_cpu) <= tol(dtype, 1e-10, 1e-5) * (1 + norm_cpu), where + ": the gradient norm differs");
  expect_same_step(where, on_dev, on_cpu, loss_dev, loss_cpu, opt_dev, opt_cpu, dtype, device);
  std::printf("device_check: %s agrees with the CPU (loss %.6f)\n", where.c_str(), loss_dev.item<double>());
}

// A small MLP as a Module (two Linear layers), for the optimizers.
struct Mlp : nn::Module {
  std::shared_ptr<nn::Linear> a, b;
  Mlp() {
    a = register_module("a", std::make_shared<nn::Linear>(6, 8));
    b = register_module("b", std::make_shared<nn::Linear>(8, 3));
  }
  Tensor forward(const Tensor& x) { return b->forward(tanh(a->forward(x))); }
};

// Three steps of each optimizer, with clipping, on both devices from the same weights and data.
void check_optimizers(Device device) {
  struct Case {
    const char* name;
    std::function<std::unique_ptr<optim::Optimizer>(Mlp&)> make;
  };
  const std::vector<Case> cases = {
      {"SGD momentum 0.9", [](Mlp& m) {
         optim::SGDOptions o;
         o.lr = 0.1, o.momentum = 0.9, o.weight_decay = 0.01;
         return std::make_unique<optim::SGD>(m.parameters(), o);
       }},
      {"SGD Nesterov", [](Mlp& m) {
         optim::SGDOptions o;
         o.lr = 0.1, o.momentum = 0.5, o.nesterov = true;
         return std::make_unique<optim::SGD>(m.parameters(), o);
       }},
      {"Adam", [](Mlp& m) { return std::make_unique<optim::Adam>(m.parameters(), transformer_adam()); }},
      {"AdamW with groups", [](Mlp& m) {
         optim::AdamWOptions o;
         o.lr = 1e-2, o.weight_decay = 0.1;
         return std::make_unique<optim::AdamW>(
             std::vector<optim::ParamGroup>{{m.a->parameters(), 2e-2, std::nullopt}, {m.b->parameters(), std::nullopt, 0.0}}, o);
       }},
  };
  for (const Case& k : cases) {
    for (DType dtype : {kFloat64, kFloat32}) {
      auto twin = twins<Mlp>(21, dtype, device);
      Mlp &on_cpu = *twin.cpu, &on_dev = *twin.dev;
      auto opt_cpu = k.make(on_cpu), opt_dev = k.make(on_dev);
      Generator g(4);
      const Tensor x = randn({5, 6}, dtype, &g), w = randn({5, 3}, dtype, &g);
      double norms[2] = {0, 0};
      for (int step = 0; step < 3; ++step) {
        int side = 0;
        for (auto [model, opt, on] : {std::tuple<Mlp*, optim::Optimizer*, Device>{&on_cpu, opt_cpu.get(), Device::CPU},
                                      {&on_dev, opt_dev.get(), device}}) {
          opt->zero_grad();
          sum(mul(model->forward(x.to(on)), w.to(on))).backward();
          norms[side++] = optim::clip_grad_norm(model->parameters(), 0.3);
          opt->step();
        }
      }
      const std::string where = fmt::format("{} on {} in {}", k.name, device_name(device), dtype_name(dtype));
      expect(std::fabs(norms[0] - norms[1]) <= tol(dtype, 1e-10, 1e-5) * (1 + norms[0]), where + ": clip_grad_norm differs");
      std::map<std::string, Tensor> ref;
      for (auto& [name, p] : on_cpu.named_parameters()) ref[name] = p;
      for (auto& [name, p] : on_dev.named_parameters()) {
        expect(p.device() == device, where + ": " + name + " left the device");
        expect_within(p, ref[name], tol(dtype, 1e-9, 1e-5), where + ": " + name + " after 3 steps differs");
      }
    }
  }
  std::printf("device_check: SGD, Adam, AdamW and clipping on %s agree with the CPU\n", device_name(device).c_str());
}

// Greedy decoding, beam search and GPT sampling give the CPU's tokens; a model saved from the
// device loads back, on the device, to the same weights.
void check_decoding_and_checkpoints(Device device) {
  const models::TransformerConfig c = small_transformer(30, 0.0);
  auto twin = twins<models::Transformer>(17, kFloat32, device, c);
  models::Transformer &on_cpu = *twin.cpu, &on_dev = *twin.dev;
  Generator data(2);
  Tensor src = randint(3, 30, {3, 7}, kInt64, &data);
  src.select(0, 1).narrow(0, 5, 2).fill_(0);
  models::DecodeOptions dec;
  dec.max_extra = 5;
  auto tokens = [](const std::vector<models::Hypothesis>& hs) {
    std::vector<std::vector<int64_t>> t;
    for (auto& h : hs) t.push_back(h.tokens);
    return t;
  };
  const std::string where = "decoding on " + device_name(device);
  expect(tokens(models::greedy_decode(on_dev, src.to(device), dec)) == tokens(models::greedy_decode(on_cpu, src, dec)),
         where + ": greedy decoding differs");
  expect(tokens(models::beam_search(on_dev, src.to(device), 3, 0.6, dec)) ==
             tokens(models::beam_search(on_cpu, src, 3, 0.6, dec)),
         where + ": beam search differs");

  // Only what the search needs comes to the host (issue 22): per step, greedy copies [2, B] and
  // beam search [2, B * K, 2K] (doubles), never the [rows, V] distribution. A vocabulary of 500
  // makes one distribution alone larger than either whole budget.
  if (!device.is_cpu()) {
    auto wide = twins<models::Transformer>(23, kFloat32, device, small_transformer(500, 0.0));
    Tensor wide_src = randint(3, 500, {3, 7}, kInt64, &data).to(device);
    const int64_t B = 3, K = 3, max_steps = 7 + dec.max_extra, src_bytes = B * 7 * 8;
    runtime::reset_counts();
    models::greedy_decode(*wide.dev, wide_src, dec);
    const int64_t greedy_bytes = runtime::counts().bytes_to_host;
    runtime::reset_counts();
    models::beam_search(*wide.dev, wide_src, K, 0.6, dec);
    const int64_t beam_bytes = runtime::counts().bytes_to_host;
    std::printf("device_check: bytes copied to the host: greedy %lld, beam search (K = %lld) %lld\n",
                static_cast<long long>(greedy_bytes), static_cast<long long>(K), static_cast<long long>(beam_bytes));
    expect(greedy_bytes <= max_steps * 2 * B * 8 + src_bytes, where + ": greedy decoding copies more than it needs");
    expect(beam_bytes <= max_steps * 2 * B * K * 2 * K * 8 + src_bytes,
           where + ": beam search copies more than it needs");
  }

  models::GPTConfig g = models::GPTConfig::named("tiny", 40);
  g.block_size = 24, g.dropout = 0.0;
  auto gpts = twins<models::GPT>(19, kFloat32, device, g);
  models::GPT &gpt_cpu = *gpts.cpu, &gpt_dev = *gpts.dev;
  models::SampleOptions so;
  so.max_new = 8, so.seed = 3, so.top_k = 10, so.top_p = 0.9, so.temperature = 0.8;
  const std::vector<std::vector<int64_t>> prompts = {{1, 2, 3}, {4}};
  expect(models::generate(gpt_dev, prompts, so) == models::generate(gpt_cpu, prompts, so), where + ": sampling differs");
  so.greedy = true;
  expect(models::generate(gpt_dev, prompts, so) == models::generate(gpt_cpu, prompts, so),
         where + ": greedy generation differs");

  const std::string path = "device_check_model.safetensors";
  on_dev.save(path);
  manual_seed(99);
  models::Transformer loaded(c);
  loaded.to(device);
  loaded.load(path);
  std::remove(path.c_str());
  std::map<std::string, Tensor> saved;
  for (auto& [name, p] : on_dev.named_parameters()) saved[name] = p;
  for (auto& [name, p] : loaded.named_parameters()) {
    expect(p.device() == device, where + ": " + name + " loaded off the device");
    expect(max_diff(p, saved[name]) == 0, where + ": " + name + " does not load back as saved");
  }
  std::printf("device_check: greedy, beam search, sampling and a checkpoint on %s agree with the CPU\n",
              device_name(device).c_str());
}

// The glue around the kernels that a first GPU run would have tripped on (issue 22); each case
// failed on the emulated device before its fix.
void check_regressions(Device device) {
  const std::string on = " on " + device_name(device);
  {  // In-place ops with a scalar made the scalar on the CPU ("expected all tensors on one device").
    Tensor ref = tensor({1.0, -2.0, 3.5, 0.25}, {2, 2}, kFloat64);
    Tensor t = ref.to(device);
    const Tensor mask = gt(ref, 0.5);
    const std::string failed = error_of([&] {
      t.mul_(2.0).add_(1.0).sub_(0.5).div_(4.0).masked_fill_(mask.to(device), 7.0);
      ref.mul_(2.0).add_(1.0).sub_(0.5).div_(4.0).masked_fill_(mask, 7.0);
    });
    expect(failed.empty(), "in-place ops with a scalar" + on + ": " + failed);
    expect(failed.empty() && t.device() == device && max_diff(t, ref) == 0, "in-place ops with a scalar" + on + " differ");
  }
  {  // max/min/argmax over a dim of a 0-d tensor returned their indices on the CPU.
    Tensor x = scalar_tensor(2.5, TensorOptions(kFloat32, device));
    expect(max(x, 0).indices.device() == device && min(x, 0, true).indices.device() == device &&
               argmax(x, 0).device() == device,
           "max/min/argmax of a 0-d tensor" + on + ": the indices are not on the device");
  }
  {  // --detect-anomaly read device memory on the host (a segfault on a GPU), now an Error.
    AnomalyGuard anomaly;
    Tensor x = tensor({4.0, 0.0}, {2}, kFloat64).to(device).requires_grad_();
    const std::string failed = error_of([&] { sum(sqrt(x)).backward(); });  // d sqrt(0) = inf
    expect(failed.find("detect_anomaly") != std::string::npos && failed.find("inf") != std::string::npos,
           "anomaly mode" + on + " names the bad gradient: " + failed);
    Tensor y = tensor({-1.0}, {1}, kFloat64).to(device).requires_grad_();
    const std::string forward = error_of([&] { log(y); });
    expect(forward.find("nan") != std::string::npos, "anomaly mode" + on + " names a NaN forward: " + forward);
  }
  {  // An in-place op whose operand partly overlaps its destination races on a GPU; PyTorch refuses it.
    Tensor a = randn({3, 3}, device);
    const std::string t_err = error_of([&] { a.add_(a.t()); });
    expect(t_err.find("same memory") != std::string::npos, "a.add_(a.t())" + on + " is refused: " + t_err);
    const std::string row_err = error_of([&] { a.copy_(a.select(0, 0)); });
    expect(row_err.find("same memory") != std::string::npos, "a.copy_(a[0])" + on + " is refused: " + row_err);
    expect(error_of([&] { a.mul_(a); }).empty(), "a.mul_(a)" + on + " (the same view) is allowed");
    expect(error_of([&] { a.select(0, 1).copy_(a.select(0, 2)); }).empty(),
           "a[1].copy_(a[2])" + on + " (disjoint rows) is allowed");
  }
  std::printf("device_check: the regression cases pass on %s\n", device_name(device).c_str());
}

void check_runtime(Device device) {
  {  // The tolerance report names the element furthest over, both values and how many are over.
    const std::string diff = largest_difference(tensor({1.0, 2.5, 3.0, 4.0}, {}, kFloat64), tensor({1.0, 2.0, 3.0, 4.0005}, {}, kFloat64), 0, 1e-3);
    expect(diff.find("1 of 4 elements") != std::string::npos && diff.find("at element 1") != std::string::npos &&
               diff.find("device 2.5, CPU 2") != std::string::npos,
           "a tolerance failure names the largest difference: " + diff);
    expect(largest_difference(tensor({1.0}, {}, kFloat64), tensor({1.0005}, {}, kFloat64), 0, 1e-3).empty(), "within the tolerance: no report");
  }
  Tensor a = ones({2, 3}, device), b = ones({2, 3});
  const std::string mixed = error_of([&] { add(a, b); });
  expect(mixed.find("expected all tensors on one device") != std::string::npos &&
             mixed.find(device_name(device)) != std::string::npos && mixed.find("cpu") != std::string::npos,
         "mixing devices names both: " + mixed);
  Tensor table = randn({5, 4}, device);
  Tensor bad = tensor({1, 7}).to(device);
  // On a GPU the kernel sets a flag that the next synchronisation reports; elsewhere the call throws.
  const std::string late = error_of([&] {
    Tensor picked = index_select(table, 0, bad);
    cuda::synchronize(device);
  });
  expect(late.find("out of range") != std::string::npos, "a bad index is reported: " + late);
  expect(error_of([&] { cuda::synchronize(device); }).empty(), "the error flag is cleared once reported");
  // Syncs and launches are counted.
  runtime::reset_counts();
  Tensor c = add(a, a);
  const runtime::Counts launched = runtime::counts();
  expect(launched.launches >= 1 && launched.syncs == 0, fmt::format("add counts {} launches and {} syncs",
                                                                    launched.launches, launched.syncs));
  const float value = c.sum().item<float>();
  expect(value == 12.0f && runtime::counts().syncs == 1, fmt::format("item() counts one sync, got {}", runtime::counts().syncs));
  if (device.is_emulated()) {
    expect(launched.launches == 1, fmt::format("one kernel entry is one launch on the emulated device, got {}",
                                               launched.launches));
    const std::string read = error_of([&] { (void)a.data_ptr<float>(); });
    expect(read.find("outside a kernel") != std::string::npos, "a host read of emulated memory is refused: " + read);
    expect(error_of([&] { (void)a.to(Device::CPU).data_ptr<float>(); }).empty(), "a host copy may be read");
  }
  // Round trips and saving from the device.
  Tensor x = randn({3, 4}, kFloat64);
  expect(max_diff(x.to(device).to(Device::CPU), x) == 0, "to(device) and back is exact");
  expect(x.to(device).to(Device::CPU).data_ptr<double>() != x.data_ptr<double>(), "to(device) copies");
  const std::string path = "device_check.safetensors";
  nn::save_safetensors(path, {{"x", x.to(device)}});
  expect(max_diff(nn::load_safetensors(path).as_map().at("x"), x) == 0, "a tensor saved from the device loads back");
  std::remove(path.c_str());
  if (device.is_cuda()) {
    // The caching allocator: the same sizes again take no new device allocation.
    for (int i = 0; i < 3; ++i) Tensor t = empty({1000, 1000}, device);
    const int64_t mallocs = cuda::memory_stats(device).device_mallocs;
    for (int i = 0; i < 10; ++i) Tensor t = empty({1000, 1000}, device);
    expect(cuda::memory_stats(device).device_mallocs == mallocs, "freed blocks are reused");
    expect(cuda::memory_stats(device).peak_allocated >= 4000000, "the peak counts tensors");
  }
  std::printf("device_check: runtime checks on %s done\n", device_name(device).c_str());
}

// The budget of one train step of the bench's `base` workload (tools/bench.cpp: Transformer base,
// vocabulary 37000, batch 32 x 32, dropout 0.1, Adam, the Trainer's step with its non-finite
// guard): host synchronisations on every device, and kernel launches on the emulated device (one per
// kernel entry; a GPU's count is reported, not held: some entries launch two or three kernels).
// Measured 1 sync (the Trainer's one read of the losses and the gradient norm, Note [One sync per
// step] in apps/train/trainer.cpp) and 889 launches; PyTorch's eager step on a GPU makes about
// 1,500 (issue 22). Lower them when the step needs fewer; never raise them to let a change in.
constexpr int64_t kSyncBudget = 1;
constexpr int64_t kLaunchBudget = 900;
constexpr int64_t kLmLaunchBudget = 310;

void check_step_budget(Device device) {
  models::TransformerConfig c;
  c.src_vocab = c.tgt_vocab = 37000;
  c.d_model = 512, c.heads = 8, c.d_ff = 2048, c.enc_layers = c.dec_layers = 6, c.dropout = 0.1, c.pad_id = 0;
  manual_seed(1234);
  models::Transformer model(c);
  model.to(device);
  optim::AdamOptions ao = transformer_adam();
  ao.lr = 1e-4;
  optim::Adam adam(model.parameters(), ao);
  Generator data(42);
  Tensor tgt = randint(3, 37000, {32, 33}, kInt64, &data);
  Tensor src = randint(3, 37000, {32, 32}, kInt64, &data).to(device);
  Tensor tgt_in = tgt.slice(1, 0, 32).contiguous().to(device), tgt_out = tgt.slice(1, 1, 33).contiguous().to(device);
  apps::TrainerOptions to;
  to.progress = false;
  apps::Trainer trainer(model, adam, nullptr, to);
  const std::vector<apps::TrainBatch> batch = {{32 * 32, [&] { return model.loss(src, tgt_in, tgt_out, 0.1); }}};
  trainer.step(batch);  // the first step creates Adam's state
  runtime::reset_counts();
  trainer.step(batch);
  const runtime::Counts n = runtime::counts();
  expect(n.syncs <= kSyncBudget, fmt::format("the base train step on {} synchronises {} times (budget {})",
                                             device_name(device), n.syncs, kSyncBudget));
  expect(!device.is_emulated() || n.launches <= kLaunchBudget, fmt::format("the base train step on {} launches {} kernels (budget {})",
                                                  device_name(device), n.launches, kLaunchBudget));
  std::printf("device_check: the base train step on %s: %lld syncs (budget %lld), %lld launches (budget %lld)\n",
              device_name(device).c_str(), (long long)n.syncs, (long long)kSyncBudget, (long long)n.launches,
              (long long)kLaunchBudget);

  // The GPT recipe's step (the bench's `lm` workload: mini, block 64, batch 32, AdamW with groups,
  // clipping at 1): the same one sync, clipping included; 301 launches measured.
  models::GPTConfig g = models::GPTConfig::named("mini", 4000);
  g.block_size = 64, g.dropout = 0.1;
  models::GPT gpt(g);
  gpt.to(device);
  optim::AdamWOptions go;
  go.lr = 2e-3, go.beta1 = 0.9, go.beta2 = 0.95, go.eps = 1e-8, go.weight_decay = 0.1;
  optim::AdamW adamw({{gpt.decay_parameters(), std::nullopt, 0.1}, {gpt.no_decay_parameters(), std::nullopt, 0.0}}, go);
  Tensor ids = randint(0, 4000, {32, 65}, kInt64, &data);
  Tensor x = ids.slice(1, 0, 64).contiguous().to(device), y = ids.slice(1, 1, 65).contiguous().to(device);
  apps::TrainerOptions lm_options;
  lm_options.progress = false, lm_options.clip_norm = 1.0;
  apps::Trainer lm_trainer(gpt, adamw, nullptr, lm_options);
  const std::vector<apps::TrainBatch> lm_batch = {{32 * 64, [&] { return gpt.loss(x, y); }}};
  lm_trainer.step(lm_batch);
  runtime::reset_counts();
  lm_trainer.step(lm_batch);
  const runtime::Counts m = runtime::counts();
  expect(m.syncs <= kSyncBudget, fmt::format("the GPT (lm) train step with clipping on {} synchronises {} times (budget {})",
                                             device_name(device), m.syncs, kSyncBudget));
  expect(!device.is_emulated() || m.launches <= kLmLaunchBudget,
         fmt::format("the GPT (lm) train step on {} launches {} kernels (budget {})", device_name(device), m.launches,
                     kLmLaunchBudget));
  std::printf("device_check: the lm train step on %s: %lld syncs, %lld launches (budget %lld)\n",
              device_name(device).c_str(), (long long)m.syncs, (long long)m.launches, (long long)kLmLaunchBudget);
}

// topk on the device (beam search's selection; the CUDA kernel takes k <= 64 sorted) against the
// CPU kernel, value for value and index for index: rows longer than a warp's group and a block's,
// ties, NaN and -0/+0, both directions, along the last dim and dim 0, row counts that do not fill
// a block.
void check_topk(Device device) {
  Generator g(41);
  size_t n = 0;
  for (int64_t len : {33, 300, 5000})
    for (int64_t rows : {1, 7}) {
      // Small integers (many ties), with NaN, -0 and +0 scattered in.
      Tensor x = randint(-4, 5, {rows, len}, kInt64, &g).to(kFloat32);
      Tensor where = rand({rows, len}, kFloat64, &g);
      x = masked_fill(x, lt(where, 0.03), std::nan(""));
      x = masked_fill(x, gt(where, 0.97), -0.0);
      for (DType dt : {kFloat32, kFloat64})
        for (int64_t k : {1, 8, 64})
          for (bool largest : {true, false})
            for (int64_t dim : {-1, 0}) {
              const Tensor in = (dim == 0 ? x.t() : x).to(dt);  // dim 0 of the transpose: a strided input
              if (k > in.size(dim)) continue;
              const std::string where_ = fmt::format("topk k {} of {} x {}, dim {}, {}, {} on {}", k, in.size(0),
                                                     in.size(1), dim, largest ? "largest" : "smallest", dtype_name(dt),
                                                     device_name(device));
              ValuesIndices cpu = topk(in, k, dim, largest, true);
              ValuesIndices dev = topk(in.to(device), k, dim, largest, true);
              expect(dev.values.device() == device && dev.indices.device() == device, where_ + ": result off the device");
              expect(dev.indices.to(Device::CPU).to_vector<int64_t>() == cpu.indices.to_vector<int64_t>(),
                     where_ + ": indices differ");
              // Values bit for bit, NaN included (compared through their indices above, and as doubles here).
              const std::vector<double> a = dev.values.to(Device::CPU).to(kFloat64).to_vector<double>(),
                                        b = cpu.values.to(kFloat64).to_vector<double>();
              bool same = a.size() == b.size();
              for (size_t i = 0; same && i < a.size(); ++i)
                same = (std::isnan(a[i]) && std::isnan(b[i])) ||
                       (a[i] == b[i] && std::signbit(a[i]) == std::signbit(b[i]));
              expect(same, where_ + ": values differ");
              ++n;
            }
    }
  std::printf("device_check: %zu topk cases on %s equal the CPU's, index for index\n", n, device_name(device).c_str());
}

// Autocast to bfloat16 on the device (a GPU: cuBLAS's bf16 gemm with float32 accumulation):
// matmul (batched, broadcast, transposed) and linear, forward and backward, against the float64
// product of the operands rounded to bfloat16 (bf16_round), which is what a float32 accumulation
// of exact bf16 products approaches; where the device cannot, the refusal names it.
void check_bf16(Device device) {
  std::string why;
  if (!bf16_supported(device, &why)) {
    const std::string refused = error_of([&] { AutocastGuard guard(Precision::BFloat16, device); });
    expect(refused.find("autocast to bfloat16") != std::string::npos, "bf16 on " + device_name(device) +
                                                                          " is refused with the reason: " + refused);
    check.note("bf16 autocast not run on " + device_name(device) + ": " + why);
    return;
  }
  // Not exact even on the emulated device: float32 accumulation against a float64 reference.
  auto near = [](const Tensor& got, const Tensor& want, const std::string& what) {
    const std::string diff = largest_difference(got.to(Device::CPU).to(kFloat64), want, 1e-5, 1e-4);
    expect(diff.empty(), what + ": " + diff);
  };
  auto rounded = [](const Tensor& t) {  // float64 values of t's elements rounded to bfloat16
    std::vector<float> v = t.detach().to(Device::CPU).contiguous().to_vector<float>();
    std::vector<double> r(v.size());
    for (size_t i = 0; i < v.size(); ++i) r[i] = bf16_to_float(bf16_round(v[i]));
    return tensor(r, t.sizes(), kFloat64);
  };
  Generator g(17);
  struct Case {
    Shape a, b;
    bool transpose_b;
  };
  const std::vector<Case> cases = {{{33, 70}, {70, 45}, false}, {{3, 17, 64}, {3, 64, 9}, false},
                                   {{2, 3, 5, 40}, {40, 7}, false}, {{6, 31}, {12, 31}, true}};
  size_t n = 0;
  for (const Case& c : cases) {
    const std::string where = fmt::format("bf16 matmul {} x {}{} on {}", c.a, c.b, c.transpose_b ? "^T" : "",
                                          device_name(device));
    Tensor a = randn(c.a, kFloat32, &g), b = randn(c.b, kFloat32, &g);
    Tensor ad = a.to(device).requires_grad_(), bd = b.to(device).requires_grad_();
    Tensor out;
    {
      AutocastGuard guard(Precision::BFloat16, device);
      out = matmul(ad, c.transpose_b ? bd.t() : bd);
    }
    const Tensor want = matmul(rounded(a), c.transpose_b ? rounded(b).t() : rounded(b));
    expect(out.device() == device && out.dtype() == kFloat32, where + ": the output is not float32 on the device");
    near(out, want, where + ": differs from the product of the rounded operands");
    sum(out).backward();  // the backward at the forward's precision: d a = 1 b^T in bf16
    const Tensor ones_out = ones(out.sizes(), kFloat64);
    Tensor want_da = matmul(rounded(ones_out.to(kFloat32)), (c.transpose_b ? rounded(b).t() : rounded(b)).transpose(-1, -2));
    near(ad.grad(), want_da, where + ": the gradient of a differs");
    ++n;
  }
  {  // linear, as the models call it: x W^T + b with W [out, in]
    Tensor x = randn({4, 9, 48}, kFloat32, &g), w = randn({20, 48}, kFloat32, &g), bias = randn({20}, kFloat32, &g);
    Tensor out;
    {
      AutocastGuard guard(Precision::BFloat16, device);
      out = linear(x.to(device), w.to(device), bias.to(device));
    }
    const Tensor want = add(matmul(rounded(x), rounded(w).t()), bias.to(kFloat64));
    near(out, want, "bf16 linear on " + device_name(device) + " differs");
    ++n;
  }
  {  // a training step's use: the weight's copy kept for the guard (Note [Autocast weight cache]),
     // read again in its other layout by the backward's d x = g W
    Tensor x = randn({4, 9, 48}, kFloat32, &g), w = randn({20, 48}, kFloat32, &g), gy = randn({4, 9, 20}, kFloat32, &g);
    Tensor xd = x.to(device).requires_grad_(), wd = w.to(device).requires_grad_();
    Tensor out;
    AutocastCacheCounts counts;
    {
      AutocastGuard guard(Precision::BFloat16, device);
      Tensor x_act = mul(xd, 1.0);  // an activation, not kept
      out = linear(x_act, wd, Tensor());
      sum(mul(out, gy.to(device))).backward();
      counts = autocast_cache_counts();
    }
    const std::string where = "bf16 linear's forward and backward in one guard on " + device_name(device);
    expect(counts.copies == 1 && counts.reuses == 1,
           fmt::format("{}: {} weight copies and {} reuses, expected 1 and 1", where, counts.copies, counts.reuses));
    near(out, matmul(rounded(x), rounded(w).t()), where + ": the output differs");
    near(xd.grad(), matmul(rounded(gy), rounded(w)), where + ": d x differs");
    ++n;
  }
  std::printf("device_check: %zu bf16 autocast cases on %s match the float64 product of the rounded operands\n", n,
              device_name(device).c_str());
}

// The sections (`device_check cuda SECTION...`; all by default): each runs alone, so that a
// sanitizer or a short GPU window can take the ones that fit. `ops:PREFIX` runs the op table's
// ops whose names start with PREFIX.
struct Section {
  const char* name;
  const char* what;
  bool gpu_only;
  std::function<void(Device)> run;
};

const std::vector<Section>& sections() {
  static const std::vector<Section> all = {
      {"runtime", "mixed devices, device-side errors, counts, round trips, the caching allocator", false, check_runtime},
      {"regressions", "the bugs a first GPU run would have hit", false, check_regressions},
      {"ops", "every op of the OpInfo table: outputs, gradients, errors, float64 gradcheck and gradgradcheck", false,
       [](Device d) { check_op_table(d); }},
      {"steps", "a Transformer and a GPT train step in float64 and float32", false,
       [](Device d) {
         check_transformer_step(d, kFloat64);
         check_transformer_step(d, kFloat32);
         check_gpt_step(d, kFloat64);
         check_gpt_step(d, kFloat32);
       }},
      {"optimizers", "SGD, Adam, AdamW with groups, clipping, anomaly mode", false, check_optimizers},
      {"decoding", "greedy, beam search and sampling, a checkpoint saved and loaded on the device", false,
       check_decoding_and_checkpoints},
      {"topk", "topk against the CPU, index for index", false, check_topk},
      {"budget", "the base and lm train steps' syncs and launches", false, check_step_budget},
      {"bf16", "autocast to bfloat16: matmul and linear, forward and backward, or its refusal", false, check_bf16},
      {"attention", "both attention kernels against the CPU, a step through the tiled one, its memory", true,
       [](Device d) {
         check_attention(d, cuda::AttentionKernel::Gemm);
         check_attention(d, cuda::AttentionKernel::Tiled);
         cuda::set_attention_kernel(cuda::AttentionKernel::Tiled);  // the model step through the tiled kernel
         check_transformer_step(d, kFloat32);
         cuda::set_attention_kernel(cuda::AttentionKernel::Auto);
         check_attention_memory(d);
       }},
      {"attention-gemm", "the gemm attention kernel against the CPU (for a sanitizer)", true,
       [](Device d) { check_attention(d, cuda::AttentionKernel::Gemm); }},
      {"attention-tiled", "the tiled attention kernels against the CPU (for a sanitizer)", true,
       [](Device d) { check_attention(d, cuda::AttentionKernel::Tiled); }},
  };
  return all;
}

void run_section(const std::string& name, Device device) {
  if (name.rfind("ops:", 0) == 0) return check_op_table(device, name.substr(4));
  for (const Section& s : sections())
    if (name == s.name) {
      if (s.gpu_only && !device.is_cuda()) return;  // the emulated device runs the CPU's attention kernel
      check.note(fmt::format("section {} on {}", s.name, device_name(device)));
      return s.run(device);
    }
}

bool known_section(const std::string& name) {
  if (name.rfind("ops:", 0) == 0) return true;
  for (const Section& s : sections())
    if (name == s.name) return true;
  return false;
}

int run(const std::string& kind, std::vector<std::string> names) {
  if (names.empty())  // every section once (attention covers attention-gemm and attention-tiled)
    for (const Section& s : sections())
      if (std::string(s.name).rfind("attention-", 0) != 0) names.push_back(s.name);
  if (kind == "emulated") {
    exact = true;
    for (const std::string& n : names) run_section(n, Device::Emulated);
    return 0;
  }
  if (!cuda::built() || !cuda::is_available()) {
    check.note("cuda skipped: " + cuda::unavailable_reason());
    return testing::Checker::kSkipped;
  }
  for (int i = 0; i < cuda::device_count(); ++i)
    for (const std::string& n : names) run_section(n, Device(DeviceType::CUDA, i));
  return 0;
}

int usage() {
  std::fprintf(stderr, "usage: device_check emulated|cuda [SECTION...]   (all sections by default)\nsections:\n");
  for (const Section& s : sections())
    std::fprintf(stderr, "  %-16s %s%s\n", s.name, s.what, s.gpu_only ? " (GPU only)" : "");
  std::fprintf(stderr, "  %-16s the op table's ops whose names start with PREFIX\n", "ops:PREFIX");
  return testing::Checker::kUsage;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string kind = argc > 1 ? argv[1] : "";
  if (argc < 2 || (kind != "emulated" && kind != "cuda")) return usage();
  std::vector<std::string> names(argv + 2, argv + argc);
  for (const std::string& n : names)
    if (!known_section(n)) {
      std::fprintf(stderr, "device_check: unknown section '%s'\n", n.c_str());
      return usage();
    }
  return check.run([&] { return run(kind, names); });
}
