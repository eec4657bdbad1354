// The CUDA backend against the CPU (ctest `cuda`, label cuda). Exits 77, which ctest reports as
// skipped, with one line saying why, where there is no CUDA build or no GPU: it never passes
// without having run. On a GPU it checks, on every device:
//   1. every op of the OpInfo table (tests/opinfo.h), every sample PyTorch accepts, on inputs
//      with the same layout (non-contiguous, expanded, 0-d, empty): the same outputs, the same
//      gradients and the same errors as the CPU (as ggml's test-backend-ops does);
//   2. gradcheck in float64 on the device for the differentiable float64 samples;
//   3. one Transformer training step, dropout on (the same masks on both devices): the loss,
//      every gradient and every weight after Adam, in float64 (tight) and float32;
//   4. both attention kernels (cuda::set_attention_kernel: gemm and tiled) on shapes across the
//      tiled kernels' tiles, with masks, causality and dropout, and the tiled kernel's memory;
//   5. the runtime: mixed devices name both, an index out of range is reported at the next
//      synchronisation, the caching allocator reuses blocks, and a model saves and loads.
#define DOCTEST_CONFIG_DISABLE
#include <cstdio>
#include <map>

#include "tapestry/ops/cuda.h"
#include "tapestry/ops/kernels.h"
#include "tests/helpers.h"
#include "tests/opinfo.h"

using namespace tapestry;
using testing::error_of;
using testing::max_diff;

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
  }
}

// t on `device` with t's exact layout: the whole storage copied, the same view over it.
Tensor same_layout_on(const Tensor& t, Device device) {
  if (!t.defined()) return t;
  auto storage = std::make_shared<Storage>(t.storage()->nbytes, device);
  cuda::detail::copy_bytes(storage->data, device, t.storage()->data, t.device(), t.storage()->nbytes);
  Tensor moved = make_tensor(storage, t.sizes(), t.strides(), t.offset(), t.dtype());
  if (t.requires_grad()) moved.requires_grad_();
  return moved;
}

// |a - b| within atol + rtol |b| everywhere, NaN where NaN, equal infinities.
bool close(const Tensor& gpu, const Tensor& cpu, double rtol, double atol) {
  if (gpu.defined() != cpu.defined()) return false;
  if (!gpu.defined()) return true;
  if (gpu.sizes() != cpu.sizes() || gpu.dtype() != cpu.dtype()) return false;
  std::vector<double> x = gpu.to_vector<double>(), y = cpu.to_vector<double>();
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) || std::isnan(y[i])) {
      if (std::isnan(x[i]) != std::isnan(y[i])) return false;
      continue;
    }
    if (x[i] == y[i]) continue;
    if (std::fabs(x[i] - y[i]) > atol + rtol * std::fabs(y[i])) return false;
  }
  return true;
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
        expect(close(gpu.outputs[i], cpu.outputs[i], f32 ? 1e-4 : 1e-10, f32 ? 1e-5 : 1e-12),
               fmt::format("{}: output {} differs from the CPU's", where, i));
      }
      expect(cpu.backward_error.empty() == gpu.backward_error.empty(), where + ": backward errors differ: " +
                                                                            cpu.backward_error + " / " + gpu.backward_error);
      for (size_t i = 0; i < cpu.grads.size(); ++i) {
        const bool f32 = cpu.grads[i].defined() && cpu.grads[i].dtype() == kFloat32;
        expect(close(gpu.grads[i], cpu.grads[i], f32 ? 1e-3 : 1e-9, f32 ? 1e-4 : 1e-11),
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
        return parts.size() == 1 ? parts[0] : cat(parts, 0);
      };
      const std::string failed = error_of([&] { gradcheck(f, leaves); });
      expect(failed.empty(), where + ": gradcheck on the device: " + failed);
    }
  }
  std::printf("cuda: %zu op samples%s on %s agree with the CPU\n", samples,
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
      Tensor out = scaled_dot_product_attention(qd, kd, vd, mask.defined() ? mask.to(on) : Tensor(), c.causal,
                                                c.dropout, std::nullopt, &seeds);
      sum(mul(out, dout.to(on))).backward();
      return TensorList{out, qd.grad(), kd.grad(), vd.grad()};
    };
    const TensorList cpu = run(Device::CPU), gpu = run(device);
    const bool f32 = c.dtype == kFloat32;
    const char* names[] = {"the output", "the gradient of q", "the gradient of k", "the gradient of v"};
    for (size_t i = 0; i < cpu.size(); ++i)
      expect(close(gpu[i].to(Device::CPU), cpu[i], f32 ? 1e-4 : 1e-10, f32 ? 1e-5 : 1e-12),
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
    expect(close(gpu.out.to(Device::CPU), cpu.out, 1e-10, 1e-12), where + ": the output differs from the CPU's");
    expect(close(gpu.lse.to(Device::CPU), cpu.lse, 1e-10, 1e-12), where + ": the statistics differ from the CPU's");
    ++n;
  }
  check_op_table(device, "sdpa");
  std::printf("cuda: the %s attention kernel agrees with the CPU on %zu shapes\n", kernel_name(kernel), n);
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
  std::printf("cuda: attention over 8 heads of 4096 x 4096 peaked at %lld MiB beyond its inputs (Auto: tiled)\n",
              static_cast<long long>(used >> 20));
}

