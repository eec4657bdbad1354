// The OpInfo table (see tests/opinfo.h), run_case, and the random op programs.
//
// Each sample's error flag is what PyTorch 1.13 does on it: samples on which PyTorch raises are
// marked, most of them by predicates that follow PyTorch's rules (dim ranges, index ranges,
// broadcasting, empty reductions), so one list of sample inputs serves many ops. The reference
// (tools/reference/opinfo_ref.py) checks every flag against PyTorch itself, so a wrong flag
// shows up there as a mismatch.
#include "tests/opinfo.h"
#include "tests/layouts.h"
#include "tapestry/autograd/functional.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <regex>
#include <utility>

namespace tapestry::opinfo {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr int64_t kEnd = std::numeric_limits<int64_t>::max();  // slice(..., end = kEnd): to the end

// ---------------------------------------------------------------------------------------------
// Values and layouts

Tensor f64(const std::vector<double>& v, const Shape& s) {
  if (s.empty()) return scalar_tensor(v.at(0), kFloat64);
  return tensor(v, s, kFloat64);
}

Tensor i64(const std::vector<int64_t>& v, const Shape& s) {
  if (s.empty()) return scalar_tensor(static_cast<double>(v.at(0)), kInt64);
  return tensor(v, s);
}

Tensor b8(const std::vector<int64_t>& v, const Shape& s) { return ne(i64(v, s), 0.0); }

// Value domains: Real ~ N(0, 1); Pos in [0.5, 2.5) (log, sqrt, denominators...).
enum class Dom { Real, Pos };

Tensor draw(Generator& g, const Shape& s, Dom d = Dom::Real, DType dt = kFloat64) {
  Tensor v = d == Dom::Real ? randn(s, kFloat64, &g) : add(mul(rand(s, kFloat64, &g), 2.0), 0.5);
  return dt == kFloat64 ? v : v.to(dt);
}

// Random int64 values in [lo, hi).
Tensor ints(Generator& g, int64_t lo, int64_t hi, const Shape& s) { return randint(lo, hi, s, kInt64, &g); }

// A random bool mask.
Tensor mask(Generator& g, const Shape& s) { return gt(randn(s, kFloat64, &g), 0.0); }

using testing::expanded;  // the layouts (tests/layouts.h)
using testing::strided;
using testing::transposed;

// ---------------------------------------------------------------------------------------------
// Samples

Sample ok(std::string desc, TensorList in) { return Sample{std::move(desc), std::move(in), false, ""}; }
Sample err(std::string desc, TensorList in) {
  return Sample{std::move(desc), std::move(in), true, "an error sample"};
}
Sample nog(std::string desc, TensorList in, std::string why) {
  return Sample{std::move(desc), std::move(in), false, std::move(why)};
}
Sample flag(std::string desc, TensorList in, bool error) {
  return error ? err(std::move(desc), std::move(in)) : ok(std::move(desc), std::move(in));
}

// Wraps dims as PyTorch does for a tensor of `rank` dims (a 0-d tensor takes -1 and 0); false when
// one is out of range or two name the same dim.
bool wrap_dims(const std::vector<int64_t>& dims, int64_t rank, std::vector<int64_t>& out) {
  out.clear();
  const int64_t lo = rank == 0 ? -1 : -rank, hi = rank == 0 ? 0 : rank - 1;
  for (int64_t d : dims) {
    if (d < lo || d > hi) return false;
    int64_t w = d < 0 ? d + std::max<int64_t>(rank, 1) : d;
    if (std::find(out.begin(), out.end(), w) != out.end()) return false;
    out.push_back(w);
  }
  return true;
}

bool dim_ok(int64_t dim, int64_t rank) {
  std::vector<int64_t> w;
  return wrap_dims({dim}, rank, w);
}

int64_t wrapped(int64_t dim, int64_t rank) { return dim < 0 ? dim + std::max<int64_t>(rank, 1) : dim; }

// Elementwise unary ops. `kinks`: values where the op is not differentiable (one extra sample).
SampleFn unary_samples(Dom d, bool with_ints, std::vector<double> kinks = {}) {
  return [d, with_ints, kinks](Generator& g) {
    std::vector<Sample> s;
    s.push_back(ok("[3, 4]", {draw(g, {3, 4}, d)}));
    s.push_back(ok("0-d", {draw(g, {}, d)}));
    s.push_back(ok("empty [0, 3]", {draw(g, {0, 3}, d)}));
    s.push_back(ok("transposed [4, 5]", {transposed(draw(g, {4, 5}, d))}));
    s.push_back(ok("strided [3, 4], step 2", {strided(draw(g, {3, 4}, d))}));
    s.push_back(ok("expanded [3, 1] -> [3, 4]", {expanded(draw(g, {3, 1}, d), {3, 4})}));
    s.push_back(ok("expanded 0-d -> [2, 3]", {expanded(draw(g, {}, d), {2, 3})}));
    s.push_back(nog("zeros, inf, NaN, extremes",
                    {f64({0.0, -0.0, 1.0, -1.0, kInf, -kInf, kNaN, 1e-300, 1e300, -0.5}, {10})},
                    "non-finite inputs"));
    s.push_back(ok("float32 [2, 3]", {draw(g, {2, 3}, d, kFloat32)}));
    if (!kinks.empty())
      s.push_back(nog("at the kinks", {f64(kinks, {static_cast<int64_t>(kinks.size())})},
                      "not differentiable at its kinks (PyTorch's one-sided convention is compared instead)"));
    if (with_ints) s.push_back(ok("int64 [6]", {i64({-3, -1, 0, 1, 2, 5}, {6})}));
    return s;
  };
}

// Elementwise binary ops with broadcasting.
struct BinSpec {
  Dom da = Dom::Real, db = Dom::Real;
  bool ints = false;  // an int64 sample
  bool ties = false;  // a sample with equal elements (maximum, minimum, comparisons)
};

SampleFn binary_samples(BinSpec b) {
  return [b](Generator& g) {
    auto A = [&](const Shape& s, DType dt = kFloat64) { return draw(g, s, b.da, dt); };
    auto B = [&](const Shape& s, DType dt = kFloat64) { return draw(g, s, b.db, dt); };
    std::vector<Sample> s;
    s.push_back(ok("[3, 4] and [3, 4]", {A({3, 4}), B({3, 4})}));
    s.push_back(ok("broadcast [3, 4] and [4]", {A({3, 4}), B({4})}));
    s.push_back(ok("broadcast [3, 1] and [1, 4]", {A({3, 1}), B({1, 4})}));
    s.push_back(ok("broadcast [2, 3, 4] and 0-d", {A({2, 3, 4}), B({})}));
    s.push_back(ok("broadcast [4] and [2, 3, 4]", {A({4}), B({2, 3, 4})}));
    s.push_back(ok("0-d and 0-d", {A({}), B({})}));
    s.push_back(ok("empty [0, 4] and [4]", {A({0, 4}), B({4})}));
    s.push_back(ok("broadcast to empty: [2, 1] and [0]", {A({2, 1}), B({0})}));
    s.push_back(ok("transposed [3, 4] and strided [3, 4]", {transposed(A({3, 4})), strided(B({3, 4}))}));
    s.push_back(ok("expanded [3, 1] -> [3, 4] and [3, 4]", {expanded(A({3, 1}), {3, 4}), B({3, 4})}));
    s.push_back(ok("[2, 3] and expanded 0-d -> [2, 3]", {A({2, 3}), expanded(B({}), {2, 3})}));
    s.push_back(nog("inf and NaN",
                    {f64({kInf, -kInf, kNaN, 1.0, kInf, 0.0, -1.0, 0.0}, {8}),
                     f64({kInf, 1.0, 2.0, kNaN, -kInf, 0.0, 0.0, -0.0}, {8})},
                    "non-finite inputs"));
    s.push_back(ok("float32 [2, 3] and [3]", {A({2, 3}, kFloat32), B({3}, kFloat32)}));
    if (b.ties)
      s.push_back(nog("ties", {f64({1.0, 2.0, 3.0, -1.0, 0.5, 0.5}, {6}), f64({1.0, 0.0, 3.0, -1.0, 0.7, 0.5}, {6})},
                      "not differentiable where the inputs tie (the gradient is split evenly)"));
    if (b.ints)
      s.push_back(ok("int64 [2, 3] and [3]", {i64({-2, 0, 3, 5, -7, 1}, {2, 3}), i64({4, -1, 3}, {3})}));
    s.push_back(err("shapes [3, 4] and [5] do not broadcast", {A({3, 4}), B({5})}));
    s.push_back(err("shapes [2, 3] and [3, 2] do not broadcast", {A({2, 3}), B({3, 2})}));
    return s;
  };
}

// Reductions and other ops over dims: one list of inputs, the errors PyTorch raises computed
// from the dims and each input's shape and dtype.
struct RedSpec {
  std::vector<int64_t> dims;  // empty: all dims
  bool nonempty = false;      // PyTorch refuses to reduce an empty dim (max, min, argmax, argmin)
  bool floating = false;      // integer inputs raise (mean, var, softmax)
  bool ties_matter = false;   // not differentiable at ties (max, min)
  bool bools = false;         // add a bool input (sum)
  bool softmax_rows = false;  // add rows of -inf and large values
};

bool reduce_error(const RedSpec& r, const Tensor& t) {
  std::vector<int64_t> w;
  if (!wrap_dims(r.dims, t.dim(), w)) return true;
  if (r.floating && !is_floating(t.dtype())) return true;
  if (r.nonempty) {
    if (r.dims.empty()) return t.numel() == 0;
    for (int64_t d : w)
      if (t.dim() > 0 && t.size(d) == 0) return true;
  }
  return false;
}

SampleFn reduce_samples(RedSpec r) {
  return [r](Generator& g) {
    std::vector<std::pair<std::string, Tensor>> c = {
        {"[3, 4]", draw(g, {3, 4})},
        {"[2, 3, 4]", draw(g, {2, 3, 4})},
        {"1-D [5]", draw(g, {5})},
        {"0-d", draw(g, {})},
        {"[1, 4]", draw(g, {1, 4})},
        {"empty [0, 4]", draw(g, {0, 4})},
        {"empty [3, 0]", draw(g, {3, 0})},
        {"transposed [4, 5]", transposed(draw(g, {4, 5}))},
        {"transposed [2, 3, 4]", transposed(draw(g, {2, 3, 4}))},
        {"strided [3, 4], step 2", strided(draw(g, {3, 4}))},
        {"expanded [3, 1] -> [3, 4]", expanded(draw(g, {3, 1}), {3, 4})},
        {"float32 [3, 4]", draw(g, {3, 4}, Dom::Real, kFloat32)},
        {"int64 [3, 4]", i64({3, -1, 4, 1, -5, 9, 2, -6, 5, 3, 5, 0}, {3, 4})},
    };
    if (r.bools) c.push_back({"bool [3, 4]", b8({1, 0, 0, 1, 1, 1, 0, 0, 1, 0, 1, 0}, {3, 4})});
    std::vector<Sample> s;
    for (auto& [desc, t] : c) {
      Sample x = flag(desc, {t}, reduce_error(r, t));
      if (r.ties_matter && has_expanded_dims(t) && !x.expect_error)
        x.no_gradcheck = "expanded: the repeated elements tie (max/min are not differentiable there)";
      s.push_back(std::move(x));
    }
    Tensor ties = f64({1, 3, 3, 2, 2, 2, 0, 0, -1, 5, 5, 5}, {3, 4});
    s.push_back(Sample{"ties [3, 4]", {ties}, reduce_error(r, ties),
                       r.ties_matter ? "not differentiable at ties" : ""});
    Tensor special = f64({1, kInf, 2, 3, kNaN, 4, -kInf, 5, 6, kInf, -kInf, 7}, {3, 4});
    s.push_back(Sample{"inf and NaN [3, 4]", {special}, reduce_error(r, special), "non-finite inputs"});
    if (r.softmax_rows) {
      Tensor rows = f64({-kInf, 0, 1, 2, -kInf, -kInf, -kInf, -kInf, 1000, 1001, -1000, 0}, {3, 4});
      s.push_back(Sample{"-inf, a row of -inf, large values [3, 4]", {rows}, reduce_error(r, rows), "non-finite inputs"});
      Tensor big = f64({1000, 1001, 999, -1000, 500, 0.5}, {2, 3});
      s.push_back(Sample{"large values [2, 3]", {big}, reduce_error(r, big), ""});
    }
    return s;
  };
}

// One input of many shapes and layouts (views, copies, conversions); `error_if` says where
// PyTorch raises.
using Pred = std::function<bool(const Tensor&)>;

SampleFn shape_samples(Pred error_if, bool finite_only = true) {
  return [error_if, finite_only](Generator& g) {
    std::vector<std::pair<std::string, Tensor>> c = {
        {"[3, 4]", draw(g, {3, 4})},
        {"[2, 3, 4]", draw(g, {2, 3, 4})},
        {"1-D [5]", draw(g, {5})},
        {"0-d", draw(g, {})},
        {"[3, 1, 4, 1]", draw(g, {3, 1, 4, 1})},
        {"1-D [1]", draw(g, {1})},
        {"empty [0, 4]", draw(g, {0, 4})},
        {"empty [2, 0, 3]", draw(g, {2, 0, 3})},
        {"transposed [4, 5]", transposed(draw(g, {4, 5}))},
        {"transposed [2, 3, 4]", transposed(draw(g, {2, 3, 4}))},
        {"strided [3, 4], step 2", strided(draw(g, {3, 4}))},
        {"expanded [3, 1] -> [3, 4]", expanded(draw(g, {3, 1}), {3, 4})},
        {"expanded 0-d -> [2, 3]", expanded(draw(g, {}), {2, 3})},
        {"float32 [2, 3]", draw(g, {2, 3}, Dom::Real, kFloat32)},
        {"int64 [2, 3]", i64({4, -2, 0, 7, 1, -9}, {2, 3})},
        {"bool [2, 3]", b8({1, 0, 1, 1, 0, 0}, {2, 3})},
    };
    if (!finite_only) c.push_back({"inf and NaN [2, 3]", f64({kInf, -kInf, kNaN, 1.0, -0.0, 2.0}, {2, 3})});
    std::vector<Sample> s;
    for (auto& [desc, t] : c) {
      Sample x = flag(desc, {t}, error_if(t));
      if (!all_finite(t) && !x.expect_error) x.no_gradcheck = "non-finite inputs";
      s.push_back(std::move(x));
    }
    return s;
  };
}

// view(-1) works when the dims of size > 1 nest (each stride = next stride * next size).
bool flat_viewable(const Tensor& t) {
  if (t.numel() <= 1) return true;
  int64_t expected = -1;
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    if (t.size(d) == 1) continue;
    if (expected >= 0 && t.stride(d) != expected) return false;
    expected = t.stride(d) * t.size(d);
  }
  return true;
}

// PyTorch's expand rules (-1 keeps a dim; not allowed for new leading dims).
bool expand_fails(const Shape& s, const Shape& target) {
  const int64_t n = static_cast<int64_t>(target.size()), r = static_cast<int64_t>(s.size());
  if (r > n) return true;
  for (int64_t i = 0; i < n; ++i) {
    int64_t want = target[i];
    if (i < n - r) {
      if (want < 0) return true;
      continue;
    }
    int64_t have = s[i - (n - r)];
    if (want == -1) continue;
    if (want != have && have != 1) return true;
  }
  return false;
}

// index_select along `dim`.
bool index_select_error(const Tensor& a, int64_t dim, const Tensor& idx) {
  if (!dim_ok(dim, a.dim())) return true;
  if (idx.dtype() != kInt64 || idx.dim() > 1) return true;
  const int64_t n = a.dim() == 0 ? 1 : a.size(wrapped(dim, a.dim()));
  for (int64_t v : idx.to_vector<int64_t>())
    if (v < 0 || v >= n) return true;
  return false;
}

