// gradcheck (see gradcheck.h). The upstream gradient is random rather than all ones so that a
// backward that mixes up elements or swaps inputs cannot pass by symmetry.
#include "tapestry/autograd/gradcheck.h"

#include <cmath>

#include "tapestry/autograd/functions.h"
#include "tapestry/autograd/node.h"
#include "tapestry/ops/cuda.h"

namespace tapestry {

namespace {

// Element offsets (into storage) of t in row-major logical order.
std::vector<int64_t> element_offsets(const Tensor& t) {
  std::vector<int64_t> offs;
  offs.reserve(static_cast<size_t>(t.numel()));
  Shape idx(t.dim(), 0);
  for (int64_t n = 0; n < t.numel(); ++n) {
    int64_t off = t.offset();
    for (int64_t d = 0; d < t.dim(); ++d) off += idx[d] * t.stride(d);
    offs.push_back(off);
    for (int64_t d = t.dim() - 1; d >= 0 && ++idx[d] == t.size(d); --d) idx[d] = 0;
  }
  return offs;
}

std::string index_string(const Tensor& t, int64_t flat) {
  Shape idx(t.dim());
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    idx[d] = flat % t.size(d);
    flat /= t.size(d);
  }
  return fmt::format("{}", idx);
}

}  // namespace

bool gradcheck(const std::function<Tensor(const TensorList&)>& f, const TensorList& inputs,
               const GradcheckOptions& opt) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = inputs[i];
    TP_CHECK(x.dtype() == DType::Float64, "gradcheck: input {} is {}; finite differences need float64", i, x.dtype());
    TP_CHECK(x.requires_grad() && x.is_leaf(), "gradcheck: input {} (shape {}) must be a leaf that requires grad", i,
             x.sizes());
    for (int64_t d = 0; d < x.dim(); ++d)
      TP_CHECK(x.stride(d) != 0 || x.size(d) <= 1,
               "gradcheck: input {} (shape {}, strides {}) has expanded dims; expand inside f instead", i, x.sizes(),
               x.strides());
  }
  for (Tensor x : inputs) x.zero_grad();

  // Analytic: one backward of <f(x), v>.
  Tensor out = f(inputs);
  TP_CHECK(out.dtype() == DType::Float64, "gradcheck: f returned {}, expected float64", out.dtype());
  Generator gen(opt.seed);
  Tensor v = randn(out.sizes(), TensorOptions(DType::Float64, out.device()), &gen);  // the CPU's draws, on f's device
  if (out.requires_grad()) sum(mul(out, v)).backward();

  auto objective = [&]() {
    NoGradGuard no_grad;
    return sum(mul(f(inputs), v)).item<double>();
  };

  for (size_t i = 0; i < inputs.size(); ++i) {
    Tensor x = inputs[i];
    std::vector<double> analytic = x.grad().defined() ? x.grad().to_vector<double>()
                                                      : std::vector<double>(static_cast<size_t>(x.numel()), 0.0);
    double* base = static_cast<double*>(x.storage()->data);
    std::vector<int64_t> offs = element_offsets(x);
    // One element of storage, read and written in place; on a GPU through 8-byte copies.
    auto get = [&](int64_t off) {
      double value = 0;
      cuda::detail::copy_bytes(&value, Device::CPU, base + off, x.device(), sizeof value);
      return value;
    };
    auto set = [&](int64_t off, double value) {
      cuda::detail::copy_bytes(base + off, x.device(), &value, Device::CPU, sizeof value);
    };
    for (size_t j = 0; j < offs.size(); ++j) {
      const double orig = get(offs[j]);
      set(offs[j], orig + opt.eps);
      double plus = objective();
      set(offs[j], orig - opt.eps);
      double minus = objective();
      set(offs[j], orig);
      double numeric = (plus - minus) / (2 * opt.eps);
      double err = std::fabs(analytic[j] - numeric);
      TP_CHECK(err <= opt.atol + opt.rtol * std::fabs(numeric),
               "gradcheck: input {} (shape {}) element {}: analytic gradient {:.8g} but numeric {:.8g} (error {:.3g} > "
               "atol {} + rtol {} * |numeric|)",
               i, x.sizes(), index_string(x, static_cast<int64_t>(j)), analytic[j], numeric, err, opt.atol, opt.rtol);
    }
  }
  for (Tensor x : inputs) x.zero_grad();
  return true;
}

bool gradgradcheck(const std::function<Tensor(const TensorList&)>& f, const TensorList& inputs,
                   const GradcheckOptions& opt) {
  Tensor out0;
  {
    NoGradGuard no_grad;
    out0 = f(inputs);
  }
  TP_CHECK(out0.dtype() == DType::Float64, "gradgradcheck: f returned {}, expected float64", out0.dtype());
  Generator gen(opt.seed + 1);
  TensorList all = inputs;
  all.push_back(randn(out0.sizes(), TensorOptions(DType::Float64, out0.device()), &gen).requires_grad_());
  // The first derivatives, flattened into one tensor, as a recorded function of the inputs and v.
  auto first = [&f](const TensorList& in) {
    EnableGradGuard recording;  // gradcheck evaluates under NoGradGuard for its differences
    const TensorList xs(in.begin(), in.end() - 1);
    const Tensor out = f(xs);
    TensorList g(xs.size());
    if (out.requires_grad()) g = run_grad({out}, xs, {in.back()}, true, true, true);
    TensorList flat;
    for (size_t i = 0; i < xs.size(); ++i)
      flat.push_back(reshape(g[i].defined() ? g[i] : zeros(xs[i].sizes(), xs[i].options()), {-1}));
    return cat(flat, 0);
  };
  return gradcheck(first, all, opt);
}

}  // namespace tapestry
