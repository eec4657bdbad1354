// The one place where kernel entry points choose a backend. Each row of ops/detail/kernel_entries.h
// becomes an entry here (the TP_KERNEL definition near the end): it runs the row's checks that need
// no data (dtypes, shapes, in-place rules: once here, not in every backend), finds the device its
// tensors share (two devices in one call is an Error naming both) and forwards the call, unchanged,
// to kernels::cpu or kernels::cuda inside a KernelScope (device guard, profile scope, emulated
// launch). No op switches on devices. copy_ also moves data between devices (a staged byte copy
// plus the backend's strided copy); contiguous, to_dtype and cat are composites of copy_, defined
// here for every device.
#include <algorithm>
#include <optional>
#include <type_traits>

#include "tapestry/ops/detail/backend.h"
#include "tapestry/ops/cuda.h"
#include "tapestry/ops/factory.h"
#include "tapestry/ops/profile.h"
#include "tapestry/ops/runtime.h"

namespace tapestry::kernels {

bool is_comparison(Binary kind) { return kind >= Binary::Eq; }

void check_device(const char* op, const Tensor& t, Device device) {
  TP_CHECK(t.device() == device, "{}: expected a tensor on {}, got one on {} (shape {})", op, device_name(device),
           device_name(t.device()), t.sizes());
}

Device common_device(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor* t : tensors) {
    if (!t->defined()) continue;
    if (!first) first = t;
    else
      TP_CHECK(t->device() == first->device(),
               "{}: expected all tensors on one device, got {} (shape {}) and {} (shape {}); move one with .to()", op,
               device_name(first->device()), first->sizes(), device_name(t->device()), t->sizes());
  }
  return first ? first->device() : Device::CPU;
}

