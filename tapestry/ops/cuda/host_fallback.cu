// Entries of the CUDA backend that run on the host: the tensor is copied to the CPU, the CPU
// kernel runs, and the result is copied back. These are the ops of decoding and sampling (sort,
// topk, cumsum, multinomial) and tril/triu, called a few times per generated token or once per
// model, never in a training step's inner loop; the round trip keeps their exact CPU semantics
// (stable order, NaN ranks, one engine draw per sample) in one place. Each is a candidate for a
// device kernel when a profile shows it.
#include "tapestry/ops/cuda/common.cuh"

namespace tapestry::kernels::cuda {

namespace {

Tensor to_host(const Tensor& t) {
  Tensor host = empty(t.sizes(), TensorOptions(t.dtype(), Device::CPU));
  ::tapestry::kernels::copy_(host, t);  // the dispatching copy: device to host
  return host;
}

Tensor to_device(const Tensor& host, Device device) {
  Tensor out = empty(host.sizes(), TensorOptions(host.dtype(), device));
  ::tapestry::kernels::copy_(out, host);
  return out;
}

}  // namespace

Tensor triangle(const char* op, const Tensor& a, int64_t diagonal, bool upper) {
  return to_device(cpu::triangle(op, to_host(a), diagonal, upper), a.device());
}

Tensor cumsum(const Tensor& a, int64_t dim, bool reverse) {
  return to_device(cpu::cumsum(to_host(a), dim, reverse), a.device());
}

std::pair<Tensor, Tensor> sort(const Tensor& a, int64_t dim, bool descending, bool stable) {
  auto [values, indices] = cpu::sort(to_host(a), dim, descending, stable);
  return {to_device(values, a.device()), to_device(indices, a.device())};
}

std::pair<Tensor, Tensor> topk(const Tensor& a, int64_t k, int64_t dim, bool largest, bool sorted) {
  auto [values, indices] = cpu::topk(to_host(a), k, dim, largest, sorted);
  return {to_device(values, a.device()), to_device(indices, a.device())};
}

Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement, std::mt19937_64& engine) {
  return to_device(cpu::multinomial(to_host(probs), num_samples, replacement, engine), probs.device());
}

}  // namespace tapestry::kernels::cuda
