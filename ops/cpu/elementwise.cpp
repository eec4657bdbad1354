// CPU elementwise kernels: binary ops with broadcasting, unary ops, where, copy (with dtype
// conversion), fill and the random fills. All loops go through cpu::strided_apply.
#include <cmath>

#include "tapestry/ops/cpu/loops.h"
#include "tapestry/ops/factory.h"
#include "tapestry/ops/detail/backend.h"
#include "tapestry/ops/profile.h"

namespace tapestry::kernels::cpu {

namespace {

template <class R, class T, class Op>
void binary_loop(const Tensor& out, const Tensor& a, const Tensor& b, Op op) {
  const Shape& shape = out.sizes();
  R* po = out.data_ptr<R>();
  const T* pa = a.data_ptr<T>();
  const T* pb = b.data_ptr<T>();
  strided_apply<3>(shape, {out.strides(), broadcast_strides(a, shape), broadcast_strides(b, shape)},
                   [&](const std::array<int64_t, 3>& off, const std::array<int64_t, 3>& st, int64_t n) {
                     R* o = po + off[0];
                     const T* x = pa + off[1];
                     const T* y = pb + off[2];
                     if (st[0] == 1 && st[1] == 1 && st[2] == 1) {
                       for (int64_t i = 0; i < n; ++i) o[i] = op(x[i], y[i]);
                     } else if (st[0] == 1 && st[1] == 1 && st[2] == 0) {
                       const T yv = *y;
                       for (int64_t i = 0; i < n; ++i) o[i] = op(x[i], yv);
                     } else if (st[0] == 1 && st[1] == 0 && st[2] == 1) {
                       const T xv = *x;
                       for (int64_t i = 0; i < n; ++i) o[i] = op(xv, y[i]);
                     } else {
                       for (int64_t i = 0; i < n; ++i) o[i * st[0]] = op(x[i * st[1]], y[i * st[2]]);
                     }
                   });
}

// The functor of `kind` (ops/detail/math.h) over a and b, into out.
void run_binary(Binary kind, const Tensor& out, const Tensor& a, const Tensor& b) {
  dispatch(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_binary_op(kind, [&](auto op) {
      using Op = decltype(op);
      if constexpr (Op::comparison) binary_loop<bool, T>(out, a, b, op);
      else if constexpr (std::is_same_v<T, bool> || (Op::floating_only && !std::is_floating_point_v<T>))
        TP_CHECK(false, "binary: this kind takes floating tensors, got {}", dtype_of<T>());  // the dispatcher's check_binary stops these
      else binary_loop<T, T>(out, a, b, op);
    });
  });
}

}  // namespace

Tensor binary(const char* op, Binary kind, const Tensor& a, const Tensor& b) {
  TP_PROFILE(op);
  Shape shape = broadcast_shapes(op, a.sizes(), b.sizes());
  Tensor out = empty(shape, TensorOptions(is_comparison(kind) ? DType::Bool : a.dtype(), a.device()));
  run_binary(kind, out, a, b);
  return out;
}

void binary_(const char* op, Binary kind, Tensor& a, const Tensor& b) {
  TP_PROFILE(op);
  run_binary(kind, a, a, b);
  a.impl().storage->version++;
}

namespace {

template <class R, class T, class Op>
void unary_loop(const Tensor& out, const Tensor& a, Op op) {
  R* po = out.data_ptr<R>();
  const T* pa = a.data_ptr<T>();
  strided_apply<2>(out.sizes(), {out.strides(), a.strides()},
                   [&](const std::array<int64_t, 2>& off, const std::array<int64_t, 2>& st, int64_t n) {
                     R* o = po + off[0];
                     const T* x = pa + off[1];
                     if (st[0] == 1 && st[1] == 1) {
                       for (int64_t i = 0; i < n; ++i) o[i] = op(x[i]);
                     } else {
                       for (int64_t i = 0; i < n; ++i) o[i * st[0]] = op(x[i * st[1]]);
                     }
                   });
}

}  // namespace