namespace {

// In-place writes into an expanded view would write one element many times (and race).
void check_writable(const char* op, const Tensor& dst) {
  if (dst.numel() == 0) return;  // nothing is written
  for (int64_t d = 0; d < dst.dim(); ++d)
    TP_CHECK(dst.stride(d) != 0 || dst.size(d) <= 1,
             "{}: the destination of shape {} (strides {}) is an expanded view whose elements share memory; "
             "clone() it first", op, dst.sizes(), dst.strides());
}

// The element range [first, last] of t in its storage, in bytes.
std::pair<int64_t, int64_t> byte_range(const Tensor& t) {
  int64_t lo = t.offset(), hi = t.offset();
  for (int64_t d = 0; d < t.dim(); ++d) (t.stride(d) < 0 ? lo : hi) += (t.size(d) - 1) * t.stride(d);
  const auto size = static_cast<int64_t>(dtype_size(t.dtype()));
  return {lo * size, hi * size + size - 1};
}

// An in-place write whose source shares some but not all of the destination's memory (a.add_(a.t()),
// a.copy_(a[0])) reads elements the kernel has already written: sequential on the CPU, a race on a
// GPU. PyTorch refuses these; so do we, on every device. The same view (a.mul_(a)) is fine.
void check_no_partial_overlap(const char* op, const Tensor& dst, const Tensor& src) {
  if (dst.storage() != src.storage() || dst.numel() == 0 || src.numel() == 0) return;
  if (dst.offset() == src.offset() && dst.sizes() == src.sizes() && dst.strides() == src.strides() &&
      dst.dtype() == src.dtype())
    return;
  auto [dlo, dhi] = byte_range(dst);
  auto [slo, shi] = byte_range(src);
  TP_CHECK(shi < dlo || dhi < slo,
           "{}: unsupported operation: some elements of the source (shape {}, strides {}) and the destination "
           "(shape {}, strides {}) refer to the same memory; clone() the source first", op, src.sizes(),
           src.strides(), dst.sizes(), dst.strides());
}

// The checks below that take tensors look at their devices first (as the dispatcher then does),
// so that tensors on two devices are reported as such before any dtype or shape rule.
void check_binary(const char* op, Binary kind, const Tensor& a, const Tensor& b) {
  common_device(op, {&a, &b});
  TP_CHECK(a.dtype() == b.dtype(), "{}: dtype mismatch: {} {} and {} {} (convert one with .to())", op, a.dtype(),
           a.sizes(), b.dtype(), b.sizes());
  if (a.dtype() == DType::Bool)
    TP_CHECK(kind == Binary::Eq || kind == Binary::Ne, "{}: not supported for bool tensors; convert with .to() first",
             op);
  if (a.dtype() == DType::Int64)
    TP_CHECK(kind != Binary::Div,
             "{}: not supported for int64 tensors (integer division); convert to float first", op);
}

// Shapes and dtypes; the target values are checked by each backend (on the host, or on the GPU).
void check_cross_entropy(const Tensor& logits, const Tensor& target, double eps) {
  common_device("cross_entropy", {&logits, &target});
  TP_CHECK(logits.dim() == 2, "cross_entropy: logits must be [N, classes], got shape {}", logits.sizes());
  TP_CHECK(target.dtype() == DType::Int64 && target.dim() == 1 && target.size(0) == logits.size(0),
           "cross_entropy: target must be int64 [{}] to match logits {}, got {} {}", logits.size(0), logits.sizes(),
           target.dtype(), target.sizes());
  TP_CHECK(eps >= 0 && eps < 1, "cross_entropy: label smoothing must be in [0, 1), got {}", eps);
}

Device device_of_all(const char* op, const std::vector<Tensor>& tensors) {
  for (size_t i = 1; i < tensors.size(); ++i) common_device(op, {&tensors[0], &tensors[i]});
  return tensors.empty() ? Device::CPU : tensors[0].device();
}

// The CUDA backend runs a few entries on the host (ops/cuda/host_fallback.cu: a copy down and one
// back, two synchronisations). The emulated device counts them alike, so that its counts are a GPU's.
void count_host_round_trip(const Tensor& a) {
  if (a.device().is_emulated() && !runtime::in_emulated_kernel()) {
    runtime::count_sync();
    runtime::count_sync();
    runtime::count_bytes_to_host(a.numel() * static_cast<int64_t>(dtype_size(a.dtype())));
  }
}

// ---- the checks of kernel_entries.h's rows

void check_binary_in_place(const char* op, Binary kind, const Tensor& a, const Tensor& b) {
  check_binary(op, kind, a, b);
  TP_CHECK(!is_comparison(kind), "{}: comparisons have no in-place form", op);
  check_writable(op, a);
  Shape shape = broadcast_shapes(op, a.sizes(), b.sizes());
  TP_CHECK(shape == a.sizes(), "{}: in-place result of shape {} does not fit the destination of shape {}", op, shape,
           a.sizes());
  check_no_partial_overlap(op, a, b);
}

void check_unary(const char* op, Unary kind, double p0, double p1) {
  if (kind == Unary::Clamp) TP_CHECK(p0 <= p1, "{}: min {} is greater than max {}", op, p0, p1);
}

void check_where(const char* op, const Tensor& cond, const Tensor& a, const Tensor& b) {
  common_device(op, {&cond, &a, &b});
  TP_CHECK(cond.dtype() == DType::Bool, "{}: condition must be a bool mask, got {} {}", op, cond.dtype(),
           cond.sizes());
  TP_CHECK(a.dtype() == b.dtype(), "{}: dtype mismatch: {} {} and {} {}", op, a.dtype(), a.sizes(), b.dtype(),
           b.sizes());
}

void check_copy(const Tensor& dst, const Tensor& src) {
  Shape shape = broadcast_shapes("copy_", dst.sizes(), src.sizes());
  TP_CHECK(shape == dst.sizes(), "copy_: source of shape {} cannot be broadcast to the destination shape {}",
           src.sizes(), dst.sizes());
  check_writable("copy_", dst);
  check_no_partial_overlap("copy_", dst, src);
}

void check_cross_entropy_backward(const Tensor& logits, const Tensor& target, double smoothing, const Tensor& scale) {
  common_device("cross_entropy_backward", {&logits, &target, &scale});
  check_cross_entropy(logits, target, smoothing);
  TP_CHECK(scale.dim() == 0 && scale.dtype() == logits.dtype(),
           "cross_entropy_backward: scale must be a 0-d {} tensor, got {} {}", logits.dtype(), scale.dtype(),
           scale.sizes());
}

void check_triangle(const char* op, const Tensor& a) {
  TP_CHECK(a.dim() >= 2, "{}: expected a tensor of at least 2 dims (a matrix or a batch of them), got shape {}", op,
           a.sizes());
}

void check_adam_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                     const std::vector<Tensor>& exp_avgs, const std::vector<Tensor>& exp_avg_sqs) {
  TP_CHECK(grads.size() == params.size() && exp_avgs.size() == params.size() && exp_avg_sqs.size() == params.size(),
           "adam_step_: {} params, {} grads, {} exp_avgs and {} exp_avg_sqs", params.size(), grads.size(),
           exp_avgs.size(), exp_avg_sqs.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& param = params[i];
    for (const Tensor* t : {&param, &grads[i], &exp_avgs[i], &exp_avg_sqs[i]})
      TP_CHECK(t->is_contiguous() && t->dtype() == param.dtype() && t->sizes() == param.sizes(),
               "adam_step_: param, grad and state must be contiguous {} {}, got {} {}", param.dtype(), param.sizes(),
               t->dtype(), t->sizes());
    TP_CHECK(is_floating(param.dtype()), "adam_step_: expected floating-point parameters, got {}", param.dtype());
  }
}

