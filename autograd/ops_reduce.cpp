// Reductions and row-wise normalizations: sum, mean, var, max/min (with indices), argmax,
// softmax, log_softmax, layer_norm. Forward and backward of each together.
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "tapestry/autograd/functions.h"
#include "tapestry/ops/detail/kernels.h"

namespace tapestry {

using kernels::Reduce;

namespace {

// The dims a reduction covers, wrapped and sorted; empty means all.
std::vector<int64_t> reduced_dims(const char* op, const Tensor& a, const std::vector<int64_t>& dims) {
  std::vector<int64_t> out;
  if (dims.empty()) {
    for (int64_t d = 0; d < a.dim(); ++d) out.push_back(d);
  } else {
    for (int64_t d : dims) out.push_back(wrap_dim(op, d, a.dim()));
  }
  std::sort(out.begin(), out.end());
  TP_CHECK(std::adjacent_find(out.begin(), out.end()) == out.end(), "{}: dims {} repeat a dim", op, dims);
  // As in PyTorch, dim 0 and -1 name the one element of a 0-d tensor: reducing over them is
  // reducing over everything, which leaves the 0-d tensor as it is.
  if (a.dim() == 0) out.clear();
  return out;
}

// Puts back the reduced dims (as size 1) that keepdim=false removed.
Tensor unsqueeze_dims(Tensor g, const std::vector<int64_t>& sorted_dims, bool keepdim) {
  if (keepdim) return g;
  for (int64_t d : sorted_dims) g = unsqueeze(g, d);
  return g;
}

}  // namespace

Tensor sum(const Tensor& a, const std::vector<int64_t>& dims_in, bool keepdim) {
  std::vector<int64_t> dims = reduced_dims("sum", a, dims_in);
  Tensor out = kernels::reduce("sum", Reduce::Sum, a, dims, keepdim);
  Shape in = a.sizes();
  return record("SumBackward", out, {a}, [in, dims, keepdim](const Tensor& g) {
    return TensorList{expand(unsqueeze_dims(g, dims, keepdim), in)};
  });
}

Tensor mean(const Tensor& a, const std::vector<int64_t>& dims_in, bool keepdim) {
  dispatch_floating(a.dtype(), "mean", [](auto) {});
  std::vector<int64_t> dims = reduced_dims("mean", a, dims_in);
  int64_t count = 1;
  for (int64_t d : dims) count *= a.size(d);
  return div(sum(a, dims, keepdim), static_cast<double>(count));
}

Tensor var(const Tensor& a, const std::vector<int64_t>& dims_in, int64_t correction, bool keepdim) {
  std::vector<int64_t> dims = reduced_dims("var", a, dims_in);
  int64_t count = 1;
  for (int64_t d : dims) count *= a.size(d);
  Tensor centered = sub(a, mean(a, dims, true));
  // PyTorch divides by max(0, N - correction): 0/0 gives NaN for empty or too-small samples.
  return div(sum(mul(centered, centered), dims, keepdim), static_cast<double>(std::max<int64_t>(0, count - correction)));
}

namespace {
Tensor extremum_all(const char* op, const char* node, Reduce kind, const Tensor& a) {
  Tensor out = kernels::reduce(op, kind, a, {}, false);
  if (!any_requires_grad({a})) return out;
  SavedTensor x(a, node), y(out, node);
  // Ties share the gradient evenly, as torch.max() does.
  return record(node, out, {a}, [x, y](const Tensor& g) {
    // A NaN maximum came from the NaN elements: they share the gradient (as torch.max()).
    Tensor yv = y.get();
    Tensor mask = std::isnan(yv.item<double>()) ? ne(x.get(), x.get()) : eq(x.get(), yv);
    Tensor count = kernels::to_dtype(sum(mask), g.dtype());
    return TensorList{where(mask, div(g, count), scalar_tensor(0.0, g.options()))};
  });
}

ValuesIndices extremum_dim(const char* op, const char* node, Reduce kind, const Tensor& a, int64_t dim, bool keepdim) {
  if (a.dim() == 0) {
    wrap_dim(op, dim, 0);
    ValuesIndices r{clone(a), zeros({}, TensorOptions(DType::Int64, a.device()))};
    return r;
  }
  dim = wrap_dim(op, dim, a.dim());
  auto [values, indices] = kernels::reduce_with_index(op, kind, a, dim, keepdim);
  Shape in = a.sizes();
  Tensor idx = keepdim ? indices : unsqueeze(indices, dim);
  values = record(node, values, {a}, [in, dim, keepdim, idx](const Tensor& g) {
    Tensor gk = keepdim ? g : unsqueeze(g, dim);
    return TensorList{linear_in_grad("MaxBackwardBackward", kernels::scatter(in, dim, idx, gk, true), gk,
                                     [dim, idx](const Tensor& gg) { return gather(gg, dim, idx); })};
  });
  return {values, indices};
}
}  // namespace

Tensor max(const Tensor& a) { return extremum_all("max", "MaxBackward", Reduce::Max, a); }
Tensor min(const Tensor& a) { return extremum_all("min", "MinBackward", Reduce::Min, a); }
ValuesIndices max(const Tensor& a, int64_t dim, bool keepdim) {
  return extremum_dim("max", "MaxBackward", Reduce::Max, a, dim, keepdim);
}
ValuesIndices min(const Tensor& a, int64_t dim, bool keepdim) {
  return extremum_dim("min", "MinBackward", Reduce::Min, a, dim, keepdim);
}
Tensor argmax(const Tensor& a, int64_t dim, bool keepdim) {
  NoGradGuard no_grad;
  return max(a, dim, keepdim).indices;
}
Tensor argmin(const Tensor& a, int64_t dim, bool keepdim) {
  NoGradGuard no_grad;
  return min(a, dim, keepdim).indices;
}

namespace {
Tensor softmax_impl(const Tensor& a, int64_t dim, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  dim = wrap_dim(op, dim, a.dim());
  Tensor out = kernels::softmax(a, dim, log);
  if (!any_requires_grad({a})) return out;
  SavedTensor y = SavedTensor::output(out, log ? "LogSoftmaxBackward" : "SoftmaxBackward");
  return record(log ? "LogSoftmaxBackward" : "SoftmaxBackward", out, {a}, [y, dim, log](const Tensor& g) {
    if (GradMode::is_enabled()) {  // a recording backward: the fused formula as recorded ops
      const Tensor yv = y.get();
      if (log) return TensorList{sub(g, mul(exp(yv), sum(g, {dim}, true)))};
      return TensorList{mul(yv, sub(g, sum(mul(g, yv), {dim}, true)))};
    }
    return TensorList{kernels::softmax_backward(y.get(), g, dim, log)};
  });
}
}  // namespace

Tensor softmax(const Tensor& a, int64_t dim) { return softmax_impl(a, dim, false); }
Tensor log_softmax(const Tensor& a, int64_t dim) { return softmax_impl(a, dim, true); }

Tensor logsumexp(const Tensor& a, int64_t dim, bool keepdim) {
  TP_CHECK(is_floating(a.dtype()), "logsumexp: expected a float tensor, got {} {}", a.dtype(), a.sizes());
  const int64_t d = wrap_dim("logsumexp", dim, a.dim());
  if (a.dim() > 0 && a.size(d) == 0) return log(sum(exp(a), {dim}, keepdim));  // an empty sum: -inf
  // Shifted by the (constant) max, which an infinite max would turn into inf - inf: those rows
  // shift by 0 and give +-inf themselves.
  Tensor m = max(a.detach(), dim, true).values;
  m = masked_fill(m, eq(abs(m), std::numeric_limits<double>::infinity()), 0.0);
  Tensor out = add(log(sum(exp(sub(a, m)), {dim}, true)), m);
  return keepdim || a.dim() == 0 ? out : squeeze(out, dim);
}

namespace {
// layer_norm and rms_norm (center false: no mean subtracted, no bias): one kernel pair.
Tensor norm_impl(const char* op, const char* node, const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                 const Tensor& bias, double eps, bool center) {
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  TP_CHECK(k >= 1 && k <= x.dim() && Shape(x.sizes().end() - k, x.sizes().end()) == normalized_shape,
           "{}: normalized_shape {} does not match the trailing dims of the input {}", op, normalized_shape, x.sizes());
  if (weight.defined())
    TP_CHECK(weight.sizes() == normalized_shape && weight.dtype() == x.dtype(), "{}: weight {} {} must be {} {}", op,
             weight.dtype(), weight.sizes(), x.dtype(), normalized_shape);
  if (bias.defined())
    TP_CHECK(bias.sizes() == normalized_shape && bias.dtype() == x.dtype(), "{}: bias {} {} must be {} {}", op,
             bias.dtype(), bias.sizes(), x.dtype(), normalized_shape);
  TP_CHECK(eps >= 0, "{}: eps must be at least 0, got {}", op, eps);
  auto r = kernels::layer_norm(x, k, weight, bias, eps, center);
  if (!any_requires_grad({x, weight, bias})) return r.y;
  SavedTensor sx(x, node), sw(weight, node), sb(bias, node);
  Tensor mean = r.mean, rstd = r.rstd;
  bool need_wb = (weight.defined() && weight.requires_grad()) || (bias.defined() && bias.requires_grad());
  return record(node, r.y, {x, weight, bias}, [sx, sw, sb, mean, rstd, k, need_wb, center, eps](const Tensor& g) {
    if (GradMode::is_enabled()) {  // a recording backward: through the composite, whose ops record
      return composite_vjp(
          [k, center, eps](const TensorList& in) {
            std::vector<int64_t> dims;
            for (int64_t d = in[0].dim() - k; d < in[0].dim(); ++d) dims.push_back(d);
            Tensor xc = center ? sub(in[0], tapestry::mean(in[0], dims, true)) : in[0];
            Tensor y = mul(xc, rsqrt(add(tapestry::mean(mul(xc, xc), dims, true), eps)));
            if (in[1].defined()) y = mul(y, in[1]);
            if (in[2].defined()) y = add(y, in[2]);
            return y;
          },
          {sx.get(), sw.get(), sb.get()}, g);
    }
    auto gr = kernels::layer_norm_backward(g, sx.get(), mean, rstd, k, sw.get(), need_wb, center);
    return TensorList{gr.dx, gr.dweight, gr.dbias};
  });
}
}  // namespace

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  return norm_impl("layer_norm", "LayerNormBackward", x, normalized_shape, weight, bias, eps, true);
}

Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, std::optional<double> eps) {
  // PyTorch's default eps: the dtype's machine epsilon.
  const double e = eps ? *eps
                       : x.dtype() == DType::Float64 ? std::numeric_limits<double>::epsilon()
                                                     : static_cast<double>(std::numeric_limits<float>::epsilon());
  return norm_impl("rms_norm", "RmsNormBackward", x, normalized_shape, weight, Tensor(), e, false);
}

}  // namespace tapestry