// One Transformer step with dropout on, on the CPU and on `device`, from the same weights and
// seeds: the loss, every gradient and every weight after Adam.
void check_transformer_step(Device device, DType dtype) {
  models::TransformerConfig c;
  c.src_vocab = c.tgt_vocab = 40;
  c.d_model = 32, c.heads = 4, c.d_ff = 64, c.enc_layers = c.dec_layers = 2, c.dropout = 0.1, c.pad_id = 0;
  manual_seed(7);
  models::Transformer on_cpu(c);
  manual_seed(7);
  models::Transformer on_gpu(c);
  on_cpu.to(dtype);
  on_gpu.to(dtype);
  on_gpu.to(device);
  Generator data(3);
  Tensor src = randint(1, 40, {4, 9}, kInt64, &data), tgt = randint(1, 40, {4, 8}, kInt64, &data);
  src.select(0, 0).narrow(0, 6, 3).fill_(0);  // padding in one sentence
  Tensor tgt_in = tgt.narrow(1, 0, 7).contiguous(), tgt_out = tgt.narrow(1, 1, 7).contiguous();
  optim::AdamOptions ao;
  ao.lr = 1e-3, ao.beta1 = 0.9, ao.beta2 = 0.98, ao.eps = 1e-9;
  optim::Adam adam_cpu(on_cpu.parameters(), ao), adam_gpu(on_gpu.parameters(), ao);
  manual_seed(11);
  Tensor loss_cpu = on_cpu.loss(src, tgt_in, tgt_out, 0.1);
  loss_cpu.backward();
  manual_seed(11);  // the same dropout seeds, so the same masks
  Tensor loss_gpu = on_gpu.loss(src.to(device), tgt_in.to(device), tgt_out.to(device), 0.1);
  loss_gpu.backward();
  const bool f64 = dtype == kFloat64;
  const std::string where = fmt::format("Transformer step on {} in {}", device_name(device), dtype_name(dtype));
  expect(max_diff(loss_gpu, loss_cpu) < (f64 ? 1e-10 : 1e-5), where + ": the loss differs");
  std::map<std::string, Tensor> cpu_params;
  for (auto& [name, p] : on_cpu.named_parameters()) cpu_params[name] = p;
  for (auto& [name, p] : on_gpu.named_parameters()) {
    const Tensor& q = cpu_params[name];
    expect(p.device() == device, where + ": " + name + " is not on the device");
    expect(p.grad().defined() == q.grad().defined(), where + ": " + name + " has a gradient on one device only");
    if (p.grad().defined())
      expect(max_diff(p.grad(), q.grad()) < (f64 ? 1e-9 : 1e-4), where + ": the gradient of " + name + " differs");
  }
  adam_cpu.step();
  adam_gpu.step();
  for (auto& [name, p] : on_gpu.named_parameters())
    expect(max_diff(p, cpu_params[name]) < (f64 ? 1e-9 : 2e-5), where + ": " + name + " after Adam differs");
  std::printf("cuda: %s agrees with the CPU (loss %.6f)\n", where.c_str(), loss_gpu.item<double>());
}