// copy_ across devices: src made contiguous in dst's dtype on its own device, its bytes copied to
// a contiguous buffer on dst's device (dst itself when it fits), then broadcast into dst there.
void copy_between_devices(const Tensor& dst, const Tensor& src) {
  Tensor staged = contiguous(to_dtype(src, dst.dtype()));
  const bool direct = dst.is_contiguous() && dst.sizes() == src.sizes();
  Tensor landing = direct ? dst : empty(src.sizes(), TensorOptions(dst.dtype(), dst.device()));
  {
    // The host waits for the copy (the CUDA runtime synchronises both ways: ops/cuda/runtime.cu),
    // unless it is part of an emulated kernel's own work.
    if (!runtime::in_emulated_kernel()) {
      runtime::count_sync();
      if (dst.device().is_cpu()) runtime::count_bytes_to_host(staged.numel() * static_cast<int64_t>(dtype_size(staged.dtype())));
    }
    runtime::EmulatedKernel copying(false);  // the runtime's own copy may touch emulated memory
    ::tapestry::cuda::detail::copy_bytes(landing.raw_data(), landing.device(), staged.raw_data(), staged.device(),
                                         static_cast<size_t>(staged.numel()) * dtype_size(staged.dtype()));
  }
  if (direct) dst.impl().storage->version++;
  else copy_(dst, landing);
}

// ---- routing

// The name a call's errors and profile scope carry: the op it serves when the entry's first
// argument names one ("add" for binary), else the entry's own name.
template <class First, class... Rest>
const char* entry_op(const char* entry, const First& first, const Rest&...) {
  if constexpr (std::is_same_v<First, const char*>) return first;
  else return entry;
}

// The one device of a call's tensor arguments (Tensor or std::vector<Tensor>; undefined tensors
// skipped; other arguments ignored), as common_device finds it.
class CallDevice {
 public:
  explicit CallDevice(const char* op) : op_(op) {}
  void add(const Tensor& t) {
    if (!t.defined()) return;
    if (!first_) first_ = &t;
    else common_device(op_, {first_, &t});
  }
  void add(const std::vector<Tensor>& tensors) {
    for (const Tensor& t : tensors) add(t);
  }
  template <class T>
  void add(const T&) {}
  Device device() const { return first_ ? first_->device() : Device::CPU; }

 private:
  const char* op_;
  const Tensor* first_ = nullptr;
};

template <class... Args>
Device call_device(const char* op, const Args&... args) {
  CallDevice found(op);
  (found.add(args), ...);
  return found.device();
}