SampleFn index_select_samples(int64_t dim) {
  return [dim](Generator& g) {
    std::vector<std::pair<std::string, TensorList>> c = {
        {"[3, 4], index [4] with repeats", {draw(g, {3, 4}), i64({2, 0, 2, 1}, {4})}},
        {"[2, 3, 4], index [2]", {draw(g, {2, 3, 4}), i64({1, 0}, {2})}},
        {"1-D [5], index [3]", {draw(g, {5}), i64({4, 0, 4}, {3})}},
        {"0-d, index [1]", {draw(g, {}), i64({0}, {1})}},
        {"[3, 4], 0-d index", {draw(g, {3, 4}), i64({1}, {})}},
        {"[3, 4], empty index", {draw(g, {3, 4}), i64({}, {0})}},
        {"empty [0, 4], empty index", {draw(g, {0, 4}), i64({}, {0})}},
        {"transposed [4, 5], index [2]", {transposed(draw(g, {4, 5})), i64({1, 1}, {2})}},
        {"expanded [1, 4] -> [3, 4], index [2]", {expanded(draw(g, {1, 4}), {3, 4}), i64({0, 2}, {2})}},
        {"[3, 4], strided index [3]", {draw(g, {3, 4}), strided(i64({1, 0, 1}, {3}))}},
        {"float32 [3, 4]", {draw(g, {3, 4}, Dom::Real, kFloat32), i64({0, 1}, {2})}},
        {"int64 [3, 4]", {i64({3, -1, 4, 1, -5, 9, 2, -6, 5, 3, 5, 0}, {3, 4}), i64({2, 2}, {2})}},
        {"[3, 4], index 3", {draw(g, {3, 4}), i64({0, 3}, {2})}},
        {"[3, 4], negative index", {draw(g, {3, 4}), i64({-1}, {1})}},
        {"[3, 4], 2-D index", {draw(g, {3, 4}), i64({0, 1}, {1, 2})}},
    };
    std::vector<Sample> s;
    for (auto& [desc, in] : c) s.push_back(flag(desc, in, index_select_error(in[0], dim, in[1])));
    return s;
  };
}

// gather along `dim`.
bool gather_error(const Tensor& a, int64_t dim, const Tensor& idx) {
  if (!dim_ok(dim, a.dim())) return true;
  if (idx.numel() == 0) return false;  // PyTorch checks no shapes for an empty index
  if (idx.dim() != a.dim()) return true;
  const int64_t w = wrapped(dim, a.dim());
  for (int64_t d = 0; d < a.dim(); ++d)
    if (d != w && idx.size(d) > a.size(d)) return true;
  const int64_t n = a.dim() == 0 ? 1 : a.size(w);
  for (int64_t v : idx.to_vector<int64_t>())
    if (v < 0 || v >= n) return true;
  return false;
}

SampleFn gather_samples(int64_t dim) {
  return [dim](Generator& g) {
    std::vector<std::pair<std::string, TensorList>> c = {
        {"[3, 4], index [3, 2]", {draw(g, {3, 4}), ints(g, 0, 3, {3, 2})}},
        {"[3, 4], index [2, 6]", {draw(g, {3, 4}), ints(g, 0, 3, {2, 6})}},
        {"[3, 4], index [4, 1]", {draw(g, {3, 4}), i64({0, 1, 2, 0}, {4, 1})}},
        {"[2, 3, 4], index [2, 3, 2]", {draw(g, {2, 3, 4}), ints(g, 0, 2, {2, 3, 2})}},
        {"0-d, 0-d index", {draw(g, {}), i64({0}, {})}},
        {"1-D [5], index [7]", {draw(g, {5}), ints(g, 0, 5, {7})}},
        {"[3, 4], empty index [0, 2]", {draw(g, {3, 4}), i64({}, {0, 2})}},
        {"[3, 4], empty index [5, 0] (beyond dim 0)", {draw(g, {3, 4}), i64({}, {5, 0})}},
        {"[3, 4], empty index [0, 7] (beyond dim 1)", {draw(g, {3, 4}), i64({}, {0, 7})}},
        {"transposed [3, 4], index [3, 4]", {transposed(draw(g, {3, 4})), ints(g, 0, 3, {3, 4})}},
        {"[3, 4], transposed index [3, 3]", {draw(g, {3, 4}), transposed(ints(g, 0, 3, {3, 3}))}},
        {"[3, 4], all-zero index (repeats)", {draw(g, {3, 4}), i64(std::vector<int64_t>(12, 0), {3, 4})}},
        {"float32 [3, 4]", {draw(g, {3, 4}, Dom::Real, kFloat32), ints(g, 0, 3, {3, 2})}},
        {"int64 [3, 4]", {i64({3, -1, 4, 1, -5, 9, 2, -6, 5, 3, 5, 0}, {3, 4}), ints(g, 0, 3, {2, 2})}},
        {"[3, 4], index 4", {draw(g, {3, 4}), i64({0, 4}, {1, 2})}},
        {"[3, 4], negative index", {draw(g, {3, 4}), i64({-1}, {1, 1})}},
        {"[3, 4], 1-D index", {draw(g, {3, 4}), i64({0, 1}, {2})}},
    };
    std::vector<Sample> s;
    for (auto& [desc, in] : c) s.push_back(flag(desc, in, gather_error(in[0], dim, in[1])));
    return s;
  };
}

// scatter / scatter_add along `dim` of a [3, 4] input (and a few other shapes). `distinct` gives
// index rows whose entries along dim never repeat (scatter: with repeats one value wins, so the
// forward differs by backend and the gradient is not the numerical one).
Tensor distinct_index(Generator& g, const Shape& a, const Shape& idx, int64_t dim) {
  // 2-D: each line along dim holds the first idx[dim] entries of a fresh permutation of 0 .. n-1.
  const int64_t n = a[dim], rows = idx[0], cols = idx[1];
  std::vector<int64_t> values(static_cast<size_t>(rows * cols));
  for (int64_t line = 0; line < (dim == 0 ? cols : rows); ++line) {
    std::vector<int64_t> p = randperm(n, kInt64, &g).to_vector<int64_t>();
    for (int64_t k = 0; k < idx[dim]; ++k) values[dim == 0 ? k * cols + line : line * cols + k] = p[k];
  }
  return i64(values, idx);
}

bool scatter_error(const Tensor& a, int64_t dim, const Tensor& idx, const Tensor& src) {
  if (!dim_ok(dim, a.dim())) return true;
  if (idx.dtype() != kInt64 || src.dtype() != a.dtype()) return true;
  if (idx.dim() != a.dim() || src.dim() != a.dim()) return true;
  const int64_t w = wrapped(dim, a.dim());
  for (int64_t d = 0; d < a.dim(); ++d) {
    if (idx.size(d) > src.size(d)) return true;
    if (d != w && idx.size(d) > a.size(d)) return true;
  }
  const int64_t n = a.dim() == 0 ? 1 : a.size(w);
  for (int64_t v : idx.to_vector<int64_t>())
    if (v < 0 || v >= n) return true;
  return false;
}

SampleFn scatter_samples(int64_t dim, bool accumulate) {
  return [dim, accumulate](Generator& g) {
    const int64_t w = wrapped(dim, 2);
    Shape small = {3, 4};
    small[w] = 2;  // index and src: 2 entries along dim, all of the other dim
    auto idx = [&](const Shape& a, const Shape& i) { return distinct_index(g, a, i, w); };
    std::vector<std::pair<std::string, TensorList>> c = {
        {"[3, 4], index and src " + fmt::format("{}", small), {draw(g, {3, 4}), idx({3, 4}, small), draw(g, small)}},
        {"src larger than index [3, 5]", {draw(g, {3, 4}), idx({3, 4}, small), draw(g, {3, 5})}},
        {"index [1, 2]", {draw(g, {3, 4}), idx({3, 4}, {1, 2}), draw(g, {2, 3})}},
        {"empty index [0, 4]", {draw(g, {3, 4}), i64({}, {0, 4}), draw(g, {0, 4})}},
        {"empty input [0, 4]", {draw(g, {0, 4}), i64({}, {0, 4}), draw(g, {0, 4})}},
        {"transposed input", {transposed(draw(g, {4, 3})), idx({3, 4}, small), draw(g, small)}},
        {"transposed index and src",
         {draw(g, {3, 4}), transposed(contiguous(transposed(idx({3, 4}, small)))), transposed(draw(g, {small[1], small[0]}))}},
        {"expanded input [1, 4] -> [3, 4]", {expanded(draw(g, {1, 4}), {3, 4}), idx({3, 4}, small), draw(g, small)}},
        {"float32", {draw(g, {3, 4}, Dom::Real, kFloat32), idx({3, 4}, small), draw(g, small, Dom::Real, kFloat32)}},
        {"int64", {i64({3, -1, 4, 1, -5, 9, 2, -6, 5, 3, 5, 0}, {3, 4}), idx({3, 4}, small), ints(g, -9, 9, small)}},
        {"index out of range", {draw(g, {3, 4}), i64({0, 5}, {1, 2}), draw(g, {1, 2})}},
        {"negative index", {draw(g, {3, 4}), i64({-1}, {1, 1}), draw(g, {1, 1})}},
        {"index of another rank", {draw(g, {3, 4}), i64({0, 1}, {2}), draw(g, {2})}},
        {"index larger than src", {draw(g, {3, 4}), idx({3, 4}, small), draw(g, {1, 1})}},
        {"float index", {draw(g, {3, 4}), draw(g, small), draw(g, small)}},
        {"src of another dtype", {draw(g, {3, 4}), idx({3, 4}, small), draw(g, small, Dom::Real, kFloat32)}},
    };
    if (w == 0) c.push_back({"0-d", {draw(g, {}), i64({0}, {}), draw(g, {})}});
    std::vector<Sample> s;
    for (auto& [desc, in] : c) s.push_back(flag(desc, in, scatter_error(in[0], dim, in[1], in[2])));
    // Repeated indices: scatter_add sums them; scatter keeps one, so its src is expanded (all
    // repeats carry one value, whichever wins) and skips gradcheck.
    Tensor repeats = zeros(small, kInt64);
    if (accumulate) {
      s.push_back(ok("repeated indices", {draw(g, {3, 4}), repeats, draw(g, small)}));
    } else {
      Shape one = small;
      one[w] = 1;
      s.push_back(nog("repeated indices, equal values", {draw(g, {3, 4}), repeats, expanded(draw(g, one), small)},
                      "one of the repeated writes wins: the gradient reaches each"));
    }
    s.push_back(nog("inf and NaN in src", {draw(g, {3, 4}), idx({3, 4}, small), full(small, kNaN, kFloat64)},
                    "non-finite inputs"));
    return s;
  };
}

// unfold(dim, size, step): PyTorch raises for a dim out of range or a window longer than the dim
// (a 0-d input is one element).
Pred unfold_error(int64_t dim, int64_t size) {
  return [dim, size](const Tensor& x) {
    if (!dim_ok(dim, x.dim())) return true;
    const int64_t n = x.dim() == 0 ? 1 : x.size(wrapped(dim, x.dim()));
    return size > n;
  };
}

// sort, argsort and cumsum along `dim`: PyTorch raises only for a dim out of range. With
// `ties_matter` (sort), inputs whose elements tie (expanded ones included) skip gradcheck: the
// sort is not differentiable where two elements are equal.
SampleFn along_dim_samples(int64_t dim, bool ties_matter) {
  return [dim, ties_matter](Generator& g) {
    struct Case {
      std::string desc;
      Tensor t;
      bool ties;
    };
    std::vector<Case> c = {
        {"[3, 4]", draw(g, {3, 4}), false},
        {"[2, 3, 4]", draw(g, {2, 3, 4}), false},
        {"1-D [5]", draw(g, {5}), false},
        {"0-d", draw(g, {}), false},
        {"[1, 4]", draw(g, {1, 4}), false},
        {"empty [0, 4]", draw(g, {0, 4}), false},
        {"empty [3, 0]", draw(g, {3, 0}), false},
        {"transposed [4, 5]", transposed(draw(g, {4, 5})), false},
        {"transposed [2, 3, 4]", transposed(draw(g, {2, 3, 4})), false},
        {"strided [3, 4], step 2", strided(draw(g, {3, 4})), false},
        {"expanded [3, 1] -> [3, 4]", expanded(draw(g, {3, 1}), {3, 4}), true},
        {"expanded [1, 4] -> [3, 4]", expanded(draw(g, {1, 4}), {3, 4}), true},
        {"float32 [3, 4]", draw(g, {3, 4}, Dom::Real, kFloat32), false},
        {"int64 [3, 4] with ties", i64({3, -1, 4, 1, -5, 9, 2, -6, 5, 3, 5, 0}, {3, 4}), true},
        {"bool [3, 4]", b8({1, 0, 0, 1, 1, 1, 0, 0, 1, 0, 1, 0}, {3, 4}), true},
        {"ties [3, 4]", f64({1, 3, 3, 2, 2, 2, 0, 0, -1, 5, 5, 5}, {3, 4}), true},
        {"inf and NaN [3, 4]", f64({1, kInf, 2, 3, kNaN, 4, -kInf, 5, 6, kInf, -kInf, 7}, {3, 4}), true},
        {"NaNs, signed zeros and infinities [2, 5]",
         f64({kNaN, 0.0, -0.0, kNaN, 1.0, -kInf, kInf, 0.0, kNaN, -1.0}, {2, 5}), true},
    };
    std::vector<Sample> s;
    for (Case& x : c) {
      Sample y = flag(x.desc, {x.t}, !dim_ok(dim, x.t.dim()));
      if (!y.expect_error && !all_finite(x.t)) y.no_gradcheck = "non-finite inputs";
      else if (!y.expect_error && ties_matter && x.ties)
        y.no_gradcheck = "equal elements tie: the sort is not differentiable there";
      s.push_back(std::move(y));
    }
    return s;
  };
}

// topk(k) along `dim`. No input ties along either dim: PyTorch's CPU topk orders equal values its
// own way, tapestry's puts the lowest index first (tests/test_sort_ops.cpp checks that). The
// expanded input repeats along the other dim only. PyTorch raises for a dim out of range, k
// outside [0, size of the dim] (a 0-d input has size 1) and bool inputs.
SampleFn topk_samples(int64_t k, int64_t dim) {
  return [k, dim](Generator& g) {
    const bool last = wrapped(dim, 2) == 1;
    std::vector<std::pair<std::string, Tensor>> c = {
        {"[3, 4]", draw(g, {3, 4})},
        {"[2, 3, 4]", draw(g, {2, 3, 4})},
        {"1-D [5]", draw(g, {5})},
        {"0-d", draw(g, {})},
        {"[1, 4]", draw(g, {1, 4})},
        {"[4, 1]", draw(g, {4, 1})},
        {"empty [0, 4]", draw(g, {0, 4})},
        {"empty [3, 0]", draw(g, {3, 0})},
        {"transposed [4, 5]", transposed(draw(g, {4, 5}))},
        {"transposed [2, 3, 4]", transposed(draw(g, {2, 3, 4}))},
        {"strided [3, 4], step 2", strided(draw(g, {3, 4}))},
        {last ? "expanded [1, 4] -> [3, 4]" : "expanded [3, 1] -> [3, 4]",
         last ? expanded(draw(g, {1, 4}), {3, 4}) : expanded(draw(g, {3, 1}), {3, 4})},
        {"float32 [3, 4]", draw(g, {3, 4}, Dom::Real, kFloat32)},
        {"int64 [3, 4]", i64({3, -1, 4, 1, -5, 9, 2, -6, 7, 8, 10, 0}, {3, 4})},
        {"bool [3, 4]", b8({1, 0, 0, 1, 1, 1, 0, 0, 1, 0, 1, 0}, {3, 4})},
        {"inf and NaN [3, 4]", f64({1, kInf, 2, 3, kNaN, 4, -kInf, 5, 6, -kInf, kNaN, 7}, {3, 4})},
    };
    std::vector<Sample> s;
    for (auto& [desc, t] : c) {
      bool e = !dim_ok(dim, t.dim()) || t.dtype() == kBool;
      if (!e) {
        const int64_t n = t.dim() == 0 ? 1 : t.size(wrapped(dim, t.dim()));
        e = k < 0 || k > n;
      }
      Sample x = flag(desc, {t}, e);
      if (!x.expect_error && !all_finite(t)) x.no_gradcheck = "non-finite inputs";
      s.push_back(std::move(x));
    }
    return s;
  };
}

// ---------------------------------------------------------------------------------------------
// The table

template <class F> OpFn one(F f) {
  return [f](const TensorList& x) { return TensorList{f(x)}; };
}

OpFn values_indices(std::function<ValuesIndices(const TensorList&)> f) {
  return [f](const TensorList& x) {
    ValuesIndices r = f(x);
    return TensorList{r.values, r.indices};
  };
}

// Input i, or an undefined tensor where a sample has fewer (an error sample may leave out an
// optional input, such as attention's mask).
Tensor input_or_none(const TensorList& x, size_t i) { return i < x.size() ? x[i] : Tensor(); }

// Adds a row to the table being built (`entry(...).link = ...` sets more than the five fields).
struct Entry {
  std::vector<OpInfo>& t;
  OpInfo& operator()(std::string name, std::string expr, OpFn fn, std::vector<bool> diff,
                     std::vector<SampleFn> samples) const {
    t.push_back(OpInfo{std::move(name), std::move(expr), std::move(fn), std::move(diff), std::move(samples)});
    return t.back();
  }
};
using X = const TensorList&;

// Samples of fewer than n dims are errors (transpose and the triangles need 2).
Pred rank_lt(int64_t n) { return Pred([n](const Tensor& x) { return x.dim() < n; }); }

