// Printing a tensor, in the manner of PyTorch's repr: 4 decimals (scientific when the range calls
// for it), summarised with "..." past 1000 elements, then the shape, dtype and autograd state. It
// lives above the tape because it names the op that made the tensor (grad_fn); ops/tensor.h
// declares it with the Tensor.
#include <cmath>
#include <ostream>

#include "tapestry/autograd/node.h"
#include "tapestry/ops/tensor.h"

namespace tapestry {

namespace {

struct Printer {
  std::vector<double> values;  // row-major, converted to double
  Shape shape;
  DType dtype;
  bool summarize;
  bool sci = false;
  int width = 0;
  static constexpr int64_t kEdge = 3;

  std::string fmt_value(double v) const {
    if (dtype == DType::Bool) return v != 0 ? "True" : "False";
    if (dtype == DType::Int64) return fmt::format("{}", static_cast<int64_t>(v));
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    return sci ? fmt::format("{:.4e}", v) : fmt::format("{:.4f}", v);
  }

  void rec(std::string& out, size_t d, int64_t base, int indent) const {
    if (shape.empty()) {
      out += fmt_value(values[0]);
      return;
    }
    int64_t n = shape[d];
    int64_t inner = 1;
    for (size_t i = d + 1; i < shape.size(); ++i) inner *= shape[i];
    out += "[";
    bool last = d + 1 == shape.size();
    for (int64_t i = 0; i < n; ++i) {
      if (summarize && n > 2 * kEdge && i == kEdge) {
        out += last ? "..., " : fmt::format("...,\n{:{}}", "", indent + 1);
        if (!last && d + 2 < shape.size()) out += "\n" + std::string(indent + 1, ' ');
        i = n - kEdge;
      }
      if (last) {
        std::string s = fmt_value(values[base + i]);
        out += fmt::format("{:>{}}", s, width);
      } else {
        rec(out, d + 1, base + i * inner, indent + 1);
      }
      if (i + 1 < n) {
        out += ",";
        if (last) out += " ";
        else out += std::string(shape.size() - d - 1, '\n') + std::string(indent + 1, ' ');
      }
    }
    out += "]";
  }
};

}  // namespace

std::string to_string(const Tensor& t) {
  if (!t.defined()) return "tensor(undefined)";
  Printer p;
  p.shape = t.sizes();
  p.dtype = t.dtype();
  p.summarize = t.numel() > 1000;
  p.values = t.to_vector<double>();
  if (is_floating(p.dtype)) {
    double mx = 0, mn = INFINITY;
    for (double v : p.values)
      if (std::isfinite(v) && v != 0) {
        mx = std::max(mx, std::fabs(v));
        mn = std::min(mn, std::fabs(v));
      }
    p.sci = mx >= 1e8 || (mn < 1e-4 && mn != INFINITY) || (mn != INFINITY && mx / mn > 1e3 && mx >= 1e3);
  }
  for (double v : p.values) p.width = std::max<int>(p.width, static_cast<int>(p.fmt_value(v).size()));
  std::string body;
  if (t.numel() == 0) body = "[]";
  else p.rec(body, 0, 0, 7);
  std::string extra = fmt::format("shape={}, dtype={}", t.sizes(), t.dtype());
  if (t.grad_fn()) extra += fmt::format(", grad_fn=<{}>", t.grad_fn_name());
  else if (t.requires_grad()) extra += ", requires_grad=True";
  return fmt::format("tensor({}, {})", body, extra);
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << to_string(t); }

}  // namespace tapestry