// What a call on `device` runs inside: on a GPU, that GPU made the current one and a profile scope
// (`tapestry bench --profile`, ops/profile.h; the CPU kernels open their own). Kernels run
// asynchronously, so with profiling on the scope waits for the stream before it closes and the
// time is the kernel's (a synchronisation per entry, counted: profile steps are timed apart from
// the measured ones); off, it costs a branch. On the emulated device, an EmulatedKernel scope:
// the one place the host may read that device's memory (a launch).
class KernelScope {
 public:
  KernelScope(const char* op, Device device) {
    if (device.is_cuda()) {
      ::tapestry::cuda::detail::set_device(device);
      device_ = device;
      profile_.emplace(op);
    } else if (device.is_emulated()) {
      emulated_.emplace();
    }
  }
  ~KernelScope() {
    if (profile_ && profile::enabled()) ::tapestry::cuda::detail::wait_for_stream(device_);
  }
  KernelScope(const KernelScope&) = delete;
  KernelScope& operator=(const KernelScope&) = delete;

 private:
  Device device_ = Device::CPU;
  std::optional<profile::Scope> profile_;  // closed after the wait above
  std::optional<runtime::EmulatedKernel> emulated_;
};

}  // namespace

// Every row of kernel_entries.h becomes its dispatching entry: the row's check, the one device of
// its tensors, then the backend of that device inside a KernelScope. No entry is written by hand.
#define TP_UNPAREN(...) __VA_ARGS__
#define TP_KERNEL(Ret, name, params, args, check)                         \
  Ret name params {                                                        \
    check;                                                                 \
    const char* const tp_op = entry_op(#name, TP_UNPAREN args);            \
    const Device tp_device = call_device(tp_op, TP_UNPAREN args);          \
    KernelScope tp_scope(tp_op, tp_device);                                \
    if (tp_device.is_cuda()) return cuda::name args;                       \
    return cpu::name args;                                                 \
  }
#include "tapestry/ops/detail/kernel_entries.h"
#undef TP_KERNEL
#undef TP_UNPAREN

// ---- composites of copy_, for every device
Tensor contiguous(const Tensor& a) {
  if (a.is_contiguous()) return a;
  Tensor out = empty(a.sizes(), a.options());
  copy_(out, a);
  return out;
}

Tensor to_dtype(const Tensor& a, DType dtype) {
  if (a.dtype() == dtype) return a;
  Tensor out = empty(a.sizes(), TensorOptions(dtype, a.device()));
  copy_(out, a);
  return out;
}

Tensor to_device(const Tensor& a, Device device) {
  if (a.device() == device) return a;
  Tensor out = empty(a.sizes(), TensorOptions(a.dtype(), device));
  copy_(out, a);
  out.impl().storage->version = 0;  // a new tensor, whatever filled it
  return out;
}

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  TP_PROFILE("cat");
  TP_CHECK(!tensors.empty(), "cat: expected a non-empty list of tensors");
  const Device device = device_of_all("cat", tensors);
  const Tensor& first = tensors[0];
  TP_CHECK(first.dim() > 0, "cat: zero-dimensional tensors cannot be concatenated (use stack)");
  dim = wrap_dim("cat", dim, first.dim());
  Shape out_shape = first.sizes();
  out_shape[dim] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    TP_CHECK(t.dtype() == first.dtype(), "cat: tensor {} is {} but tensor 0 is {}", i, t.dtype(), first.dtype());
    TP_CHECK(t.dim() == first.dim(), "cat: tensor {} has shape {} but tensor 0 has shape {} (dims differ)", i,
             t.sizes(), first.sizes());
    for (int64_t d = 0; d < t.dim(); ++d)
      TP_CHECK(d == dim || t.size(d) == first.size(d),
               "cat: tensor {} has shape {} but tensor 0 has shape {}; they must match except in dim {}", i,
               t.sizes(), first.sizes(), dim);
    out_shape[dim] += t.size(dim);
  }
  Tensor out = empty(out_shape, TensorOptions(first.dtype(), device));
  int64_t pos = 0;
  for (const Tensor& t : tensors) {  // each into its slice of out (a view: same storage)
    Shape s = out_shape;
    s[dim] = t.size(dim);
    copy_(make_tensor(out.impl().storage, s, out.strides(), pos * out.stride(dim), out.dtype()), t);
    pos += t.size(dim);
  }
  return out;
}


}  // namespace tapestry::kernels