// The rows of the elementwise ops: unary math, arithmetic with a scalar and with broadcasting, comparisons, where and masked_fill.
void add_elementwise_rows(std::vector<OpInfo>& t) {
  const Entry entry{t};
  // ---- unary math
  entry("exp", "torch.exp(a)", one([](X x) { return exp(x[0]); }), {true}, {unary_samples(Dom::Real, false)}).link = Link::Grows;
  entry("log", "torch.log(a)", one([](X x) { return log(x[0]); }), {true}, {unary_samples(Dom::Pos, false)}).link = Link::Positive;
  entry("log1p", "torch.log1p(a)", one([](X x) { return log1p(x[0]); }), {true}, {unary_samples(Dom::Pos, false)})
      .link = Link::Positive;
  entry("expm1", "torch.expm1(a)", one([](X x) { return expm1(x[0]); }), {true}, {unary_samples(Dom::Real, false)})
      .link = Link::Grows;
  entry("softplus", "F.softplus(a)", one([](X x) { return softplus(x[0]); }), {true}, {unary_samples(Dom::Real, false)})
      .link = Link::Smooth;
  entry("softplus_beta_threshold", "F.softplus(a, beta=2.0, threshold=1.0)",
        one([](X x) { return softplus(x[0], 2.0, 1.0); }), {true}, {unary_samples(Dom::Real, false, {0.5})});
  entry("clamp_min", "torch.clamp_min(a, 0.25)", one([](X x) { return clamp_min(x[0], 0.25); }), {true},
        {unary_samples(Dom::Real, false, {0.25})}).link = Link::Kinked;
  entry("sqrt", "torch.sqrt(a)", one([](X x) { return sqrt(x[0]); }), {true}, {unary_samples(Dom::Pos, false)}).link = Link::Positive;
  entry("rsqrt", "torch.rsqrt(a)", one([](X x) { return rsqrt(x[0]); }), {true}, {unary_samples(Dom::Pos, false)}).link = Link::Positive;
  entry("tanh", "torch.tanh(a)", one([](X x) { return tanh(x[0]); }), {true}, {unary_samples(Dom::Real, false)}).link = Link::Smooth;
  entry("sigmoid", "torch.sigmoid(a)", one([](X x) { return sigmoid(x[0]); }), {true},
        {unary_samples(Dom::Real, false)}).link = Link::Smooth;
  entry("gelu", "F.gelu(a)", one([](X x) { return gelu(x[0]); }), {true}, {unary_samples(Dom::Real, false)}).link = Link::Smooth;
  entry("gelu_tanh", "F.gelu(a, approximate='tanh')", one([](X x) { return gelu(x[0], "tanh"); }), {true},
        {unary_samples(Dom::Real, false)}).link = Link::Smooth;
  // gelu's backward as an op of its own (a second derivative's building block), as aten's.
  entry("gelu_backward", "torch.ops.aten.gelu_backward(a, b)", one([](X x) { return gelu_backward(x[0], x[1]); }),
        {true, true}, {binary_samples({Dom::Real, Dom::Real, false, false})});
  entry("gelu_backward_tanh", "torch.ops.aten.gelu_backward(a, b, approximate='tanh')",
        one([](X x) { return gelu_backward(x[0], x[1], true); }), {true, true},
        {binary_samples({Dom::Real, Dom::Real, false, false})});
  entry("relu", "torch.relu(a)", one([](X x) { return relu(x[0]); }), {true},
        {unary_samples(Dom::Real, true, {0.0, -0.0, 0.0})}).link = Link::Kinked;
  entry("abs", "torch.abs(a)", one([](X x) { return abs(x[0]); }), {true},
        {unary_samples(Dom::Real, true, {0.0, -0.0})}).link = Link::Kinked;
  entry("neg", "torch.neg(a)", one([](X x) { return neg(x[0]); }), {true}, {unary_samples(Dom::Real, true)}).link = Link::Smooth;
  entry("neg_operator", "-a", one([](X x) { return -x[0]; }), {true}, {unary_samples(Dom::Real, false)});
  entry("pow_2", "torch.pow(a, 2.0)", one([](X x) { return pow(x[0], 2.0); }), {true},
        {unary_samples(Dom::Real, false)}).link = Link::Smooth;
  entry("pow_3", "a.pow(3.0)", one([](X x) { return x[0].pow(3.0); }), {true}, {unary_samples(Dom::Real, false)}).link = Link::Grows;
  entry("pow_0.5", "torch.pow(a, 0.5)", one([](X x) { return pow(x[0], 0.5); }), {true},
        {unary_samples(Dom::Pos, false)});
  entry("pow_-1.5", "torch.pow(a, -1.5)", one([](X x) { return pow(x[0], -1.5); }), {true},
        {unary_samples(Dom::Pos, false)});
  entry("pow_0", "torch.pow(a, 0.0)", one([](X x) { return pow(x[0], 0.0); }), {true},
        {unary_samples(Dom::Real, false)});
  entry("clamp", "torch.clamp(a, -0.5, 0.5)", one([](X x) { return clamp(x[0], -0.5, 0.5); }), {true},
        {unary_samples(Dom::Real, false, {-0.5, 0.5, -0.5, 0.5})}).link = Link::Kinked;
  entry("clamp_int_bounds", "torch.clamp(a, -1, 2)", one([](X x) { return clamp(x[0], -1.0, 2.0); }), {true},
        {unary_samples(Dom::Real, true, {-1.0, 2.0})});
  // Deliberate: tapestry refuses min > max; PyTorch returns max everywhere (allowlisted).
  entry("clamp_min_gt_max", "torch.clamp(a, 0.5, -0.5)", one([](X x) { return clamp(x[0], 0.5, -0.5); }), {true},
        {[](Generator& g) { return std::vector<Sample>{err("[3, 4]", {draw(g, {3, 4})})}; }});

  // ---- arithmetic with a scalar
  entry("add_scalar", "a + 2.5", one([](X x) { return x[0] + 2.5; }), {true}, {unary_samples(Dom::Real, false)}).link = Link::Smooth;
  entry("add_scalar_fn", "torch.add(a, 2.5)", one([](X x) { return add(x[0], 2.5); }), {true},
        {unary_samples(Dom::Real, false)});
  entry("sub_scalar", "a - 1.5", one([](X x) { return sub(x[0], 1.5); }), {true}, {unary_samples(Dom::Real, false)});
  entry("mul_scalar", "a * -3.0", one([](X x) { return mul(x[0], -3.0); }), {true},
        {unary_samples(Dom::Real, false)}).link = Link::Grows;
  entry("mul_scalar_int", "a * 3", one([](X x) { return x[0] * 3.0; }), {true}, {unary_samples(Dom::Real, true)});
  entry("div_scalar", "a / 4.0", one([](X x) { return div(x[0], 4.0); }), {true}, {unary_samples(Dom::Real, false)}).link = Link::Smooth;
  entry("rsub_scalar", "2.0 - a", one([](X x) { return rsub(x[0], 2.0); }), {true},
        {unary_samples(Dom::Real, false)}).link = Link::Smooth;
  entry("rsub_operator", "2.0 - a", one([](X x) { return 2.0 - x[0]; }), {true}, {unary_samples(Dom::Real, false)});
  entry("rdiv_scalar", "2.0 / a", one([](X x) { return rdiv(x[0], 2.0); }), {true}, {unary_samples(Dom::Pos, false)}).link = Link::Positive;
  entry("rdiv_operator", "2.0 / a", one([](X x) { return 2.0 / x[0]; }), {true}, {unary_samples(Dom::Pos, false)});
  entry("radd_operator", "1.5 + a", one([](X x) { return 1.5 + x[0]; }), {true}, {unary_samples(Dom::Real, false)});
  entry("rmul_operator", "0.5 * a", one([](X x) { return 0.5 * x[0]; }), {true}, {unary_samples(Dom::Real, false)});

  // ---- binary arithmetic with broadcasting
  entry("add", "torch.add(a, b)", one([](X x) { return add(x[0], x[1]); }), {true, true},
        {binary_samples({Dom::Real, Dom::Real, true, false})});
  entry("add_method", "a.add(b)", one([](X x) { return x[0] + x[1]; }), {true, true},
        {binary_samples({Dom::Real, Dom::Real, false, false})});
  entry("sub", "torch.sub(a, b)", one([](X x) { return sub(x[0], x[1]); }), {true, true},
        {binary_samples({Dom::Real, Dom::Real, true, false})});
  entry("mul", "a * b", one([](X x) { return mul(x[0], x[1]); }), {true, true},
        {binary_samples({Dom::Real, Dom::Real, true, false})});
  // One tensor as both operands: its gradient accumulates from the two uses.
  entry("mul_self", "a * a", one([](X x) { return x[0] * x[0]; }), {true}, {unary_samples(Dom::Real, false)});
  entry("div", "torch.div(a, b)", one([](X x) { return div(x[0], x[1]); }), {true, true},
        {binary_samples({Dom::Real, Dom::Pos, false, false})});
  entry("div_operator", "a / b", one([](X x) { return x[0] / x[1]; }), {true, true},
        {binary_samples({Dom::Real, Dom::Pos, false, false})});
  entry("maximum", "torch.maximum(a, b)", one([](X x) { return maximum(x[0], x[1]); }), {true, true},
        {binary_samples({Dom::Real, Dom::Real, true, true})});
  entry("minimum", "torch.minimum(a, b)", one([](X x) { return minimum(x[0], x[1]); }), {true, true},
        {binary_samples({Dom::Real, Dom::Real, true, true})});
  // Deliberate: tapestry has no type promotion and refuses mixed dtypes (allowlisted).
  entry("add_dtype_mismatch", "torch.add(a, b)", one([](X x) { return add(x[0], x[1]); }), {true, true},
        {[](Generator& g) {
          return std::vector<Sample>{err("float64 [3] and float32 [3]", {draw(g, {3}), draw(g, {3}, Dom::Real, kFloat32)})};
        }});

  // ---- comparisons and logical ops (not differentiable)
  BinSpec cmp{Dom::Real, Dom::Real, true, true};
  entry("eq", "torch.eq(a, b)", one([](X x) { return eq(x[0], x[1]); }), {}, {binary_samples(cmp)});
  entry("ne", "torch.ne(a, b)", one([](X x) { return ne(x[0], x[1]); }), {}, {binary_samples(cmp)});
  entry("lt", "torch.lt(a, b)", one([](X x) { return lt(x[0], x[1]); }), {}, {binary_samples(cmp)});
  entry("le", "a <= b", one([](X x) { return le(x[0], x[1]); }), {}, {binary_samples(cmp)});
  entry("gt", "torch.gt(a, b)", one([](X x) { return gt(x[0], x[1]); }), {}, {binary_samples(cmp)});
  entry("ge", "torch.ge(a, b)", one([](X x) { return ge(x[0], x[1]); }), {}, {binary_samples(cmp)});
  entry("eq_scalar", "torch.eq(a, 0.5)", one([](X x) { return eq(x[0], 0.5); }), {}, {unary_samples(Dom::Real, false)});
  entry("gt_scalar", "torch.gt(a, 0.5)", one([](X x) { return gt(x[0], 0.5); }), {}, {unary_samples(Dom::Real, false)});
  entry("le_scalar", "torch.le(a, 1.0)", one([](X x) { return le(x[0], 1.0); }), {}, {unary_samples(Dom::Real, true)});
  entry("ne_scalar", "a != 0.0", one([](X x) { return ne(x[0], 0.0); }), {}, {unary_samples(Dom::Real, true)});
  entry("lt_scalar", "torch.lt(a, 0.0)", one([](X x) { return lt(x[0], 0.0); }), {}, {unary_samples(Dom::Real, true)});
  entry("ge_scalar", "torch.ge(a, -1.0)", one([](X x) { return ge(x[0], -1.0); }), {},
        {unary_samples(Dom::Real, true)});
  entry("logical_not", "torch.logical_not(a)", one([](X x) { return logical_not(x[0]); }), {},
        {[](Generator& g) {
          return std::vector<Sample>{
              ok("bool [3, 4]", {mask(g, {3, 4})}), ok("bool 0-d", {b8({1}, {})}), ok("bool empty [0, 2]", {mask(g, {0, 2})}),
              ok("bool transposed [4, 5]", {transposed(mask(g, {4, 5}))}),
              ok("bool expanded [3, 1] -> [3, 4]", {expanded(mask(g, {3, 1}), {3, 4})})};
        }});
  entry("logical_or", "torch.logical_or(a, b)", one([](X x) { return logical_or(x[0], x[1]); }), {},
        {[](Generator& g) {
          return std::vector<Sample>{
              ok("[3, 4] and [3, 4]", {mask(g, {3, 4}), mask(g, {3, 4})}),
              ok("broadcast [2] and [2, 1]", {b8({1, 0}, {2}), b8({1, 0}, {2, 1})}),
              ok("0-d and [3]", {b8({0}, {}), mask(g, {3})}), ok("empty [0, 3] and [3]", {mask(g, {0, 3}), mask(g, {3})}),
              ok("transposed and strided", {transposed(mask(g, {3, 4})), strided(mask(g, {3, 4}))}),
              err("shapes [3] and [4] do not broadcast", {mask(g, {3}), mask(g, {4})})};
        }});

  // ---- where and masked_fill
  entry("where", "torch.where(a, b, c)", one([](X x) { return where(x[0], x[1], x[2]); }), {false, true, true},
        {[](Generator& g) {
          return std::vector<Sample>{
              ok("[3, 4]", {mask(g, {3, 4}), draw(g, {3, 4}), draw(g, {3, 4})}),
              ok("broadcast cond [4], [3, 1], 0-d", {mask(g, {4}), draw(g, {3, 1}), draw(g, {})}),
              ok("0-d cond", {b8({1}, {}), draw(g, {2, 3}), draw(g, {2, 3})}),
              ok("0-d everything", {b8({0}, {}), draw(g, {}), draw(g, {})}),
              ok("transposed cond, strided a, expanded b",
                 {transposed(mask(g, {3, 4})), strided(draw(g, {3, 4})), expanded(draw(g, {1, 4}), {3, 4})}),
              ok("empty [0, 3]", {mask(g, {0, 3}), draw(g, {0, 3}), draw(g, {3})}),
              nog("NaN and inf in the branch not taken",
                  {b8({1, 0, 1, 0}, {4}), f64({1.0, kNaN, 2.0, kInf}, {4}), f64({kNaN, 3.0, -kInf, 4.0}, {4})},
                  "non-finite inputs"),
              ok("float32", {mask(g, {2, 3}), draw(g, {2, 3}, Dom::Real, kFloat32), draw(g, {3}, Dom::Real, kFloat32)}),
              ok("int64", {mask(g, {2, 3}), i64({1, 2, 3}, {3}), i64({-1, -2, -3, -4, -5, -6}, {2, 3})}),
              err("float condition", {draw(g, {3}), draw(g, {3}), draw(g, {3})}),
              err("shapes [3], [4], [3] do not broadcast", {mask(g, {3}), draw(g, {4}), draw(g, {3})})};
        }});
  entry("where_scalar_other", "torch.where(a, b, 0.5)", one([](X x) { return where(x[0], x[1], 0.5); }),
        {false, true},
        {[](Generator& g) {
          return std::vector<Sample>{ok("[3, 4]", {mask(g, {3, 4}), draw(g, {3, 4})}),
                                     ok("broadcast cond [4] and [3, 1]", {mask(g, {4}), draw(g, {3, 1})}),
                                     ok("0-d", {b8({0}, {}), draw(g, {})}),
                                     ok("float32", {mask(g, {3}), draw(g, {3}, Dom::Real, kFloat32)})};
        }});
  entry("where_scalar_self", "torch.where(a, -1.25, b)", one([](X x) { return where(x[0], -1.25, x[1]); }),
        {false, true},
        {[](Generator& g) {
          return std::vector<Sample>{ok("[3, 4]", {mask(g, {3, 4}), draw(g, {3, 4})}),
                                     ok("transposed", {transposed(mask(g, {3, 4})), transposed(draw(g, {3, 4}))})};
        }});
  auto masked_fill_samples = [](Generator& g) {
    return std::vector<Sample>{
        ok("[3, 4], mask [3, 4]", {draw(g, {3, 4}), mask(g, {3, 4})}),
        ok("[3, 4], mask [4]", {draw(g, {3, 4}), mask(g, {4})}),
        ok("[2, 3, 4], mask [3, 1]", {draw(g, {2, 3, 4}), mask(g, {3, 1})}),
        ok("[3, 4], 0-d mask", {draw(g, {3, 4}), b8({1}, {})}),
        ok("0-d, 0-d mask", {draw(g, {}), b8({1}, {})}),
        ok("transposed input, strided mask", {transposed(draw(g, {3, 4})), strided(mask(g, {3, 4}))}),
        ok("expanded input [3, 1] -> [3, 4]", {expanded(draw(g, {3, 1}), {3, 4}), mask(g, {3, 4})}),
        ok("empty [0, 4]", {draw(g, {0, 4}), mask(g, {4})}),
        nog("NaN where masked", {f64({kNaN, 1.0, kInf, 2.0}, {4}), b8({1, 0, 1, 0}, {4})}, "non-finite inputs"),
        ok("float32", {draw(g, {2, 3}, Dom::Real, kFloat32), mask(g, {2, 3})}),
        err("mask [5] does not broadcast to [3, 4]", {draw(g, {3, 4}), mask(g, {5})})};
  };
  entry("masked_fill", "a.masked_fill(b, -1.5)", one([](X x) { return masked_fill(x[0], x[1], -1.5); }),
        {true, false}, {masked_fill_samples});
  entry("masked_fill_method_neg_inf", "a.masked_fill(b, -inf)",
        one([](X x) { return x[0].masked_fill(x[1], -kInf); }), {true, false}, {masked_fill_samples});
  // Deliberate: tapestry keeps the input's shape; PyTorch's out-of-place form broadcasts the input
  // up to the mask (allowlisted).
  entry("masked_fill_broadcast_input", "a.masked_fill(b, 0.0)", one([](X x) { return masked_fill(x[0], x[1], 0.0); }),
        {true, false}, {[](Generator& g) {
          return std::vector<Sample>{err("[3, 1] and mask [3, 4]", {draw(g, {3, 1}), mask(g, {3, 4})})};
        }});
}

