// Raw compute kernels: no autograd, no recording. Every differentiable op in autograd/ calls
// these for its forward and its backward. Each entry point is one row of
// ops/detail/kernel_entries.h, from which ops/dispatch.cpp makes its definition here: it checks
// that the tensors of a call share one device and routes it to that device's backend: ops/cpu/
// (always built) or ops/cuda/ (-DTAPESTRY_CUDA=ON), each of which defines every entry in its own
// namespace (kernels::cpu, kernels::cuda; ops/detail/backend.h). Inputs may be any strided views;
// outputs are fresh contiguous tensors on the inputs' device unless the name ends in '_' (writes
// in place).
#pragma once
#include <initializer_list>
#include <random>
#include <utility>
#include <vector>

#include "tapestry/ops/tensor.h"

namespace tapestry::kernels {

// ReluBackward: a where b > 0, else 0 (the gradient a of relu given its output b).
// GeluBackward / GeluTanhBackward: a = the incoming gradient, b = gelu's input (one pass, fused).
enum class Binary { Add, Sub, Mul, Div, Maximum, Minimum, ReluBackward, GeluBackward, GeluTanhBackward, Eq, Ne, Lt, Le, Gt, Ge };
enum class Unary { Neg, Exp, Log, Sqrt, Rsqrt, Tanh, Relu, Gelu, GeluTanh, Sigmoid, Abs, Sign, PowScalar, Clamp, Log1p, Expm1 };
enum class Reduce { Sum, Max, Min };

bool is_comparison(Binary kind);

struct LayerNormOut { Tensor y, mean, rstd; };
struct LayerNormGrads { Tensor dx, dweight, dbias; };
// loss: 0-d, the summed loss times scale; lse: [N, 2], each row's max and log of sum(exp(x - max))
// (Note [Row statistics] in ops/cpu/loss.cpp); scale: 0-d (the logits'
// dtype), 1 for a sum, 1 / the counted rows for a mean (0 when no row counts). All on the logits'
// device: nothing comes back to the host (Note [Syncs] in ops/runtime.h).
struct CrossEntropyOut { Tensor loss, lse, scale; };
struct AttentionOut { Tensor out, lse; };
struct AttentionGrads { Tensor dq, dk, dv; };
// One Adam/AdamW update of a parameter from its gradient, in place on param, exp_avg and
// exp_avg_sq (all contiguous, one dtype, one device). The arithmetic and its order are PyTorch's
// single-tensor Adam: decoupled (AdamW) multiplies param by decay = 1 - lr * weight_decay,
// otherwise weight_decay * param is added to the gradient; then
// param -= step_size * m / (sqrt(v) / bias_correction2_sqrt + eps).
struct AdamStep {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  double step_size = 0;              // lr / (1 - beta1^t)
  double bias_correction2_sqrt = 1;  // sqrt(1 - beta2^t)
  double decay = 1;                  // 1 - lr * weight_decay (decoupled only)
  bool decoupled = false;
};

// Values and indices (max/min over a dim, sort, topk).
using TensorPair = std::pair<Tensor, Tensor>;

#define TP_KERNEL(Ret, name, params, args, check) Ret name params;
#include "tapestry/ops/detail/kernel_entries.h"
#undef TP_KERNEL

// The short forms (kernel rows take no default arguments).
inline Tensor unary(const char* op, Unary kind, const Tensor& a, double p0 = 0) { return unary(op, kind, a, p0, 0); }
inline Tensor cumsum(const Tensor& a, int64_t dim) { return cumsum(a, dim, false); }

// Composites of copy_, defined once for every device (ops/dispatch.cpp): a itself when already
// contiguous / of that dtype, else a fresh contiguous copy on a's device; and the concatenation
// along dim (every tensor on one device, one dtype, equal sizes except in dim).
Tensor contiguous(const Tensor& a);
Tensor to_dtype(const Tensor& a, DType dtype);
// a itself when already on `device`, else a contiguous copy there (version 0; no autograd:
// Tensor::to(Device) is the differentiable form).
Tensor to_device(const Tensor& a, Device device);
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim);

// Throws an Error naming the op when t is not on `device`.
void check_device(const char* op, const Tensor& t, Device device = Device::CPU);
// The one device of an op's defined tensor arguments (undefined ones are skipped); tensors on
// two devices throw an Error naming the op, both devices and the shapes. No tensor: the CPU.
Device common_device(const char* op, std::initializer_list<const Tensor*> tensors);

}  // namespace tapestry::kernels