Tensor unary(const char* op, Unary kind, const Tensor& a, double p0, double p1) {
  TP_PROFILE(op);
  Tensor out = empty(a.sizes(), a.options());
  auto run = [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_unary_op(kind, p0, p1, [&](auto op) {
      if constexpr (!decltype(op)::floating_only || std::is_floating_point_v<T>) unary_loop<T, T>(out, a, op);
    });
  };
  if (unary_needs_floating(kind)) dispatch_floating(a.dtype(), op, run);
  else dispatch_numeric(a.dtype(), op, run);
  return out;
}

Tensor where(const char* op, const Tensor& cond, const Tensor& a, const Tensor& b) {
  TP_PROFILE(op);
  Shape shape = broadcast_shapes(op, broadcast_shapes(op, cond.sizes(), a.sizes()), b.sizes());
  Tensor out = empty(shape, a.options());
  dispatch(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* po = out.data_ptr<T>();
    const bool* pc = cond.data_ptr<bool>();
    const T* pa = a.data_ptr<T>();
    const T* pb = b.data_ptr<T>();
    strided_apply<4>(shape,
                     {out.strides(), broadcast_strides(cond, shape), broadcast_strides(a, shape),
                      broadcast_strides(b, shape)},
                     [&](const std::array<int64_t, 4>& off, const std::array<int64_t, 4>& st, int64_t n) {
                       for (int64_t i = 0; i < n; ++i)
                         po[off[0] + i * st[0]] =
                             pc[off[1] + i * st[1]] ? pa[off[2] + i * st[2]] : pb[off[3] + i * st[3]];
                     });
  });
  return out;
}

void copy_(const Tensor& dst, const Tensor& src) {
  TP_PROFILE("copy_");
  const Shape& shape = dst.sizes();  // src broadcasts to it (checked by the dispatcher)
  dispatch(dst.dtype(), [&](auto dtag) {
    using D = typename decltype(dtag)::type;
    dispatch(src.dtype(), [&](auto stag) {
      using S = typename decltype(stag)::type;
      D* pd = dst.data_ptr<D>();
      const S* ps = src.data_ptr<S>();
      strided_apply<2>(shape, {dst.strides(), broadcast_strides(src, shape)},
                       [&](const std::array<int64_t, 2>& off, const std::array<int64_t, 2>& st, int64_t n) {
                         D* o = pd + off[0];
                         const S* x = ps + off[1];
                         if (st[0] == 1 && st[1] == 1) {
                           for (int64_t i = 0; i < n; ++i) o[i] = static_cast<D>(x[i]);
                         } else {
                           for (int64_t i = 0; i < n; ++i) o[i * st[0]] = static_cast<D>(x[i * st[1]]);
                         }
                       });
    });
  });
  dst.impl().storage->version++;
}

void fill_(const Tensor& dst, double value) {
  TP_PROFILE("fill_");
  dispatch(dst.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = dst.data_ptr<T>();
    const T v = static_cast<T>(value);
    strided_apply<1>(dst.sizes(), {dst.strides()},
                     [&](const std::array<int64_t, 1>& off, const std::array<int64_t, 1>& st, int64_t n) {
                       for (int64_t i = 0; i < n; ++i) p[off[0] + i * st[0]] = v;
                     });
  });
  dst.impl().storage->version++;
}

namespace {
// Random fills draw sequentially in row-major order, into a contiguous buffer when needed.
template <class Draw>
void random_fill(const char* op, const Tensor& dst, Draw draw) {
  Tensor buf = dst.is_contiguous() ? dst : empty(dst.sizes(), dst.options());
  dispatch_numeric(dst.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = buf.data_ptr<T>();
    for (int64_t i = 0, n = buf.numel(); i < n; ++i) p[i] = static_cast<T>(draw());
  });
  if (!dst.is_contiguous()) copy_(dst, buf);
  else dst.impl().storage->version++;
}
}  // namespace