// Large magnitudes, where a row's log-sum must survive beside its max (Note [Row statistics] in
// ops/cpu/loss.cpp): float64 rows at 1e300 (log_softmax [-log 2, -log 2]), float32 near 1e4, and
// float64 rows masked with -1e9. A finite difference vanishes in their rounding: no gradcheck, but
// the values and the gradients are PyTorch's.
std::vector<Sample> large_magnitude_rows() {
  const char* why = "large magnitudes: a finite difference vanishes in their rounding";
  const std::vector<double> near_1e4 = {1e4, 1e4 + 1, 1e4 - 2, 1e4 + 0.5, 1e4, 1e4 - 1};
  return {nog("float64 rows at 1e300", {f64({1e300, 1e300, -1e300, -1e300}, {2, 2})}, why),
          nog("float32 near 1e4", {f64(near_1e4, {2, 3}).to(kFloat32)}, why),
          nog("float64 masked with -1e9", {f64({-1e9, -1e9 + 0.25, -1e9 - 0.5, 0.5, -1e9, 1.0}, {2, 3})}, why)};
}

// The rows of reductions, softmax and log_softmax, layer_norm.
void add_reduction_rows(std::vector<OpInfo>& t) {
  const Entry entry{t};
  // ---- reductions
  entry("sum_all", "torch.sum(a)", one([](X x) { return sum(x[0]); }), {true}, {reduce_samples({{}, false, false, false, true, false})});
  entry("sum_method_all", "a.sum()", one([](X x) { return x[0].sum(); }), {true}, {reduce_samples({{}, false, false, false, true, false})});
  entry("sum_dim0", "torch.sum(a, dim=[0])", one([](X x) { return sum(x[0], {0}); }), {true},
        {reduce_samples({{0}, false, false, false, true, false})});
  entry("sum_dim-1_keepdim", "torch.sum(a, dim=[-1], keepdim=True)", one([](X x) { return sum(x[0], {-1}, true); }),
        {true}, {reduce_samples({{-1}, false, false, false, true, false})});
  entry("sum_dims_0_2", "torch.sum(a, dim=[0, 2])", one([](X x) { return sum(x[0], {0, 2}); }), {true},
        {reduce_samples({{0, 2}, false, false, false, false, false})});
  entry("sum_dims_repeated", "torch.sum(a, dim=[0, -2])", one([](X x) { return sum(x[0], {0, -2}); }), {true},
        {reduce_samples({{0, -2}, false, false, false, false, false})});
  entry("sum_method_dim1", "a.sum([1], keepdim=True)", one([](X x) { return x[0].sum({1}, true); }), {true},
        {reduce_samples({{1}, false, false, false, true, false})});
  entry("mean_all", "torch.mean(a)", one([](X x) { return mean(x[0]); }), {true},
        {reduce_samples({{}, false, true, false, false, false})});
  entry("mean_dim0", "torch.mean(a, dim=[0])", one([](X x) { return mean(x[0], {0}); }), {true},
        {reduce_samples({{0}, false, true, false, false, false})});
  entry("mean_dims_keepdim", "torch.mean(a, dim=[-1, 0], keepdim=True)",
        one([](X x) { return mean(x[0], {-1, 0}, true); }), {true}, {reduce_samples({{-1, 0}, false, true, false, false, false})});
  entry("mean_method_dim1", "a.mean([1])", one([](X x) { return x[0].mean({1}); }), {true},
        {reduce_samples({{1}, false, true, false, false, false})});
  entry("var_all", "torch.var(a)", one([](X x) { return var(x[0]); }), {true}, {reduce_samples({{}, false, true, false, false, false})});
  entry("var_dim0", "torch.var(a, dim=[0])", one([](X x) { return var(x[0], {0}); }), {true},
        {reduce_samples({{0}, false, true, false, false, false})});
  entry("var_dim1", "torch.var(a, dim=[1])", one([](X x) { return var(x[0], {1}); }), {true},
        {reduce_samples({{1}, false, true, false, false, false})});
  entry("var_dim0_correction0", "torch.var(a, dim=[0], correction=0)", one([](X x) { return var(x[0], {0}, 0); }),
        {true}, {reduce_samples({{0}, false, true, false, false, false})});
  entry("var_dim-1_keepdim", "torch.var(a, dim=[-1], keepdim=True)",
        one([](X x) { return var(x[0], {-1}, 1, true); }), {true}, {reduce_samples({{-1}, false, true, false, false, false})});
  entry("var_dims_correction2", "torch.var(a, dim=[0, 1], correction=2)",
        one([](X x) { return var(x[0], {0, 1}, 2); }), {true}, {reduce_samples({{0, 1}, false, true, false, false, false})});
  // PyTorch divides by max(0, N - correction): inf or NaN when the correction exceeds the count.
  entry("var_correction_exceeds_count", "torch.var(a, dim=[1], correction=5)",
        one([](X x) { return var(x[0], {1}, 5); }), {true},
        {[](Generator& g) {
          return std::vector<Sample>{nog("[3, 4]", {draw(g, {3, 4})}, "the output is not finite"),
                                     nog("[2, 5]", {draw(g, {2, 5})}, "the output is not finite")};
        }});
  entry("max_all", "torch.max(a)", one([](X x) { return max(x[0]); }), {true},
        {reduce_samples({{}, true, false, true, false, false})});
  entry("min_all", "torch.min(a)", one([](X x) { return min(x[0]); }), {true},
        {reduce_samples({{}, true, false, true, false, false})});
  entry("max_dim1", "torch.max(a, 1)", values_indices([](X x) { return max(x[0], 1); }), {true},
        {reduce_samples({{1}, true, false, true, false, false})});
  entry("max_dim-1_keepdim", "torch.max(a, -1, keepdim=True)", values_indices([](X x) { return max(x[0], -1, true); }),
        {true}, {reduce_samples({{-1}, true, false, true, false, false})});
  entry("min_dim0", "torch.min(a, 0)", values_indices([](X x) { return min(x[0], 0); }), {true},
        {reduce_samples({{0}, true, false, true, false, false})});
  entry("min_dim1_keepdim", "torch.min(a, 1, True)", values_indices([](X x) { return min(x[0], 1, true); }), {true},
        {reduce_samples({{1}, true, false, true, false, false})});
  entry("argmax_dim1", "torch.argmax(a, 1)", one([](X x) { return argmax(x[0], 1); }), {},
        {reduce_samples({{1}, true, false, true, false, false})});
  entry("argmax_dim0_keepdim", "torch.argmax(a, dim=0, keepdim=True)", one([](X x) { return argmax(x[0], 0, true); }),
        {}, {reduce_samples({{0}, true, false, true, false, false})});
  entry("argmin_dim-1", "torch.argmin(a, -1)", one([](X x) { return argmin(x[0], -1); }), {},
        {reduce_samples({{-1}, true, false, true, false, false})});

  // ---- softmax and log_softmax
  entry("softmax_dim1", "torch.softmax(a, 1)", one([](X x) { return softmax(x[0], 1); }), {true},
        {reduce_samples({{1}, false, true, false, false, true}), [](Generator&) { return large_magnitude_rows(); }});
  entry("softmax_dim0", "F.softmax(a, dim=0)", one([](X x) { return softmax(x[0], 0); }), {true},
        {reduce_samples({{0}, false, true, false, false, true}), [](Generator&) { return large_magnitude_rows(); }});
  entry("softmax_method_dim-1", "a.softmax(-1)", one([](X x) { return x[0].softmax(-1); }), {true},
        {reduce_samples({{-1}, false, true, false, false, true}), [](Generator&) { return large_magnitude_rows(); }});
  entry("log_softmax_dim1", "torch.log_softmax(a, 1)", one([](X x) { return log_softmax(x[0], 1); }), {true},
        {reduce_samples({{1}, false, true, false, false, true}), [](Generator&) { return large_magnitude_rows(); }});
  entry("log_softmax_dim0", "F.log_softmax(a, dim=0)", one([](X x) { return log_softmax(x[0], 0); }), {true},
        {reduce_samples({{0}, false, true, false, false, true}), [](Generator&) { return large_magnitude_rows(); }});
  entry("log_softmax_method_dim-1", "a.log_softmax(-1)", one([](X x) { return x[0].log_softmax(-1); }), {true},
        {reduce_samples({{-1}, false, true, false, false, true}), [](Generator&) { return large_magnitude_rows(); }});

  entry("logsumexp_dim1", "torch.logsumexp(a, 1)", one([](X x) { return logsumexp(x[0], 1); }), {true},
        {reduce_samples({{1}, false, true, false, false, true}), [](Generator&) { return large_magnitude_rows(); }});
  entry("logsumexp_dim0_keepdim", "torch.logsumexp(a, 0, keepdim=True)",
        one([](X x) { return logsumexp(x[0], 0, true); }), {true}, {reduce_samples({{0}, false, true, false, false, true})});

  // ---- layer_norm
  entry("layer_norm_affine", "F.layer_norm(a, [5], b, c)", one([](X x) { return layer_norm(x[0], {5}, x[1], x[2]); }),
        {true, true, true},
        {[](Generator& g) {
          return std::vector<Sample>{
              ok("[2, 3, 5]", {draw(g, {2, 3, 5}), draw(g, {5}), draw(g, {5})}),
              ok("1-D [5]", {draw(g, {5}), draw(g, {5}), draw(g, {5})}),
              ok("transposed [4, 5], strided weight, expanded bias",
                 {transposed(draw(g, {4, 5})), strided(draw(g, {5})), expanded(draw(g, {}), {5})}),
              ok("empty batch [0, 5]", {draw(g, {0, 5}), draw(g, {5}), draw(g, {5})}),
              nog("constant rows", {f64(std::vector<double>(10, 2.0), {2, 5}), draw(g, {5}), draw(g, {5})},
                  "zero variance: the finite differences are ill-conditioned (rstd = 1/sqrt(eps))"),
              nog("inf and NaN", {f64({1, 2, kInf, 3, 4, 1, kNaN, 2, 3, 4}, {2, 5}), draw(g, {5}), draw(g, {5})},
                  "non-finite inputs"),
              ok("float32", {draw(g, {3, 5}, Dom::Real, kFloat32), draw(g, {5}, Dom::Real, kFloat32),
                             draw(g, {5}, Dom::Real, kFloat32)}),
              err("input [2, 4] does not end in [5]", {draw(g, {2, 4}), draw(g, {5}), draw(g, {5})}),
              err("0-d input", {draw(g, {}), draw(g, {5}), draw(g, {5})}),
              err("weight [4]", {draw(g, {2, 5}), draw(g, {4}), draw(g, {5})}),
              err("bias [6]", {draw(g, {2, 5}), draw(g, {5}), draw(g, {6})})};
        }});
  entry("layer_norm_plain", "F.layer_norm(a, [5])", one([](X x) { return layer_norm(x[0], {5}); }), {true},
        {[](Generator& g) {
          return std::vector<Sample>{ok("[4, 5]", {draw(g, {4, 5})}), ok("[2, 3, 5]", {draw(g, {2, 3, 5})}),
                                     ok("strided [3, 5]", {strided(draw(g, {3, 5}))}),
                                     ok("expanded [1, 5] -> [3, 5]", {expanded(draw(g, {1, 5}), {3, 5})}),
                                     ok("float32", {draw(g, {2, 5}, Dom::Real, kFloat32)}),
                                     err("[5, 4]", {draw(g, {5, 4})})};
        }});
  entry("layer_norm_two_dims", "F.layer_norm(a, [3, 4], b, c)",
        one([](X x) { return layer_norm(x[0], {3, 4}, x[1], x[2]); }), {true, true, true},
        {[](Generator& g) {
          return std::vector<Sample>{
              ok("[2, 3, 4]", {draw(g, {2, 3, 4}), draw(g, {3, 4}), draw(g, {3, 4})}),
              ok("transposed weight", {draw(g, {2, 3, 4}), transposed(draw(g, {3, 4})), draw(g, {3, 4})}),
              err("[2, 4, 3]", {draw(g, {2, 4, 3}), draw(g, {3, 4}), draw(g, {3, 4})})};
        }});
  entry("layer_norm_eps", "F.layer_norm(a, [5], b, c, eps=0.1)",
        one([](X x) { return layer_norm(x[0], {5}, x[1], x[2], 0.1); }), {true, true, true},
        {[](Generator& g) {
          return std::vector<Sample>{ok("[3, 5]", {draw(g, {3, 5}), draw(g, {5}), draw(g, {5})}),
                                     ok("constant rows", {f64(std::vector<double>(10, -1.0), {2, 5}), draw(g, {5}), draw(g, {5})})};
        }});

  // ---- rms_norm (Llama's RMSNorm): the layer_norm kernels without centering or bias
  entry("rms_norm_weight", "rms_norm_ref(a, [5], b, 1e-6)",
        one([](X x) { return rms_norm(x[0], {5}, x[1], 1e-6); }), {true, true},
        {[](Generator& g) {
          return std::vector<Sample>{
              ok("[2, 3, 5]", {draw(g, {2, 3, 5}), draw(g, {5})}),
              ok("1-D [5]", {draw(g, {5}), draw(g, {5})}),
              ok("transposed [4, 5], strided weight", {transposed(draw(g, {4, 5})), strided(draw(g, {5}))}),
              ok("expanded weight", {draw(g, {3, 5}), expanded(draw(g, {}), {5})}),
              ok("empty batch [0, 5]", {draw(g, {0, 5}), draw(g, {5})}),
              ok("constant rows", {f64(std::vector<double>(10, 2.0), {2, 5}), draw(g, {5})}),
              nog("large and tiny magnitudes",
                  {f64({1e150, -2e150, 3e150, 4e150, -5e150, 1e-150, 2e-150, 3e-150, -4e-150, 5e-150}, {2, 5}),
                   draw(g, {5})},
                  "a finite-difference step cannot resolve rows of 1e150 or 1e-150"),
              nog("inf and NaN", {f64({1, 2, kInf, 3, 4, 1, kNaN, 2, 3, 4}, {2, 5}), draw(g, {5})}, "non-finite inputs"),
              nog("zero rows", {f64(std::vector<double>(10, 0.0), {2, 5}), draw(g, {5})},
                  "rstd = 1/sqrt(eps): the finite differences are ill-conditioned"),
              ok("float32", {draw(g, {3, 5}, Dom::Real, kFloat32), draw(g, {5}, Dom::Real, kFloat32)}),
              err("input [2, 4] does not end in [5]", {draw(g, {2, 4}), draw(g, {5})}),
              err("0-d input", {draw(g, {}), draw(g, {5})}),
              err("weight [4]", {draw(g, {2, 5}), draw(g, {4})})};
        }});
  entry("rms_norm_plain", "rms_norm_ref(a, [5])", one([](X x) { return rms_norm(x[0], {5}); }), {true},
        {[](Generator& g) {
          return std::vector<Sample>{ok("[4, 5]", {draw(g, {4, 5})}), ok("strided [3, 5]", {strided(draw(g, {3, 5}))}),
                                     ok("expanded [1, 5] -> [3, 5]", {expanded(draw(g, {1, 5}), {3, 5})}),
                                     ok("float32 (eps: float32's)", {draw(g, {2, 5}, Dom::Real, kFloat32)}),
                                     err("[5, 4]", {draw(g, {5, 4})})};
        }});
  entry("rms_norm_two_dims", "rms_norm_ref(a, [3, 4], b, 0.1)",
        one([](X x) { return rms_norm(x[0], {3, 4}, x[1], 0.1); }), {true, true},
        {[](Generator& g) {
          return std::vector<Sample>{ok("[2, 3, 4]", {draw(g, {2, 3, 4}), draw(g, {3, 4})}),
                                     ok("transposed weight", {draw(g, {2, 3, 4}), transposed(draw(g, {3, 4}))}),
                                     err("[2, 4, 3]", {draw(g, {2, 4, 3}), draw(g, {3, 4})})};
        }});

  // ---- rotary_embedding: cos and sin are tables (no gradient), drawn as angles' cosines and sines
  auto angles = [](Generator& g, const Shape& s, DType dt = kFloat64) {
    Tensor a = rand(s, kFloat64, &g), c = empty(s, kFloat64), sn = empty(s, kFloat64);
    for (int64_t i = 0; i < a.numel(); ++i) {
      c.data_ptr<double>()[i] = std::cos(6.283185307179586 * a.data_ptr<double>()[i]);
      sn.data_ptr<double>()[i] = std::sin(6.283185307179586 * a.data_ptr<double>()[i]);
    }
    return std::pair<Tensor, Tensor>{c.to(dt), sn.to(dt)};
  };
  entry("rotary_embedding", "rope_ref(a, b, c)", one([](X x) { return rotary_embedding(x[0], x[1], x[2]); }),
        {true, false, false},
        {[angles](Generator& g) {
          auto [c4, s4] = angles(g, {4, 3});
          auto [c1, s1] = angles(g, {3});
          auto [cb, sb] = angles(g, {2, 1, 4, 3});
          auto [c0, s0] = angles(g, {0});
          auto [cf, sf] = angles(g, {4, 3}, kFloat32);
          auto [cw, sw] = angles(g, {4, 2});
          return std::vector<Sample>{
              ok("x [2, 2, 4, 6], tables [4, 3] (positions x pairs)", {draw(g, {2, 2, 4, 6}), c4, s4}),
              ok("x [6], tables [3]", {draw(g, {6}), c1, s1}),
              ok("tables per batch [2, 1, 4, 3]", {draw(g, {2, 2, 4, 6}), cb, sb}),
              ok("x [B, T, H, D] viewed as [B, H, T, D] (heads of a projection)", {draw(g, {2, 4, 2, 6}).transpose(1, 2), c4, s4}),
              ok("strided x", {strided(draw(g, {4, 6})), c4, s4}),
              ok("expanded x", {expanded(draw(g, {1, 6}), {4, 6}), c4, s4}),
              ok("transposed tables", {draw(g, {4, 6}), transposed(c4), transposed(s4)}),
              ok("empty: no positions", {draw(g, {2, 0, 6}), angles(g, {0, 3}).first, angles(g, {0, 3}).second}),
              ok("empty: D = 0", {draw(g, {2, 0}), c0, s0}),
              nog("large magnitudes", {mul(draw(g, {4, 6}), 1e150), c4, s4},
                  "a finite-difference step cannot move values of 1e150"),
              nog("inf and NaN", {f64({1, kInf, 3, 4, kNaN, 6}, {1, 6}), c1, s1}, "non-finite inputs"),
              ok("float32", {draw(g, {4, 6}, Dom::Real, kFloat32), cf, sf}),
              err("odd last dim [4, 5]", {draw(g, {4, 5}), c4, s4}),
              err("tables [4, 2] for 6 = 2 x 3", {draw(g, {4, 6}), cw, sw}),
              err("tables that do not broadcast [4, 3] to x [5, 6]", {draw(g, {5, 6}), c4, s4}),
              err("0-d x", {draw(g, {}), c1, s1}),
              err("float32 tables for float64 x", {draw(g, {4, 6}), cf, sf})};
        }});
}

