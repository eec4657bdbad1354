// Entries of the CUDA backend that run on the host: the tensor is copied to the CPU, the CPU
// kernel runs, and the result is copied back. These are the ops of decoding and sampling (sort,
// cumsum, multinomial, and topk beyond a small sorted k: reduce.cu), called a few times per
// generated token, never in a training step; the round trip keeps their exact CPU semantics
// (stable order, NaN ranks, one engine draw per sample) in one place. Each is a candidate for a
// device kernel when a profile shows it.
#include "tapestry/ops/cuda/common.cuh"

namespace tapestry::kernels::cuda {

Tensor cumsum(const Tensor& a, int64_t dim, bool reverse) {
  return to_device(cpu::cumsum(to_device(a, Device::CPU), dim, reverse), a.device());
}

std::pair<Tensor, Tensor> sort(const Tensor& a, int64_t dim, bool descending, bool stable) {
  auto [values, indices] = cpu::sort(to_device(a, Device::CPU), dim, descending, stable);
  return {to_device(values, a.device()), to_device(indices, a.device())};
}

Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement, std::mt19937_64& engine) {
  return to_device(cpu::multinomial(to_device(probs, Device::CPU), num_samples, replacement, engine), probs.device());
}

}  // namespace tapestry::kernels::cuda