namespace {
// A plain function (not a lambda) so that GCC vectorizes it (dropout_keeps, loops.h).
template <class T>
void dropout_run(const T* x, T* out, int64_t n, uint32_t start, uint32_t key, uint32_t threshold, T scale) {
#pragma omp simd
  for (int64_t k = 0; k < n; ++k)
    out[k] = x[k] * (dropout_keeps(start + static_cast<uint32_t>(k), key, threshold) ? scale : T(0));
}
}  // namespace

Tensor dropout(const Tensor& x_in, double p, uint64_t seed) {
  TP_PROFILE("dropout");
  Tensor x = contiguous(x_in);
  Tensor out = empty(x.sizes(), x.options());
  const uint32_t threshold = dropout_threshold(p);
  dispatch_floating(x.dtype(), "dropout", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = x.data_ptr<T>();
    T* po = out.data_ptr<T>();
    const T scale = static_cast<T>(1.0 / (1.0 - p));
    const uint32_t key = dropout_key(seed);
    cpu::parallel_for(0, x.numel(), cpu::kGrainSize, [&](int64_t b, int64_t e) {
      dropout_run(px + b, po + b, e - b, static_cast<uint32_t>(b), key, threshold, scale);
    });
  });
  return out;
}

void uniform_(const Tensor& dst, double lo, double hi, std::mt19937_64& engine) {
  TP_PROFILE("uniform_");
  dispatch_floating(dst.dtype(), "uniform_", [](auto) {});
  std::uniform_real_distribution<double> dist(lo, hi);
  random_fill("uniform_", dst, [&] { return dist(engine); });
}

void normal_(const Tensor& dst, double mean, double std, std::mt19937_64& engine) {
  TP_PROFILE("normal_");
  dispatch_floating(dst.dtype(), "normal_", [](auto) {});
  TP_CHECK(std >= 0, "normal_: std must be non-negative, got {}", std);
  std::normal_distribution<double> dist(mean, std);
  random_fill("normal_", dst, [&] { return dist(engine); });
}

void randint_(const Tensor& dst, int64_t low, int64_t high, std::mt19937_64& engine) {
  std::uniform_int_distribution<int64_t> dist(low, high - 1);
  random_fill("randint_", dst, [&] { return dist(engine); });
}

namespace {
void adam_step_one(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                   const AdamStep& step) {
  dispatch_floating(param.dtype(), "adam_step_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* pp = param.data_ptr<T>();
    const T* pg = grad.data_ptr<T>();
    T* pm = exp_avg.data_ptr<T>();
    T* pv = exp_avg_sq.data_ptr<T>();
    const T b1 = static_cast<T>(step.beta1), b2 = static_cast<T>(step.beta2), wd = static_cast<T>(step.weight_decay);
    const T decay = static_cast<T>(step.decay), ss = static_cast<T>(step.step_size);
    const T bc = static_cast<T>(step.bias_correction2_sqrt), eps = static_cast<T>(step.eps);
    const bool decoupled = step.decoupled, l2 = !decoupled && step.weight_decay != 0;
    // One pass: the same operations, in the same order, as PyTorch's single-tensor Adam.
    parallel_for(0, param.numel(), kGrainSize, [&](int64_t b, int64_t e) {
      for (int64_t j = b; j < e; ++j) {
        T g = pg[j];
        if (decoupled) pp[j] *= decay;
        else if (l2) g += wd * pp[j];
        pm[j] = pm[j] * b1 + g * (T(1) - b1);
        pv[j] = pv[j] * b2 + g * g * (T(1) - b2);
        pp[j] -= ss * pm[j] / (std::sqrt(pv[j]) / bc + eps);
      }
    });
  });
  param.impl().storage->version++;
}
}  // namespace

void adam_step_(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                const std::vector<Tensor>& exp_avgs, const std::vector<Tensor>& exp_avg_sqs, const AdamStep& step) {
  TP_PROFILE("adam_step_");
  for (size_t i = 0; i < params.size(); ++i) adam_step_one(params[i], grads[i], exp_avgs[i], exp_avg_sqs[i], step);
}

}  // namespace tapestry::kernels::cpu