// The rows of matmul and linear.
void add_linear_algebra_rows(std::vector<OpInfo>& t) {
  const Entry entry{t};
  // ---- matmul and linear
  entry("matmul", "torch.matmul(a, b)", one([](X x) { return matmul(x[0], x[1]); }), {true, true},
        {[](Generator& g) {
          return std::vector<Sample>{
              ok("[3, 4] @ [4, 5]", {draw(g, {3, 4}), draw(g, {4, 5})}),
              ok("dot [4] @ [4]", {draw(g, {4}), draw(g, {4})}),
              ok("[3, 4] @ [4]", {draw(g, {3, 4}), draw(g, {4})}),
              ok("[4] @ [4, 5]", {draw(g, {4}), draw(g, {4, 5})}),
              ok("batched [2, 3, 4] @ [2, 4, 5]", {draw(g, {2, 3, 4}), draw(g, {2, 4, 5})}),
              ok("broadcast [2, 3, 4] @ [4, 5]", {draw(g, {2, 3, 4}), draw(g, {4, 5})}),
              ok("broadcast batch [2, 1, 3, 4] @ [3, 4, 2]", {draw(g, {2, 1, 3, 4}), draw(g, {3, 4, 2})}),
              ok("[4] @ [2, 4, 3]", {draw(g, {4}), draw(g, {2, 4, 3})}),
              ok("[2, 3, 4] @ [4]", {draw(g, {2, 3, 4}), draw(g, {4})}),
              ok("transposed [3, 4] @ strided [4, 5]", {transposed(draw(g, {3, 4})), strided(draw(g, {4, 5}))}),
              ok("transposed batched", {transposed(draw(g, {2, 3, 4})), transposed(draw(g, {2, 4, 5}))}),
              ok("expanded batch [1, 3, 4] -> [2, 3, 4] @ [2, 4, 2]",
                 {expanded(draw(g, {1, 3, 4}), {2, 3, 4}), draw(g, {2, 4, 2})}),
              ok("K = 0: [3, 0] @ [0, 2]", {draw(g, {3, 0}), draw(g, {0, 2})}),
              ok("M = 0: [0, 4] @ [4, 2]", {draw(g, {0, 4}), draw(g, {4, 2})}),
              ok("empty batch [0, 3, 4] @ [4, 5]", {draw(g, {0, 3, 4}), draw(g, {4, 5})}),
              nog("inf and NaN", {f64({1, kInf, 0, 2}, {2, 2}), f64({kNaN, 1, 0, 1}, {2, 2})}, "non-finite inputs"),
              ok("float32 [3, 4] @ [4, 2]", {draw(g, {3, 4}, Dom::Real, kFloat32), draw(g, {4, 2}, Dom::Real, kFloat32)}),
              err("inner dims differ: [3, 4] @ [5, 2]", {draw(g, {3, 4}), draw(g, {5, 2})}),
              err("dot of [3] and [4]", {draw(g, {3}), draw(g, {4})}),
              err("0-d operand", {draw(g, {}), draw(g, {3})}),
              err("batch dims do not broadcast: [2, 3, 4] @ [3, 4, 5]", {draw(g, {2, 3, 4}), draw(g, {3, 4, 5})})};
        }});
  entry("matmul_method", "a.matmul(b)", one([](X x) { return x[0].matmul(x[1]); }), {true, true},
        {[](Generator& g) {
          return std::vector<Sample>{ok("[2, 3] @ [3, 2]", {draw(g, {2, 3}), draw(g, {3, 2})}),
                                     ok("[2, 2, 3] @ [3]", {draw(g, {2, 2, 3}), draw(g, {3})})};
        }});
  entry("linear", "F.linear(a, b, c)", one([](X x) { return linear(x[0], x[1], x[2]); }), {true, true, true},
        {[](Generator& g) {
          return std::vector<Sample>{
              ok("[2, 3, 4], weight [5, 4]", {draw(g, {2, 3, 4}), draw(g, {5, 4}), draw(g, {5})}),
              ok("1-D input [4]", {draw(g, {4}), draw(g, {5, 4}), draw(g, {5})}),
              ok("transposed input and weight", {transposed(draw(g, {3, 4})), transposed(draw(g, {5, 4})), draw(g, {5})}),
              ok("strided bias, expanded input", {expanded(draw(g, {1, 4}), {3, 4}), draw(g, {2, 4}), strided(draw(g, {2}))}),
              ok("empty batch [0, 4]", {draw(g, {0, 4}), draw(g, {3, 4}), draw(g, {3})}),
              ok("in_features 0", {draw(g, {2, 0}), draw(g, {3, 0}), draw(g, {3})}),
              ok("float32", {draw(g, {2, 4}, Dom::Real, kFloat32), draw(g, {3, 4}, Dom::Real, kFloat32),
                             draw(g, {3}, Dom::Real, kFloat32)}),
              err("input [2, 4], weight [5, 3]", {draw(g, {2, 4}), draw(g, {5, 3}), draw(g, {5})}),
              err("bias [4] for 5 outputs", {draw(g, {2, 3}), draw(g, {5, 3}), draw(g, {4})}),
              err("0-d input", {draw(g, {}), draw(g, {5, 3}), draw(g, {5})})};
        }});
  entry("linear_no_bias", "F.linear(a, b)", one([](X x) { return linear(x[0], x[1]); }), {true, true},
        {[](Generator& g) {
          return std::vector<Sample>{ok("[3, 4], weight [5, 4]", {draw(g, {3, 4}), draw(g, {5, 4})}),
                                     ok("[2, 2, 3], weight [1, 3]", {draw(g, {2, 2, 3}), draw(g, {1, 3})}),
                                     ok("empty output features: weight [0, 4]", {draw(g, {3, 4}), draw(g, {0, 4})}),
                                     err("input [3, 4], weight [5, 3]", {draw(g, {3, 4}), draw(g, {5, 3})})};
        }});
}