void check_runtime(Device device) {
  Tensor a = ones({2, 3}, device), b = ones({2, 3});
  const std::string mixed = error_of([&] { add(a, b); });
  expect(mixed.find("expected all tensors on one device") != std::string::npos &&
             mixed.find(device_name(device)) != std::string::npos && mixed.find("cpu") != std::string::npos,
         "mixing devices names both: " + mixed);
  Tensor table = randn({5, 4}, device);
  Tensor bad = tensor({1, 7}).to(device);
  Tensor picked = index_select(table, 0, bad);  // queued; the GPU finds 7 out of range
  const std::string late = error_of([&] { cuda::synchronize(device); });
  expect(late.find("out of range") != std::string::npos, "a bad index is reported at synchronize: " + late);
  expect(error_of([&] { cuda::synchronize(device); }).empty(), "the error flag is cleared once reported");
  // The caching allocator: the same sizes again take no new device allocation.
  for (int i = 0; i < 3; ++i) Tensor t = empty({1000, 1000}, device);
  const int64_t mallocs = cuda::memory_stats(device).device_mallocs;
  for (int i = 0; i < 10; ++i) Tensor t = empty({1000, 1000}, device);
  expect(cuda::memory_stats(device).device_mallocs == mallocs, "freed blocks are reused");
  expect(cuda::memory_stats(device).peak_allocated >= 4000000, "the peak counts tensors");
  // Round trips and saving from the device.
  Tensor x = randn({3, 4}, kFloat64);
  expect(max_diff(x.to(device).to(Device::CPU), x) == 0, "to(device) and back is exact");
  const std::string path = "cuda_check.safetensors";
  nn::save_safetensors(path, {{"x", x.to(device)}});
  expect(max_diff(nn::load_safetensors(path).as_map().at("x"), x) == 0, "a tensor saved from the GPU loads back");
  std::remove(path.c_str());
  std::printf("cuda: runtime checks on %s done (peak %lld bytes in tensors)\n", device_name(device).c_str(),
              static_cast<long long>(cuda::memory_stats(device).peak_allocated));
}

}  // namespace

int main() {
  if (!cuda::built()) {
    std::printf("cuda: skipped: %s\n", cuda::unavailable_reason().c_str());
    return 77;
  }
  if (!cuda::is_available()) {
    std::printf("cuda: skipped: %s\n", cuda::unavailable_reason().c_str());
    return 77;
  }
  try {
    for (int i = 0; i < cuda::device_count(); ++i) {
      const Device device(DeviceType::CUDA, i);
      check_runtime(device);
      check_op_table(device);
      check_transformer_step(device, kFloat64);
      check_transformer_step(device, kFloat32);
      check_attention(device, cuda::AttentionKernel::Gemm);
      check_attention(device, cuda::AttentionKernel::Tiled);
      cuda::set_attention_kernel(cuda::AttentionKernel::Tiled);  // the model step through the tiled kernel
      check_transformer_step(device, kFloat32);
      cuda::set_attention_kernel(cuda::AttentionKernel::Auto);
      check_attention_memory(device);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAIL: %s\n", e.what());
    return 1;
  }
  if (failures) std::fprintf(stderr, "cuda: %d failures\n", failures);
  else std::printf("cuda: all checks passed\n");
  return failures ? 1 : 0;
}