// The rows of views and copies, indexing, joining and splitting.
void add_shape_rows(std::vector<OpInfo>& t) {
  const Entry entry{t};
  // ---- views and copies
  auto never = Pred([](const Tensor&) { return false; });
  entry("view_flat", "a.view(-1)", one([](X x) { return view(x[0], {-1}); }), {true},
        {shape_samples([](const Tensor& x) { return !flat_viewable(x); })});
  entry("reshape_flat", "a.reshape(-1)", one([](X x) { return reshape(x[0], {-1}); }), {true}, {shape_samples(never)});
  entry("reshape_2_-1", "a.reshape(2, -1)", one([](X x) { return x[0].reshape({2, -1}); }), {true},
        {shape_samples([](const Tensor& x) { return x.numel() % 2 != 0; })});
  entry("transpose_0_1", "a.transpose(0, 1)", one([](X x) { return transpose(x[0], 0, 1); }), {true},
        {shape_samples(rank_lt(2))});
  entry("transpose_-1_0", "a.transpose(-1, 0)", one([](X x) { return x[0].transpose(-1, 0); }), {true},
        {shape_samples(never)});
  entry("t", "a.t()", one([](X x) { return x[0].t(); }), {true},
        {shape_samples([](const Tensor& x) { return x.dim() > 2; })});
  entry("permute_1_0", "a.permute(1, 0)", one([](X x) { return permute(x[0], {1, 0}); }), {true},
        {shape_samples([](const Tensor& x) { return x.dim() != 2; })});
  entry("permute_2_0_1", "a.permute(2, 0, 1)", one([](X x) { return x[0].permute({2, 0, 1}); }), {true},
        {shape_samples([](const Tensor& x) { return x.dim() != 3; })});
  entry("slice_dim0_step2", "a[1:5:2]", one([](X x) { return slice(x[0], 0, 1, 5, 2); }), {true},
        {shape_samples(rank_lt(1))});
  entry("slice_dim1_negative_start", "a[:, -3:]", one([](X x) { return x[0].slice(1, -3, kEnd); }), {true},
        {shape_samples(rank_lt(2))});
  entry("slice_dim1_empty", "a[:, 5:2]", one([](X x) { return slice(x[0], 1, 5, 2); }), {true},
        {shape_samples(rank_lt(2))});
  entry("select_dim0_2", "a.select(0, 2)", one([](X x) { return select(x[0], 0, 2); }), {true},
        {shape_samples([](const Tensor& x) { return x.dim() == 0 || x.size(0) <= 2; })});
  entry("select_dim1_-1", "a.select(1, -1)", one([](X x) { return x[0].select(1, -1); }), {true},
        {shape_samples([](const Tensor& x) { return x.dim() < 2 || x.size(1) == 0; })});
  entry("narrow_dim1", "a.narrow(1, 1, 2)", one([](X x) { return x[0].narrow(1, 1, 2); }), {true},
        {shape_samples([](const Tensor& x) { return x.dim() < 2 || x.size(1) < 3; })});
  entry("narrow_negative_start", "a.narrow(-1, -2, 2)", one([](X x) { return x[0].narrow(-1, -2, 2); }), {true},
        {shape_samples([](const Tensor& x) { return x.dim() == 0 || x.size(x.dim() - 1) < 2; })});
  entry("expand_2_3_4", "a.expand(2, 3, 4)", one([](X x) { return expand(x[0], {2, 3, 4}); }), {true},
        {shape_samples([](const Tensor& x) { return expand_fails(x.sizes(), {2, 3, 4}); })});
  entry("expand_keep_-1", "a.expand(-1, 4)", one([](X x) { return x[0].expand({-1, 4}); }), {true},
        {shape_samples([](const Tensor& x) { return expand_fails(x.sizes(), {-1, 4}); })});
  entry("expand_as", "a.expand_as(b)", one([](X x) { return x[0].expand_as(x[1]); }), {true, false},
        {[](Generator& g) {
          return std::vector<Sample>{ok("[3, 1] as [3, 4]", {draw(g, {3, 1}), draw(g, {3, 4})}),
                                     ok("0-d as [2, 3]", {draw(g, {}), draw(g, {2, 3})}),
                                     ok("[4] as [2, 3, 4]", {draw(g, {4}), draw(g, {2, 3, 4})}),
                                     err("[2, 3] as [3, 3]", {draw(g, {2, 3}), draw(g, {3, 3})})};
        }});
  entry("unfold_dim0_2_1", "a.unfold(0, 2, 1)", one([](X x) { return unfold(x[0], 0, 2, 1); }), {true},
        {shape_samples(unfold_error(0, 2))});
  entry("unfold_dim-1_2_2", "a.unfold(-1, 2, 2)", one([](X x) { return x[0].unfold(-1, 2, 2); }), {true},
        {shape_samples(unfold_error(-1, 2))});
  entry("unfold_dim1_3_1_overlapping", "a.unfold(1, 3, 1)", one([](X x) { return unfold(x[0], 1, 3, 1); }), {true},
        {shape_samples(unfold_error(1, 3))});
  entry("unfold_dim0_1_3", "a.unfold(0, 1, 3)", one([](X x) { return unfold(x[0], 0, 1, 3); }), {true},
        {shape_samples(unfold_error(0, 1))});
  entry("squeeze_all", "a.squeeze()", one([](X x) { return squeeze(x[0]); }), {true}, {shape_samples(never)});
  entry("squeeze_dim1", "a.squeeze(1)", one([](X x) { return squeeze(x[0], 1); }), {true},
        {shape_samples(rank_lt(2))});
  entry("squeeze_dim-1", "a.squeeze(-1)", one([](X x) { return x[0].squeeze(-1); }), {true}, {shape_samples(never)});
  entry("unsqueeze_0", "a.unsqueeze(0)", one([](X x) { return unsqueeze(x[0], 0); }), {true}, {shape_samples(never)});
  entry("unsqueeze_-1", "a.unsqueeze(-1)", one([](X x) { return x[0].unsqueeze(-1); }), {true},
        {shape_samples(never)});
  entry("unsqueeze_2", "a.unsqueeze(2)", one([](X x) { return unsqueeze(x[0], 2); }), {true},
        {shape_samples(rank_lt(2))});
  entry("flatten_all", "a.flatten()", one([](X x) { return x[0].flatten(); }), {true}, {shape_samples(never)});
  entry("flatten_from_1", "a.flatten(1)", one([](X x) { return x[0].flatten(1); }), {true},
        {shape_samples(rank_lt(2))});
  entry("flatten_0_1", "a.flatten(0, 1)", one([](X x) { return x[0].flatten(0, 1); }), {true},
        {shape_samples(rank_lt(2))});
  entry("contiguous", "a.contiguous()", one([](X x) { return contiguous(x[0]); }), {true},
        {shape_samples(never, false)});
  entry("clone", "a.clone()", one([](X x) { return clone(x[0]); }), {true}, {shape_samples(never, false)});
  entry("to_float32", "a.to(torch.float32)", one([](X x) { return to(x[0], kFloat32); }), {true},
        {shape_samples(never, false)});
  entry("to_float64", "a.to(torch.float64)", one([](X x) { return x[0].to(kFloat64); }), {true},
        {shape_samples(never, false)});
  entry("to_int64", "a.to(torch.int64)", one([](X x) { return to(x[0], kInt64); }), {}, {shape_samples(never)});
  entry("to_bool", "a.to(torch.bool)", one([](X x) { return to(x[0], kBool); }), {}, {shape_samples(never, false)});

  // ---- indexing
  entry("index_select_dim0", "torch.index_select(a, 0, b)", one([](X x) { return index_select(x[0], 0, x[1]); }),
        {true, false}, {index_select_samples(0)});
  entry("index_select_dim1", "torch.index_select(a, 1, b)", one([](X x) { return index_select(x[0], 1, x[1]); }),
        {true, false}, {index_select_samples(1)});
  entry("index_select_dim-1", "a.index_select(-1, b)", one([](X x) { return index_select(x[0], -1, x[1]); }),
        {true, false}, {index_select_samples(-1)});
  entry("gather_dim1", "torch.gather(a, 1, b)", one([](X x) { return gather(x[0], 1, x[1]); }), {true, false},
        {gather_samples(1)});
  entry("gather_dim0", "torch.gather(a, 0, b)", one([](X x) { return gather(x[0], 0, x[1]); }), {true, false},
        {gather_samples(0)});
  entry("gather_dim-1", "a.gather(-1, b)", one([](X x) { return gather(x[0], -1, x[1]); }), {true, false},
        {gather_samples(-1)});
  entry("scatter_dim0", "torch.scatter(a, 0, b, c)", one([](X x) { return scatter(x[0], 0, x[1], x[2]); }),
        {true, false, true}, {scatter_samples(0, false)});
  entry("scatter_dim-1", "a.scatter(-1, b, c)", one([](X x) { return x[0].scatter(-1, x[1], x[2]); }),
        {true, false, true}, {scatter_samples(-1, false)});
  entry("scatter_value", "a.scatter(1, b, 2.5)", one([](X x) { return scatter(x[0], 1, x[1], 2.5); }), {true, false},
        {[](Generator& g) {
          return std::vector<Sample>{
              ok("[3, 4], index [3, 2]", {draw(g, {3, 4}), distinct_index(g, {3, 4}, {3, 2}, 1)}),
              ok("repeated indices", {draw(g, {3, 4}), zeros({2, 3}, kInt64)}),
              ok("empty index", {draw(g, {3, 4}), i64({}, {3, 0})}),
              err("index 4", {draw(g, {3, 4}), i64({4}, {1, 1})})};
        }});
  entry("scatter_add_dim0", "torch.scatter_add(a, 0, b, c)",
        one([](X x) { return scatter_add(x[0], 0, x[1], x[2]); }), {true, false, true}, {scatter_samples(0, true)});
  entry("scatter_add_dim1", "a.scatter_add(1, b, c)", one([](X x) { return x[0].scatter_add(1, x[1], x[2]); }),
        {true, false, true}, {scatter_samples(1, true)});
  auto embedding_samples = [](Generator& g) {
    return std::vector<Sample>{
        ok("weight [5, 3], ids [2, 3]", {draw(g, {5, 3}), ints(g, 0, 5, {2, 3})}),
        ok("0-d ids", {draw(g, {5, 3}), i64({1}, {})}),
        ok("empty ids [0]", {draw(g, {5, 3}), i64({}, {0})}),
        ok("ids [4] with repeats", {draw(g, {5, 3}), i64({1, 1, 4, 1}, {4})}),
        ok("transposed ids", {draw(g, {5, 3}), transposed(ints(g, 0, 5, {3, 2}))}),
        ok("transposed weight", {transposed(draw(g, {5, 3})), ints(g, 0, 5, {4})}),
        ok("strided weight", {strided(draw(g, {5, 3})), ints(g, 0, 5, {2, 2})}),
        ok("float32 weight", {draw(g, {5, 3}, Dom::Real, kFloat32), ints(g, 0, 5, {3})}),
        err("id 5 out of range", {draw(g, {5, 3}), i64({0, 5}, {2})}),
        err("id -1", {draw(g, {5, 3}), i64({-1}, {1})}),
        err("1-D weight", {draw(g, {5}), i64({0, 1}, {2})}),
        err("float ids", {draw(g, {5, 3}), draw(g, {2})})};
  };
  entry("embedding", "F.embedding(b, a)", one([](X x) { return embedding(x[0], x[1]); }), {true, false},
        {embedding_samples});
  entry("embedding_padding_idx", "F.embedding(b, a, padding_idx=1)", one([](X x) { return embedding(x[0], x[1], 1); }),
        {true, false}, {[embedding_samples](Generator& g) {
          std::vector<Sample> s = embedding_samples(g);
          for (Sample& x : s)
            if (!x.expect_error) x.no_gradcheck = "the padding_idx row gets no gradient by definition";
          return s;
        }});

  // ---- joining and splitting (L: every input, as a list)
  auto cat_samples = [](int64_t dim) {
    return SampleFn([dim](Generator& g) {
      std::vector<std::pair<std::string, TensorList>> c = {
          {"[2, 3] and [2, 3]", {draw(g, {2, 3}), draw(g, {2, 3})}},
          {"[2, 3] and [1, 3]", {draw(g, {2, 3}), draw(g, {1, 3})}},
          {"[2, 3] and [2, 1]", {draw(g, {2, 3}), draw(g, {2, 1})}},
          {"[2, 3], empty [0, 3], [4, 3]", {draw(g, {2, 3}), draw(g, {0, 3}), draw(g, {4, 3})}},
          {"[2, 0] and [2, 2]", {draw(g, {2, 0}), draw(g, {2, 2})}},
          {"one tensor [2, 3]", {draw(g, {2, 3})}},
          {"1-D [3] and [2]", {draw(g, {3}), draw(g, {2})}},
          {"[2, 3, 1] and [2, 3, 2]", {draw(g, {2, 3, 1}), draw(g, {2, 3, 2})}},
          {"transposed and strided [3, 3]", {transposed(draw(g, {3, 3})), strided(draw(g, {3, 3}))}},
          {"expanded [1, 3] -> [2, 3] and [2, 3]", {expanded(draw(g, {1, 3}), {2, 3}), draw(g, {2, 3})}},
          {"float32", {draw(g, {2, 2}, Dom::Real, kFloat32), draw(g, {2, 2}, Dom::Real, kFloat32)}},
          {"int64", {i64({1, 2, 3, 4}, {2, 2}), i64({5, 6}, {1, 2})}},
          {"0-d tensors", {draw(g, {}), draw(g, {})}},
          {"[2, 3] and 1-D [3]", {draw(g, {2, 3}), draw(g, {3})}},
          {"no tensors", {}},
      };
      std::vector<Sample> s;
      for (auto& [desc, in] : c) {
        // PyTorch: a non-empty list; no 0-d tensors; equal ranks; dim in range; equal sizes off dim.
        bool e = in.empty();
        if (!e) {
          const int64_t r = in[0].dim();
          e = r == 0 || !dim_ok(dim, r);
          for (const Tensor& x : in) e = e || x.dim() != r;
          if (!e) {
            const int64_t w = wrapped(dim, r);
            for (const Tensor& x : in)
              for (int64_t d = 0; d < r; ++d) e = e || (d != w && x.size(d) != in[0].size(d));
          }
        }
        s.push_back(flag(desc, in, e));
      }
      return s;
    });
  };
  entry("cat_dim0", "torch.cat(L, 0)", [](X x) { return TensorList{cat(x, 0)}; }, {true, true, true},
        {cat_samples(0)});
  entry("cat_dim1", "torch.cat(L, dim=1)", [](X x) { return TensorList{cat(x, 1)}; }, {true, true, true},
        {cat_samples(1)});
  entry("cat_dim-1", "torch.cat(L, -1)", [](X x) { return TensorList{cat(x, -1)}; }, {true, true, true},
        {cat_samples(-1)});
  auto stack_samples = [](int64_t dim) {
    return SampleFn([dim](Generator& g) {
      std::vector<std::pair<std::string, TensorList>> c = {
          {"two [2, 3]", {draw(g, {2, 3}), draw(g, {2, 3})}},
          {"three 0-d", {draw(g, {}), draw(g, {}), draw(g, {})}},
          {"two 1-D [4]", {draw(g, {4}), draw(g, {4})}},
          {"two empty [0, 3]", {draw(g, {0, 3}), draw(g, {0, 3})}},
          {"one [2, 2]", {draw(g, {2, 2})}},
          {"transposed, strided and expanded [3, 3]",
           {transposed(draw(g, {3, 3})), strided(draw(g, {3, 3})), expanded(draw(g, {3, 1}), {3, 3})}},
          {"float32", {draw(g, {2}, Dom::Real, kFloat32), draw(g, {2}, Dom::Real, kFloat32)}},
          {"int64", {i64({1, 2}, {2}), i64({3, 4}, {2})}},
          {"[2, 3] and [2, 4]", {draw(g, {2, 3}), draw(g, {2, 4})}},
          {"no tensors", {}},
      };
      std::vector<Sample> s;
      for (auto& [desc, in] : c) {
        bool e = in.empty() || !dim_ok(dim, in[0].dim() + 1);
        for (const Tensor& x : in) e = e || x.sizes() != in[0].sizes();
        s.push_back(flag(desc, in, e));
      }
      return s;
    });
  };
  entry("stack_dim0", "torch.stack(L, 0)", [](X x) { return TensorList{stack(x, 0)}; }, {true, true, true},
        {stack_samples(0)});
  entry("stack_dim2", "torch.stack(L, 2)", [](X x) { return TensorList{stack(x, 2)}; }, {true, true, true},
        {stack_samples(2)});
  entry("stack_dim-1", "torch.stack(L, dim=-1)", [](X x) { return TensorList{stack(x, -1)}; }, {true, true, true},
        {stack_samples(-1)});
  // split(size, dim) and chunk(n, dim): PyTorch raises for 0-d inputs, dims out of range, split
  // size 0 on a non-empty dim and chunks <= 0.
  auto split_samples = [](int64_t dim, int64_t size_or_chunks) {
    return SampleFn([dim, size_or_chunks](Generator& g) {
      std::vector<std::pair<std::string, Tensor>> c = {
          {"[5, 2]", draw(g, {5, 2})},
          {"[6, 3]", draw(g, {6, 3})},
          {"[2, 2]", draw(g, {2, 2})},
          {"[3, 7]", draw(g, {3, 7})},
          {"[1, 4]", draw(g, {1, 4})},
          {"1-D [5]", draw(g, {5})},
          {"empty [0, 2]", draw(g, {0, 2})},
          {"empty [3, 0]", draw(g, {3, 0})},
          {"transposed [5, 3]", transposed(draw(g, {5, 3}))},
          {"expanded [1, 4] -> [5, 4]", expanded(draw(g, {1, 4}), {5, 4})},
          {"float32 [4, 2]", draw(g, {4, 2}, Dom::Real, kFloat32)},
          {"int64 [3, 2]", i64({1, 2, 3, 4, 5, 6}, {3, 2})},
          {"0-d", draw(g, {})},
      };
      std::vector<Sample> s;
      for (auto& [desc, x] : c) {
        bool e = x.dim() == 0 || !dim_ok(dim, x.dim()) || size_or_chunks < 0 ||
                 (size_or_chunks == 0 && x.size(wrapped(dim, x.dim())) != 0);
        s.push_back(flag(desc, {x}, e));
      }
      return s;
    });
  };
  // (chunk with 0 chunks raises even on an empty dim: encoded as size_or_chunks = -1 below.)
  entry("split_2", "torch.split(a, 2)", [](X x) { return split(x[0], 2); }, {true}, {split_samples(0, 2)});
  entry("split_2_dim1", "torch.split(a, 2, dim=1)", [](X x) { return split(x[0], 2, 1); }, {true},
        {split_samples(1, 2)});
  entry("split_3_dim-1", "a.split(3, -1)", [](X x) { return split(x[0], 3, -1); }, {true}, {split_samples(-1, 3)});
  entry("split_0", "torch.split(a, 0)", [](X x) { return split(x[0], 0); }, {true}, {split_samples(0, 0)});
  entry("chunk_3", "torch.chunk(a, 3)", [](X x) { return chunk(x[0], 3); }, {true}, {split_samples(0, 3)});
  entry("chunk_2_dim1", "torch.chunk(a, 2, dim=1)", [](X x) { return chunk(x[0], 2, 1); }, {true},
        {split_samples(1, 2)});
  entry("chunk_4_dim-1", "a.chunk(4, -1)", [](X x) { return chunk(x[0], 4, -1); }, {true}, {split_samples(-1, 4)});
  entry("chunk_0", "torch.chunk(a, 0)", [](X x) { return chunk(x[0], 0); }, {true}, {split_samples(0, -1)});
}

// The rows of scaled_dot_product_attention and cross_entropy.
void add_nn_rows(std::vector<OpInfo>& t) {
  const Entry entry{t};
  // ---- scaled_dot_product_attention (inputs q, k, v and, where named, the mask d: true = attend,
  // as PyTorch's; sdpa_masked_out reads the same samples with the opposite meaning). The
  // reference is the composite tapestry defines it as (sdpa_ref in the reference script):
  // softmax(scale q k^T with masked scores set to -1e9) v, so a fully masked row attends evenly.
  // The samples cross the CPU kernel's 64-row and 128-key blocks, and hold inf and NaN.
  auto sdpa_samples = [](bool with_mask) {
    return SampleFn([with_mask](Generator& g) {
      // q [lead..., tq, e], k [lead..., tk, e], v [lead..., tk, ev], and a mask when asked for.
      auto qkv = [&g, with_mask](const Shape& lead, int64_t tq, int64_t tk, int64_t e, int64_t ev, Shape mask_shape,
                                 DType dt = kFloat64) {
        auto with = [&lead](std::vector<int64_t> tail) {
          Shape s = lead;
          s.insert(s.end(), tail.begin(), tail.end());
          return s;
        };
        TensorList in = {draw(g, with({tq, e}), Dom::Real, dt), draw(g, with({tk, e}), Dom::Real, dt),
                         draw(g, with({tk, ev}), Dom::Real, dt)};
        if (with_mask) in.push_back(mask(g, mask_shape));
        return in;
      };
      std::vector<Sample> s = {
          ok("[2, 3, 4] x 5 keys, ev 3", qkv({2}, 3, 5, 4, 3, {3, 5})),
          ok("[2, 2, 3, 4] heads, padding mask [2, 1, 1, 5]", qkv({2, 2}, 3, 5, 4, 4, {2, 1, 1, 5})),
          ok("[4, 4] without leading dims", qkv({}, 4, 4, 4, 2, {4, 4})),
          ok("one query, one key", qkv({1}, 1, 1, 3, 3, {1, 1})),
          ok("float32", qkv({2, 2}, 5, 6, 8, 8, {2, 1, 5, 6}, kFloat32)),
          nog("70 queries x 130 keys (more than one kernel block)", qkv({1}, 70, 130, 3, 2, {70, 130}),
              "large: the smaller samples gradcheck the same code"),
          ok("empty: no queries", qkv({2}, 0, 4, 3, 3, {0, 4})),
          ok("empty: no keys", qkv({2}, 3, 0, 3, 3, {3, 0})),
          ok("empty: no batch", qkv({0}, 3, 4, 3, 3, {3, 4})),
          ok("no features (e = 0)", qkv({2}, 3, 4, 0, 3, {3, 4})),
      };
      {  // the heads of a projection: [B, T, H, E] viewed as [B, H, T, E]; v expanded over its keys
        Tensor q = draw(g, {2, 3, 2, 4}).transpose(1, 2), k = transposed(draw(g, {2, 2, 5, 4}));
        Tensor v = expanded(draw(g, {2, 2, 1, 3}), {2, 2, 5, 3});
        TensorList in = {q, k, strided(v.contiguous())};
        if (with_mask) in.push_back(transposed(mask(g, {2, 1, 3, 5})));
        s.push_back(ok("permuted q, transposed k, strided v, transposed mask", in));
        TensorList ex = {draw(g, {2, 3, 4}), expanded(draw(g, {2, 1, 4}), {2, 5, 4}), v.select(1, 0)};
        if (with_mask) ex.push_back(mask(g, {5}));
        s.push_back(ok("k and v expanded over their keys", ex));
      }
      {  // a query whose every key is masked (with a mask), inf and NaN in the inputs
        TensorList in = qkv({1}, 3, 4, 2, 2, {3, 4});
        if (with_mask) in[3] = b8({0, 0, 0, 0, 1, 0, 1, 0, 1, 1, 0, 1}, {3, 4});  // true = attend
        s.push_back(ok("every key of query 0 masked", in));
        TensorList bad = qkv({1}, 3, 4, 2, 2, {3, 4});
        bad[0] = f64({0.5, -1.0, kNaN, 1.0, 2.0, 0.25}, {1, 3, 2});
        bad[2] = f64({1.0, kInf, 0.5, 2.0, -1.0, 0.0, 3.0, 1.0}, {1, 4, 2});
        s.push_back(nog("NaN in q, inf in v", bad, "non-finite inputs"));
      }
      s.push_back(err("q and k with different features", {draw(g, {2, 3, 4}), draw(g, {2, 5, 3}), draw(g, {2, 5, 3})}));
      s.push_back(err("k and v with different keys", {draw(g, {2, 3, 4}), draw(g, {2, 5, 4}), draw(g, {2, 6, 4})}));
      if (with_mask) {
        s.push_back(err("mask [4] for 5 keys", {draw(g, {2, 3, 4}), draw(g, {2, 5, 4}), draw(g, {2, 5, 4}), mask(g, {4})}));
        s.push_back(err("a float mask", {draw(g, {2, 3, 4}), draw(g, {2, 5, 4}), draw(g, {2, 5, 4}), draw(g, {3, 5})}));
      }
      return s;
    });
  };
  entry("sdpa", "sdpa_ref(a, b, c)", one([](X x) { return scaled_dot_product_attention(x[0], x[1], x[2]); }),
        {true, true, true}, {sdpa_samples(false)});
  entry("sdpa_mask", "sdpa_ref(a, b, c, d)",
        one([](X x) { return scaled_dot_product_attention(x[0], x[1], x[2], input_or_none(x, 3)); }), {true, true, true, false},
        {sdpa_samples(true)});
  entry("sdpa_masked_out", "sdpa_ref(a, b, c, ~d)",
        one([](X x) { return scaled_dot_product_attention_masked_out(x[0], x[1], x[2], input_or_none(x, 3)); }),
        {true, true, true, false}, {sdpa_samples(true)});
  entry("sdpa_causal", "sdpa_ref(a, b, c, is_causal=True)",
        one([](X x) { return scaled_dot_product_attention(x[0], x[1], x[2], Tensor(), true); }), {true, true, true},
        {sdpa_samples(false)});
  entry("sdpa_causal_mask_scale", "sdpa_ref(a, b, c, d, is_causal=True, scale=0.3)",
        one([](X x) { return scaled_dot_product_attention(x[0], x[1], x[2], input_or_none(x, 3), true, 0.0, 0.3); }),
        {true, true, true, false}, {sdpa_samples(true)});

  // ---- cross_entropy. paper_ce (defined in the reference) is the label smoothing tapestry
  // implements: 1 - eps on the gold class, eps spread over the others except ignore_index.
  auto ce_samples = [](std::vector<int64_t> special_targets) {
    return SampleFn([special_targets](Generator& g) {
      std::vector<Sample> s = {
          ok("[4, 5]", {draw(g, {4, 5}), ints(g, 0, 5, {4})}),
          ok("[1, 3]", {draw(g, {1, 3}), ints(g, 0, 3, {1})}),
          ok("targets with 0s and 2s", {draw(g, {4, 5}), i64(special_targets, {4})}),
          ok("transposed logits", {transposed(draw(g, {6, 4})), ints(g, 0, 4, {6})}),
          ok("strided logits, strided targets", {strided(draw(g, {3, 5})), strided(ints(g, 0, 5, {3}))}),
          ok("expanded logits [1, 5] -> [3, 5]", {expanded(draw(g, {1, 5}), {3, 5}), ints(g, 0, 5, {3})}),
          ok("large logits", {f64({1000, 1001, -1000, 0, 999, 998}, {2, 3}), i64({0, 2}, {2})}),
          nog("float64 logits at 1e300", {f64({1e300, 1e300, -1e300, 1e300, 1e300, 1e300}, {2, 3}), i64({0, 2}, {2})},
              "large magnitudes: a finite difference vanishes in their rounding"),
          nog("float32 logits near 1e4", {f64({1e4, 1e4 + 1, 1e4 - 2, 1e4 + 0.5, 1e4, 1e4 - 1}, {2, 3}).to(kFloat32),
                                          i64({0, 2}, {2})}, "large magnitudes: a finite difference vanishes in their rounding"),
          nog("float64 rows masked with -1e9", {f64({-1e9, -1e9 + 0.25, -1e9 - 0.5, -1e9, 0.5, -1e9}, {2, 3}),
                                                i64({1, 0}, {2})}, "large magnitudes: a finite difference vanishes in their rounding"),
          ok("float32", {draw(g, {4, 5}, Dom::Real, kFloat32), ints(g, 0, 5, {4})}),
          err("target 5 of 5 classes", {draw(g, {2, 5}), i64({1, 5}, {2})}),
          err("target -1", {draw(g, {2, 5}), i64({1, -1}, {2})}),
          err("3 targets for 2 rows", {draw(g, {2, 5}), i64({1, 2, 3}, {3})}),
      };
      return s;
    });
  };
  auto ce_neg_inf = [](Generator&) {
    // Rows with -inf logits away from the target (each loss is finite).
    return std::vector<Sample>{nog("-inf logits", {f64({-kInf, 0, 1, 2, -kInf, 3, -kInf, -kInf, 0}, {3, 3}), i64({1, 2, 2}, {3})},
                                   "non-finite inputs")};
  };
  entry("cross_entropy", "F.cross_entropy(a, b)", one([](X x) { return cross_entropy(x[0], x[1]); }), {true, false},
        {ce_samples({1, 3, 0, 4}), ce_neg_inf});
  entry("cross_entropy_ignore_index", "F.cross_entropy(a, b, ignore_index=0)",
        one([](X x) { return cross_entropy(x[0], x[1], 0.0, 0); }), {true, false}, {ce_samples({0, 2, 0, 4}), ce_neg_inf});
  entry("cross_entropy_sum", "F.cross_entropy(a, b, reduction='sum')",
        one([](X x) { return cross_entropy(x[0], x[1], 0.0, -100, Reduction::Sum); }), {true, false},
        {ce_samples({0, 2, 0, 4})});
  entry("cross_entropy_ignore_sum", "F.cross_entropy(a, b, ignore_index=2, reduction='sum')",
        one([](X x) { return cross_entropy(x[0], x[1], 0.0, 2, Reduction::Sum); }), {true, false},
        {ce_samples({0, 2, 0, 2})});
  entry("cross_entropy_smoothed", "paper_ce(a, b, 0.1, 0)", one([](X x) { return cross_entropy(x[0], x[1], 0.1, 0); }),
        {true, false}, {ce_samples({0, 2, 0, 4})});
  entry("cross_entropy_smoothed_no_ignore", "paper_ce(a, b, 0.1)",
        one([](X x) { return cross_entropy(x[0], x[1], 0.1); }), {true, false}, {ce_samples({0, 2, 1, 4})});
  entry("cross_entropy_smoothed_sum", "paper_ce(a, b, 0.2, 1, 'sum')",
        one([](X x) { return cross_entropy(x[0], x[1], 0.2, 1, Reduction::Sum); }), {true, false},
        {ce_samples({1, 2, 1, 4})});
  // Deliberate differences (allowlisted in the reference): PyTorch's label smoothing mixes in
  // the uniform distribution over all classes; a mean over zero counted rows is 0 in tapestry
  // and NaN in PyTorch.
  entry("cross_entropy_smoothing_torch", "F.cross_entropy(a, b, label_smoothing=0.1, ignore_index=0)",
        one([](X x) { return cross_entropy(x[0], x[1], 0.1, 0); }), {true, false},
        {[](Generator& g) { return std::vector<Sample>{ok("[4, 5]", {draw(g, {4, 5}), i64({0, 2, 3, 4}, {4})})}; }});
  entry("cross_entropy_all_ignored", "F.cross_entropy(a, b, ignore_index=0)",
        one([](X x) { return cross_entropy(x[0], x[1], 0.0, 0); }), {true, false},
        {[](Generator& g) { return std::vector<Sample>{ok("[3, 4]", {draw(g, {3, 4}), i64({0, 0, 0}, {3})})}; }});
  entry("cross_entropy_empty_batch", "F.cross_entropy(a, b)", one([](X x) { return cross_entropy(x[0], x[1]); }),
        {true, false},
        {[](Generator& g) { return std::vector<Sample>{ok("[0, 5]", {draw(g, {0, 5}), i64({}, {0})})}; }});

  // ---- the regression losses and binary cross-entropy
  entry("mse_loss", "F.mse_loss(a, b)", one([](X x) { return mse_loss(x[0], x[1]); }), {true, true},
        {binary_samples({Dom::Real, Dom::Real, false, false})});
  entry("mse_loss_sum", "F.mse_loss(a, b, reduction='sum')",
        one([](X x) { return mse_loss(x[0], x[1], Reduction::Sum); }), {true, true},
        {binary_samples({Dom::Real, Dom::Real, false, false})});
  entry("l1_loss", "F.l1_loss(a, b)", one([](X x) { return l1_loss(x[0], x[1]); }), {true, true},
        {binary_samples({Dom::Real, Dom::Real, false, true})});
  entry("smooth_l1_loss", "F.smooth_l1_loss(a, b, beta=0.5)",
        one([](X x) { return smooth_l1_loss(x[0], x[1], Reduction::Mean, 0.5); }), {true, true},
        {binary_samples({Dom::Real, Dom::Real, false, true})});
  entry("huber_loss", "F.huber_loss(a, b, reduction='sum', delta=0.5)",
        one([](X x) { return huber_loss(x[0], x[1], Reduction::Sum, 0.5); }), {true, true},
        {binary_samples({Dom::Real, Dom::Real, false, true})});
  entry("binary_cross_entropy_with_logits", "F.binary_cross_entropy_with_logits(a, b)",
        one([](X x) { return binary_cross_entropy_with_logits(x[0], x[1]); }), {true, true},
        {[](Generator& g) {
          auto prob = [&](const Shape& s, DType dt = kFloat64) { return rand(s, dt, &g); };
          return std::vector<Sample>{
              ok("[3, 4]", {draw(g, {3, 4}), prob({3, 4})}),
              ok("0-d", {draw(g, {}), prob({})}),
              ok("empty [0, 3]", {draw(g, {0, 3}), prob({0, 3})}),
              ok("transposed [4, 5] and strided", {transposed(draw(g, {4, 5})), strided(prob({4, 5}))}),
              ok("at 0 and large logits", {f64({0.0, 0.0, 40.0, -40.0, 800.0, -800.0}, {6}),
                                           f64({0.3, 1.0, 0.0, 1.0, 0.5, 0.5}, {6})}),
              ok("float32 [2, 3]", {draw(g, {2, 3}, Dom::Real, kFloat32), prob({2, 3}, kFloat32)}),
              err("shapes [3, 4] and [4]", {draw(g, {3, 4}), prob({4})}),
          };
        }});
}

// The rows of sorting, scans and triangles.
void add_sorting_rows(std::vector<OpInfo>& t) {
  const Entry entry{t};
  // ---- sorting, scans and triangles. PyTorch's own sort is unstable unless asked (stable=True);
  // tapestry's always is. topk with sorted=False: PyTorch's order is its own, tapestry's is the
  // input order, so the expression puts PyTorch's selection in index order.
  auto tri_samples = shape_samples(rank_lt(2), false);
  entry("tril", "torch.tril(a)", one([](X x) { return tril(x[0]); }), {true}, {tri_samples});
  entry("tril_diag1", "torch.tril(a, 1)", one([](X x) { return tril(x[0], 1); }), {true}, {tri_samples});
  entry("tril_diag-1", "a.tril(-1)", one([](X x) { return tril(x[0], -1); }), {true}, {tri_samples});
  entry("tril_diag-100", "torch.tril(a, diagonal=-100)", one([](X x) { return tril(x[0], -100); }), {true},
        {tri_samples});
  entry("triu", "torch.triu(a)", one([](X x) { return triu(x[0]); }), {true}, {tri_samples});
  entry("triu_diag2", "torch.triu(a, diagonal=2)", one([](X x) { return triu(x[0], 2); }), {true}, {tri_samples});
  entry("triu_diag-2", "a.triu(-2)", one([](X x) { return triu(x[0], -2); }), {true}, {tri_samples});
  entry("triu_diag100", "torch.triu(a, 100)", one([](X x) { return triu(x[0], 100); }), {true}, {tri_samples});
  entry("cumsum_dim0", "torch.cumsum(a, 0)", one([](X x) { return cumsum(x[0], 0); }), {true},
        {along_dim_samples(0, false)});
  entry("cumsum_dim1", "torch.cumsum(a, dim=1)", one([](X x) { return cumsum(x[0], 1); }), {true},
        {along_dim_samples(1, false)});
  entry("cumsum_dim-1", "a.cumsum(-1)", one([](X x) { return cumsum(x[0], -1); }), {true},
        {along_dim_samples(-1, false)});
  entry("sort", "torch.sort(a, stable=True)", values_indices([](X x) { return sort(x[0]); }), {true},
        {along_dim_samples(-1, true)});
  entry("sort_descending", "torch.sort(a, descending=True, stable=True)",
        values_indices([](X x) { return sort(x[0], -1, true); }), {true}, {along_dim_samples(-1, true)});
  entry("sort_dim0", "torch.sort(a, dim=0, stable=True)", values_indices([](X x) { return sort(x[0], 0); }), {true},
        {along_dim_samples(0, true)});
  entry("sort_dim0_descending", "a.sort(dim=0, descending=True, stable=True)",
        values_indices([](X x) { return sort(x[0], 0, true); }), {true}, {along_dim_samples(0, true)});
  entry("sort_dim1", "torch.sort(a, dim=1, stable=True)", values_indices([](X x) { return sort(x[0], 1); }), {true},
        {along_dim_samples(1, true)});
  entry("argsort", "torch.argsort(a, stable=True)", one([](X x) { return argsort(x[0]); }), {},
        {along_dim_samples(-1, true)});
  entry("argsort_dim0_descending", "torch.argsort(a, dim=0, descending=True, stable=True)",
        one([](X x) { return argsort(x[0], 0, true); }), {}, {along_dim_samples(0, true)});
  entry("topk_2", "torch.topk(a, 2)", values_indices([](X x) { return topk(x[0], 2); }), {true},
        {topk_samples(2, -1)});
  entry("topk_0", "torch.topk(a, 0)", values_indices([](X x) { return topk(x[0], 0); }), {true},
        {topk_samples(0, -1)});
  entry("topk_1", "a.topk(1)", values_indices([](X x) { return topk(x[0], 1); }), {true}, {topk_samples(1, -1)});
  entry("topk_2_smallest", "torch.topk(a, 2, largest=False)",
        values_indices([](X x) { return topk(x[0], 2, -1, false); }), {true}, {topk_samples(2, -1)});
  entry("topk_3_dim0", "torch.topk(a, 3, dim=0)", values_indices([](X x) { return topk(x[0], 3, 0); }), {true},
        {topk_samples(3, 0)});
  entry("topk_2_dim0_smallest", "a.topk(2, dim=0, largest=False)",
        values_indices([](X x) { return topk(x[0], 2, 0, false); }), {true}, {topk_samples(2, 0)});
  entry("topk_4", "torch.topk(a, 4)", values_indices([](X x) { return topk(x[0], 4); }), {true},
        {topk_samples(4, -1)});
  entry("topk_3_unsorted",
        "(lambda r: (r.values.gather(-1, r.indices.argsort(-1)), r.indices.sort(-1).values))"
        "(torch.topk(a, 3, sorted=False))",
        values_indices([](X x) { return topk(x[0], 3, -1, true, false); }), {true}, {topk_samples(3, -1)});
  entry("topk_2_smallest_unsorted",
        "(lambda r: (r.values.gather(-1, r.indices.argsort(-1)), r.indices.sort(-1).values))"
        "(torch.topk(a, 2, largest=False, sorted=False))",
        values_indices([](X x) { return topk(x[0], 2, -1, false, false); }), {true}, {topk_samples(2, -1)});
  entry("topk_negative_k", "torch.topk(a, -1)", values_indices([](X x) { return topk(x[0], -1); }), {true},
        {topk_samples(-1, -1)});
}

// The table, family by family.
std::vector<OpInfo> build_table() {
  std::vector<OpInfo> t;
  add_elementwise_rows(t);
  add_reduction_rows(t);
  add_linear_algebra_rows(t);
  add_shape_rows(t);
  add_nn_rows(t);
  add_sorting_rows(t);
  return t;
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

const std::vector<OpInfo>& op_table() {
  static const std::vector<OpInfo> table = build_table();
  return table;
}

std::vector<Sample> make_samples(const OpInfo& op, uint64_t seed) {
  Generator gen(seed ^ fnv1a(op.name));
  std::vector<Sample> out;
  for (const SampleFn& f : op.samples) {
    std::vector<Sample> s = f(gen);
    out.insert(out.end(), s.begin(), s.end());
  }
  return out;
}

std::string input_name(size_t i) { return std::string(1, static_cast<char>('a' + i)); }

bool all_finite(const Tensor& t) {
  if (!t.defined() || !is_floating(t.dtype())) return true;
  for (double v : t.to_vector<double>())
    if (!std::isfinite(v)) return false;
  return true;
}

bool has_expanded_dims(const Tensor& t) {
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.stride(d) == 0 && t.size(d) > 1) return true;
  return false;
}

RunResult run_case(const OpFn& fn, const TensorList& inputs_in, const std::vector<bool>& differentiable,
                   uint64_t seed) {
  RunResult r;
  TensorList inputs = inputs_in;
  r.grad_input.assign(inputs.size(), false);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (i < differentiable.size() && differentiable[i] && inputs[i].defined() && is_floating(inputs[i].dtype())) {
      inputs[i] = inputs[i].detach();  // a fresh leaf with the same storage, strides and offset
      inputs[i].requires_grad_();
      r.grad_input[i] = true;
    }
  }
  try {
    r.outputs = fn(inputs);
  } catch (const Error& e) {
    r.threw = true;
    r.error = e.what();
    return r;
  } catch (const std::exception& e) {
    r.threw = true;
    r.foreign = true;
    r.error = e.what();
    return r;
  }
  r.gouts.assign(r.outputs.size(), Tensor());
  r.grads.assign(inputs.size(), Tensor());
  try {
    Generator gen(seed);
    Tensor total;
    for (size_t j = 0; j < r.outputs.size(); ++j) {
      const Tensor& o = r.outputs[j];
      if (!o.defined() || !is_floating(o.dtype()) || !o.requires_grad()) continue;
      Tensor g = randn(o.sizes(), o.options(), &gen);  // drawn on the host, then on o's device
      r.gouts[j] = g;
      Tensor term = sum(mul(o, g));
      total = total.defined() ? add(total, term) : term;
    }
    if (total.defined()) total.backward();
  } catch (const std::exception& e) {
    r.backward_error = e.what();
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!r.grad_input[i]) continue;
    Tensor g = inputs[i].grad();
    r.grads[i] = g.defined() ? g : zeros(inputs[i].sizes(), inputs[i].dtype());
  }
  if (!r.backward_error.empty()) return r;
  // Second order: the same gradient again, recorded, then differentiated against directions u.
  r.dirs.assign(inputs.size(), Tensor());
  r.grads2.assign(inputs.size(), Tensor());
  try {
    TensorList leaves, again = inputs;
    std::vector<size_t> pos;
    for (size_t i = 0; i < inputs.size(); ++i)
      if (r.grad_input[i]) {
        again[i] = inputs[i].detach().requires_grad_();
        leaves.push_back(again[i]);
        pos.push_back(i);
      }
    if (leaves.empty()) return r;
    TensorList outs = fn(again);
    TensorList used, weights;
    for (size_t j = 0; j < outs.size() && j < r.gouts.size(); ++j)
      if (r.gouts[j].defined() && outs[j].defined() && outs[j].requires_grad()) {
        used.push_back(outs[j]);
        weights.push_back(r.gouts[j]);
      }
    Generator gen(seed + 7919);
    for (size_t k = 0; k < pos.size(); ++k) r.dirs[pos[k]] = randn(leaves[k].sizes(), leaves[k].options(), &gen);
    TensorList first = used.empty() ? TensorList(leaves.size())
                                    : autograd::grad(used, leaves, weights, true, /*create_graph=*/true, true);
    Tensor s;
    for (size_t k = 0; k < pos.size(); ++k) {
      if (!first[k].defined() || !first[k].requires_grad()) continue;
      Tensor term = sum(mul(first[k], r.dirs[pos[k]]));
      s = s.defined() ? add(s, term) : term;
    }
    TensorList second = s.defined() ? autograd::grad({s}, leaves, {}, false, false, true) : TensorList(leaves.size());
    for (size_t k = 0; k < pos.size(); ++k)
      r.grads2[pos[k]] = second[k].defined() ? second[k] : zeros(leaves[k].sizes(), leaves[k].options());
  } catch (const std::exception& e) {
    r.backward2_error = e.what();
  }
  return r;
}

// ---------------------------------------------------------------------------------------------
// Random programs

namespace {

using Step = std::function<Tensor(const Tensor&, const TensorList&)>;

std::string replace_at(const std::string& tmpl, const std::string& expr) {
  std::string out;
  for (char c : tmpl) {
    if (c == '@') out += expr;
    else out += c;
  }
  return out;
}

std::string join_ints(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

}  // namespace

Program random_program(std::mt19937_64& rng) {
  auto uni = [&rng](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  Generator gen(rng());
  Program p;
  // A new float64 leaf, in a random layout; returns its Python name.
  auto leaf = [&](const Shape& s, bool positive) {
    Tensor v = positive ? add(mul(rand(s, kFloat64, &gen), 2.0), 0.5) : randn(s, kFloat64, &gen);
    int64_t layout = uni(0, 3);
    if (layout == 1 && s.size() >= 2) v = transposed(v);
    else if (layout == 2 && !s.empty()) v = strided(v);
    p.inputs.push_back(v);
    return input_name(p.inputs.size() - 1);
  };

  Shape shape;
  for (int64_t i = 0, r = uni(0, 3); i < r; ++i) shape.push_back(uni(1, 4));
  std::string expr = leaf(shape, false);
  std::vector<Step> steps;
  std::string desc;
  const int64_t n_ops = uni(2, 5);
  const int64_t kMaxNumel = 256;
  // At most one exp or cube per program: chains of them overflow to inf, where the two sides'
  // last-bit differences turn into spurious mismatches.
  bool grown = false;

  for (int64_t k = 0; k < n_ops; ++k) {
    const int64_t rank = static_cast<int64_t>(shape.size());
    std::string name, tmpl;
    Step step;
    Shape next = shape;
    for (int tries = 0; tries < 50 && !step; ++tries) {
      const int64_t kind = uni(0, 99);
      if (kind < 35) {  // ---- a one-input op of the table (its Link says how)
        static const std::vector<const OpInfo*> links = [] {
          std::vector<const OpInfo*> v;
          for (const OpInfo& op : op_table())
            if (op.link != Link::None) v.push_back(&op);
          return v;
        }();
        const OpInfo& op = *links[static_cast<size_t>(uni(0, static_cast<int64_t>(links.size()) - 1))];
        if (op.link == Link::Grows && grown) continue;
        grown = grown || op.link == Link::Grows;
        const bool positive = op.link == Link::Positive;  // fed x^2 + 0.5
        name = op.name;
        // Its expression with the chain so far for `a`, parenthesised whole ("2.0 - a" inside "@ * b").
        tmpl = "(" + std::regex_replace(op.expr, std::regex("\\ba\\b"), positive ? "(torch.pow(@, 2.0) + 0.5)" : "(@)") + ")";
        step = [fn = op.fn, positive](const Tensor& x, const TensorList&) {
          return fn({positive ? add(pow(x, 2.0), 0.5) : x})[0];
        };
        p.smooth = p.smooth && op.link != Link::Kinked;
      } else if (kind < 42) {  // ---- softmax / log_softmax
        if (rank == 0) continue;
        const int64_t d = uni(-rank, rank - 1);
        const bool lg = uni(0, 1) == 1;
        name = lg ? "log_softmax" : "softmax";
        tmpl = std::string(lg ? "torch.log_softmax(@, " : "torch.softmax(@, ") + std::to_string(d) + ")";
        step = [d, lg](const Tensor& x, const TensorList&) { return lg ? log_softmax(x, d) : softmax(x, d); };
      } else if (kind < 62) {  // ---- binary against a new leaf, with broadcasting
        Shape other = shape;
        const int64_t how = uni(0, 4);
        if (how == 1) {
          for (int64_t& s : other)
            if (uni(0, 2) == 0) s = 1;
        } else if (how == 2 && rank > 0) {
          other.erase(other.begin(), other.begin() + uni(1, rank));
        } else if (how == 3 && rank < 3) {
          other.insert(other.begin(), uni(2, 3));
        } else if (how == 4) {
          bool grew = false;
          for (int64_t& s : other)
            if (s == 1) {
              s = uni(2, 3);
              grew = true;
            }
          if (!grew) continue;
        }
        Shape out = broadcast_shapes("random_program", shape, other);
        if (shape_numel(out) > kMaxNumel) continue;
        const int64_t op = uni(0, 6);
        const std::string b = leaf(other, op == 5);
        static const char* const names[] = {"add", "sub", "rsub_leaf", "mul", "maximum", "div", "minimum"};
        name = std::string(names[op]) + "(" + (how == 0 ? "same" : "bcast") + ")";
        const size_t bi = p.inputs.size() - 1;
        switch (op) {
          case 0: tmpl = "(@ + " + b + ")"; break;
          case 1: tmpl = "(@ - " + b + ")"; break;
          case 2: tmpl = "(" + b + " - @)"; break;
          case 3: tmpl = "(@ * " + b + ")"; break;
          case 4: tmpl = "torch.maximum(@, " + b + ")"; break;
          case 5: tmpl = "(@ / " + b + ")"; break;
          default: tmpl = "torch.minimum(@, " + b + ")"; break;
        }
        step = [op, bi](const Tensor& x, const TensorList& in) {
          const Tensor& y = in[bi];
          switch (op) {
            case 0: return add(x, y);
            case 1: return sub(x, y);
            case 2: return sub(y, x);
            case 3: return mul(x, y);
            case 4: return maximum(x, y);
            case 5: return div(x, y);
            default: return minimum(x, y);
          }
        };
        if (op == 4 || op == 6) p.smooth = false;
        next = out;
      } else if (kind < 67) {  // ---- matmul with a new leaf
        if (rank == 0) continue;
        const int64_t m = uni(1, 4);
        const bool left = rank >= 2 && uni(0, 1) == 1;
        if (left) {
          const std::string b = leaf({m, shape[rank - 2]}, false);
          tmpl = "torch.matmul(" + b + ", @)";
          next[rank - 2] = m;
        } else {
          const std::string b = leaf({shape[rank - 1], m}, false);
          tmpl = "torch.matmul(@, " + b + ")";
          if (rank == 1) next = {m};
          else next[rank - 1] = m;
        }
        const size_t bi = p.inputs.size() - 1;
        name = left ? "matmul(leaf, x)" : "matmul(x, leaf)";
        step = [left, bi](const Tensor& x, const TensorList& in) {
          return left ? matmul(in[bi], x) : matmul(x, in[bi]);
        };
      } else if (kind < 85) {  // ---- views
        const int64_t v = uni(0, 10);
        if (v == 0 && rank >= 2) {
          int64_t d0 = uni(0, rank - 1), d1 = uni(0, rank - 1);
          if (uni(0, 1)) d1 -= rank;  // a negative dim now and then
          name = "transpose";
          tmpl = "@.transpose(" + std::to_string(d0) + ", " + std::to_string(d1) + ")";
          std::swap(next[d0], next[wrapped(d1, rank)]);
          step = [d0, d1](const Tensor& x, const TensorList&) { return transpose(x, d0, d1); };
        } else if (v == 1 && rank >= 2) {
          std::vector<int64_t> perm(rank);
          for (int64_t i = 0; i < rank; ++i) perm[i] = i;
          std::shuffle(perm.begin(), perm.end(), rng);
          name = "permute";
          tmpl = "@.permute(" + join_ints(perm) + ")";
          for (int64_t i = 0; i < rank; ++i) next[i] = shape[perm[i]];
          step = [perm](const Tensor& x, const TensorList&) { return permute(x, perm); };
        } else if (v == 2 && rank >= 1) {
          const int64_t d = uni(0, rank - 1), n = shape[d], start = uni(0, n - 1), st = uni(1, 2);
          name = "slice";
          std::string idx;
          for (int64_t i = 0; i < d; ++i) idx += ":, ";
          tmpl = "@[" + idx + std::to_string(start) + "::" + std::to_string(st) + "]";
          next[d] = (n - start + st - 1) / st;
          step = [d, start, st](const Tensor& x, const TensorList&) { return slice(x, d, start, kEnd, st); };
        } else if (v == 3 && rank >= 1) {
          const int64_t d = uni(0, rank - 1), n = shape[d];
          int64_t i = uni(0, n - 1);
          if (uni(0, 1)) i -= n;
          name = "select";
          tmpl = "@.select(" + std::to_string(d) + ", " + std::to_string(i) + ")";
          next.erase(next.begin() + d);
          step = [d, i](const Tensor& x, const TensorList&) { return select(x, d, i); };
        } else if (v == 4 && rank >= 1) {
          const int64_t d = uni(0, rank - 1), n = shape[d], start = uni(0, n - 1), len = uni(1, n - start);
          name = "narrow";
          tmpl = "@.narrow(" + std::to_string(d) + ", " + std::to_string(start) + ", " + std::to_string(len) + ")";
          next[d] = len;
          step = [d, start, len](const Tensor& x, const TensorList&) { return x.narrow(d, start, len); };
        } else if (v == 5 && rank <= 3) {
          const int64_t d = uni(0, rank);
          name = "unsqueeze";
          tmpl = "@.unsqueeze(" + std::to_string(d) + ")";
          next.insert(next.begin() + d, 1);
          step = [d](const Tensor& x, const TensorList&) { return unsqueeze(x, d); };
        } else if (v == 6) {
          std::vector<int64_t> ones;
          for (int64_t i = 0; i < rank; ++i)
            if (shape[i] == 1) ones.push_back(i);
          if (ones.empty()) continue;
          const int64_t d = ones[uni(0, static_cast<int64_t>(ones.size()) - 1)];
          name = "squeeze";
          tmpl = "@.squeeze(" + std::to_string(d) + ")";
          next.erase(next.begin() + d);
          step = [d](const Tensor& x, const TensorList&) { return squeeze(x, d); };
        } else if (v == 7) {
          Shape target = shape;
          bool changed = false;
          for (int64_t& s : target)
            if (s == 1 && uni(0, 1)) {
              s = uni(2, 3);
              changed = true;
            }
          if ((!changed || uni(0, 2) == 0) && rank < 4) {
            target.insert(target.begin(), uni(2, 3));
            changed = true;
          }
          if (!changed || shape_numel(target) > kMaxNumel) continue;
          name = "expand";
          tmpl = "@.expand(" + join_ints(target) + ")";
          next = target;
          step = [target](const Tensor& x, const TensorList&) { return expand(x, target); };
        } else if (v == 8) {
          name = "reshape(-1)";
          tmpl = "@.reshape(-1)";
          next = {shape_numel(shape)};
          step = [](const Tensor& x, const TensorList&) { return reshape(x, {-1}); };
        } else if (v == 9 && rank >= 1) {
          const int64_t s0 = uni(0, rank - 1);
          name = "flatten";
          tmpl = "@.flatten(" + std::to_string(s0) + ")";
          Shape f(shape.begin(), shape.begin() + s0);
          f.push_back(shape_numel(Shape(shape.begin() + s0, shape.end())));
          next = f;
          step = [s0](const Tensor& x, const TensorList&) { return x.flatten(s0); };
        } else if (v == 10) {
          name = "contiguous";
          tmpl = "@.contiguous()";
          step = [](const Tensor& x, const TensorList&) { return contiguous(x); };
        } else {
          continue;
        }
      } else {  // ---- reductions
        const int64_t r = uni(0, 4);
        if (r == 0) {
          name = "sum";
          tmpl = "torch.sum(@)";
          next = {};
          step = [](const Tensor& x, const TensorList&) { return sum(x); };
        } else {
          if (rank == 0) continue;
          const int64_t d = uni(-rank, rank - 1), w = wrapped(d, rank);
          const bool keep = uni(0, 1) == 1;
          if (r == 3 && shape[w] < 2) continue;  // var of one element is NaN
          const std::string kd = keep ? "True" : "False";
          if (keep) next[w] = 1;
          else next.erase(next.begin() + w);
          if (r == 1) {
            name = "sum(dim)";
            tmpl = "torch.sum(@, dim=[" + std::to_string(d) + "], keepdim=" + kd + ")";
            step = [d, keep](const Tensor& x, const TensorList&) { return sum(x, {d}, keep); };
          } else if (r == 2) {
            name = "mean(dim)";
            tmpl = "torch.mean(@, dim=[" + std::to_string(d) + "], keepdim=" + kd + ")";
            step = [d, keep](const Tensor& x, const TensorList&) { return mean(x, {d}, keep); };
          } else if (r == 3) {
            name = "var(dim)";
            tmpl = "torch.var(@, dim=[" + std::to_string(d) + "], keepdim=" + kd + ")";
            step = [d, keep](const Tensor& x, const TensorList&) { return var(x, {d}, 1, keep); };
          } else {
            name = "max(dim)";
            tmpl = "torch.max(@, " + std::to_string(d) + ", keepdim=" + kd + ")[0]";
            step = [d, keep](const Tensor& x, const TensorList&) { return max(x, d, keep).values; };
            p.smooth = false;
          }
        }
      }
    }
    if (!step) {  // nothing applied in 50 tries (not expected): a plain tanh
      name = "tanh";
      tmpl = "torch.tanh(@)";
      next = shape;
      step = [](const Tensor& x, const TensorList&) { return tanh(x); };
    }
    expr = replace_at(tmpl, expr);
    desc += (desc.empty() ? "" : " > ") + name;
    steps.push_back(step);
    shape = next;
  }
  p.expr = expr;
  p.desc = desc;
  p.fn = [steps](const TensorList& in) {
    Tensor x = in[0];
    for (const Step& s : steps) x = s(x, in);
    return TensorList{x};
  };
  return p;
}

}  // namespace tapestry::opinfo
