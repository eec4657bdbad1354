// libFuzzer target: chains of views (and the reshapes/copies among them) checked against a
// reference that copies.
//
// The input is a program. Its first bytes pick a float64 tensor of rank 0-4 and sizes 0-5, filled
// with 0, 1, 2, ... so that every value names the base element it came from; the next 5 bytes steer
// the checks at the end (which dims to sum, which write: see Finale). Then each op byte
// picks one of transpose, permute, slice, narrow, select, expand, unsqueeze, squeeze, squeeze(dim),
// view, reshape, flatten, t and contiguous, and the following bytes its arguments (mostly small,
// one out of range on either side, now and then a huge or INT64_MIN/MAX value).
//
// The reference never looks at tapestry's strides. It holds the shape and, per element in
// row-major order, the base element it shows (`idx`) and its offset in the storage it lives in
// (`pos`), and recomputes both by gathering (copying) with its own index arithmetic for every op.
// It also decides, from the rules of each op, whether the arguments are valid:
//  - tapestry must throw tapestry::Error exactly when they are not (both then skip the op);
//  - a view op must share the storage it came from; reshape/flatten must share it exactly when
//    the new shape can be laid over the old offsets with strides (checked by brute force on
//    `pos`), and view must throw when it cannot; contiguous() copies exactly when the offsets are
//    not consecutive;
//  - after each op the shape, offset, strides (of dims longer than 1) and is_contiguous() agree.
// After the chain: to_vector, contiguous(), clone(), to(Float32), sum() and a sum over some dims
// agree with the reference, and the base tensor is unchanged. Then, when no two elements share
// storage (no expanded dims), one in-place write through the view (fill_, add_ of a scalar, of a
// tensor or of a broadcast row, copy_, mul_) under NoGradGuard must change the view as expected and
// the base tensor exactly at the reference's elements (nowhere when an op copied).
// Any disagreement prints the op chain and aborts.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tapestry/autograd/functions.h"
#include "tapestry/autograd/grad_mode.h"
#include "fuzz_util.h"
#include "tapestry/ops/error.h"
#include "tapestry/ops/factory.h"
#include "tapestry/ops/tensor.h"

using tapestry::Shape;
using tapestry::Tensor;

namespace {

constexpr int64_t kMaxDims = 16;    // make_tensor refuses more (ops/tensor.cpp)
constexpr int64_t kMaxNumel = 4096;  // an expand past this many elements is skipped, not run
constexpr int kMaxOps = 24;
// Now and then pass a huge value or INT64_MIN/MAX as a size, dim or bound: tapestry must refuse
// it with an Error (or handle it) without signed overflow. Set to false to fuzz the small cases only.
constexpr bool kExtremeArgs = true;
constexpr int64_t kExtremes[8] = {std::numeric_limits<int64_t>::min(),
                                  std::numeric_limits<int64_t>::min() + 1,
                                  -(int64_t{1} << 62),
                                  -(int64_t{1} << 32),
                                  int64_t{1} << 32,
                                  int64_t{1} << 62,
                                  std::numeric_limits<int64_t>::max() - 1,
                                  std::numeric_limits<int64_t>::max()};

std::string g_log;  // the ops run so far, printed on failure

[[noreturn]] void fail(const std::string& what) { tapestry_fuzz::fail("fuzz_views", what + "\nprogram:\n" + g_log); }

// The input bytes, read as a program; past the end every byte reads as 0.
class Program {
 public:
  Program(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return at_ >= size_; }
  uint8_t byte() { return at_ < size_ ? data_[at_++] : 0; }
  // A value in [lo, hi] (hi - lo < 248), or with kExtremeArgs, for 8 byte values of 256, an extreme.
  int64_t arg(int64_t lo, int64_t hi) {
    uint8_t b = byte();
    if (kExtremeArgs && b >= 248) return kExtremes[b - 248];
    return lo + static_cast<int64_t>(b) % (hi - lo + 1);
  }
  // A dim for a tensor of `rank` dims: mostly valid (negative or not), at times just out of range.
  int64_t dim(int64_t rank) { return arg(-rank - 2, rank + 1); }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

// ---- the reference

struct Ref {
  Shape shape;
  std::vector<int64_t> idx;  // per element (row-major): the base element it shows (= its value)
  std::vector<int64_t> pos;  // per element: its offset in the storage it lives in
  bool aliases = true;       // whether that storage is the base tensor's
  int64_t numel() const { return static_cast<int64_t>(idx.size()); }
};

// Elements of a shape of non-negative sizes: 0 when a size is 0, else the product, saturating.
int64_t sat_numel(const Shape& s) {
  for (int64_t d : s)
    if (d == 0) return 0;
  int64_t n = 1;
  for (int64_t d : s)
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return std::numeric_limits<int64_t>::max();
  return n;
}

// The product of the sizes, false when it does not fit in int64 (a size of 0 makes it 0).
bool exact_numel(const Shape& s, int64_t& out) {
  out = 1;
  for (int64_t d : s)
    if (d == 0) {
      out = 0;
      return true;
    }
  for (int64_t d : s)
    if (__builtin_mul_overflow(out, d, &out)) return false;
  return true;
}

// Row-major strides; only for shapes with at most kMaxNumel elements, none of them 0.
Shape row_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

void unravel(int64_t k, const Shape& s, Shape& m) {
  m.assign(s.size(), 0);
  for (size_t i = s.size(); i-- > 0;) {
    m[i] = k % s[i];
    k /= s[i];
  }
}

// Python-style dim wrapping, as tapestry documents it: [-n, n) for n dims, [-1, 0] for 0 dims.
bool wrap(int64_t d, int64_t ndim, int64_t& out) {
  int64_t lo = ndim == 0 ? -1 : -ndim, hi = ndim == 0 ? 0 : ndim - 1;
  if (d < lo || d > hi) return false;
  out = d < 0 ? d + (ndim == 0 ? 1 : ndim) : d;
  return true;
}

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), int64_t{0});
  return v;
}

// The new tensor of shape `shape` whose element m shows the old element at multi-index
// old_of(m): idx and pos are gathered by copying.
Ref remap(const Ref& r, Shape shape, const std::function<void(const Shape&, Shape&)>& old_of) {
  Ref out;
  out.shape = std::move(shape);
  out.aliases = r.aliases;
  const int64_t n = sat_numel(out.shape);
  if (n == 0) return out;
  if (n > kMaxNumel) fail("reference: remap to " + std::to_string(n) + " elements");
  const Shape old_st = row_strides(r.shape);
  Shape m, om;
  out.idx.resize(static_cast<size_t>(n));
  out.pos.resize(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) {
    unravel(k, out.shape, m);
    old_of(m, om);
    if (om.size() != r.shape.size()) fail("reference: index of the wrong rank");
    int64_t f = 0;
    for (size_t i = 0; i < om.size(); ++i) {
      if (om[i] < 0 || om[i] >= r.shape[i]) fail("reference: index out of range");
      f += om[i] * old_st[i];
    }
    out.idx[k] = r.idx[f];
    out.pos[k] = r.pos[f];
  }
  return out;
}

// Whether elements at offsets `pos` (row-major in `s`) can be addressed as offset + sum(m * stride).
bool affine(const std::vector<int64_t>& pos, const Shape& s) {
  if (pos.empty()) return true;
  const Shape rs = row_strides(s);
  Shape st(s.size(), 0), m;
  for (size_t d = 0; d < s.size(); ++d)
    if (s[d] > 1) st[d] = pos[rs[d]] - pos[0];
  for (size_t k = 0; k < pos.size(); ++k) {
    unravel(static_cast<int64_t>(k), s, m);
    int64_t e = pos[0];
    for (size_t d = 0; d < s.size(); ++d) e += m[d] * st[d];
    if (e != pos[k]) return false;
  }
  return true;
}

bool consecutive(const std::vector<int64_t>& pos) {
  for (size_t k = 0; k < pos.size(); ++k)
    if (pos[k] != pos[0] + static_cast<int64_t>(k)) return false;
  return true;
}

bool distinct(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  return std::adjacent_find(v.begin(), v.end()) == v.end();
}

// view/reshape's shape rules: at most one -1 (inferred), every other size >= 0, the element
// count kept (a -1 next to a 0 is refused, as in PyTorch).
bool infer_shape(const Shape& want, int64_t numel, Shape& out) {
  out = want;
  int64_t infer = -1, known = 1;
  bool zero = false, saturated = false;
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] == -1) {
      if (infer >= 0) return false;
      infer = static_cast<int64_t>(i);
    } else if (want[i] < 0) {
      return false;
    } else if (want[i] == 0) {
      zero = true;
    } else if (!saturated && __builtin_mul_overflow(known, want[i], &known)) {
      saturated = true;
    }
  }
  if (infer >= 0) {
    if (zero) return false;
    if (saturated) {  // the known sizes exceed numel: only 0 elements divide
      if (numel != 0) return false;
      out[infer] = 0;
    } else {
      if (numel % known != 0) return false;
      out[infer] = numel / known;
    }
    return true;
  }
  if (zero) return numel == 0;
  return !saturated && known == numel;
}

// A shape for view/reshape: often a factorization of numel (perhaps with a -1), else anything.
Shape gen_shape(Program& in, int64_t numel) {
  const size_t len = in.byte() % 6;
  const int mode = in.byte() % 4;
  Shape want(len);
  if (mode == 0) {
    for (auto& w : want) w = in.arg(-2, 6);
    return want;
  }
  if (numel == 0) {
    for (auto& w : want) w = in.arg(0, 5);
    if (len > 0) want[in.byte() % len] = 0;
  } else {
    int64_t rest = numel;
    for (size_t i = 0; i + 1 < len; ++i) {
      std::vector<int64_t> divisors;
      for (int64_t d = 1; d <= rest; ++d)
        if (rest % d == 0) divisors.push_back(d);
      want[i] = divisors[in.byte() % divisors.size()];
      rest /= want[i];
    }
    if (len > 0) want[len - 1] = rest;
  }
  if (mode == 3 && len > 0) want[in.byte() % len] = -1;
  return want;
}

// ---- checks against tapestry

Tensor from_values(const std::vector<double>& v, const Shape& s) {
  if (s.empty()) return tapestry::scalar_tensor(v.at(0), tapestry::DType::Float64);
  return tapestry::tensor(v, s, tapestry::DType::Float64);
}

std::vector<double> as_doubles(const std::vector<int64_t>& v) { return std::vector<double>(v.begin(), v.end()); }

void expect_values(const char* what, const Tensor& t, const Shape& shape, const std::vector<double>& want) {
  if (t.sizes() != shape) fail(fmt::format("{}: shape {}, reference {}", what, t.sizes(), shape));
  std::vector<double> got = t.to_vector<double>();
  if (got.size() != want.size())
    fail(fmt::format("{}: {} values, reference {}", what, got.size(), want.size()));
  for (size_t k = 0; k < got.size(); ++k)
    if (got[k] != want[k]) fail(fmt::format("{}: element {} is {}, reference {}", what, k, got[k], want[k]));
}

// Shape, offset, strides and contiguity of t against the reference's offsets.
void check_layout(const char* when, const Tensor& t, const Ref& ref) {
  if (t.sizes() != ref.shape) fail(fmt::format("{}: shape {}, reference {}", when, t.sizes(), ref.shape));
  if (t.strides().size() != ref.shape.size())
    fail(fmt::format("{}: {} strides for {} dims", when, t.strides().size(), ref.shape.size()));
  if (ref.numel() == 0) return;
  if (t.offset() != ref.pos[0]) fail(fmt::format("{}: offset {}, reference {}", when, t.offset(), ref.pos[0]));
  const Shape rs = row_strides(ref.shape);
  for (size_t d = 0; d < ref.shape.size(); ++d)
    if (ref.shape[d] > 1 && t.strides()[d] != ref.pos[rs[d]] - ref.pos[0])
      fail(fmt::format("{}: stride {} of dim {} (strides {}), reference {}", when, t.strides()[d], d, t.strides(),
                       ref.pos[rs[d]] - ref.pos[0]));
  if (t.is_contiguous() != consecutive(ref.pos))
    fail(fmt::format("{}: is_contiguous() is {} (strides {})", when, t.is_contiguous(), t.strides()));
}

enum class Share { Same, New, Any };  // whether the op's result must share its input's storage

// One op: its name and arguments for the log, whether the reference finds it valid (then `next`
// is the reference's result), what storage the result must have, and the tapestry call.
struct Step {
  std::string what;
  bool valid = false;
  bool skip = false;  // valid but too large to run
  Ref next;
  Share storage = Share::Same;
  std::function<Tensor()> call;
};

// view (is_view) or reshape with a generated shape.
Step plan_view(Program& in, const Tensor& t, const Ref& ref, bool is_view) {
  const int64_t n = ref.numel();
  const Shape want = gen_shape(in, n);
  Step s;
  s.what = fmt::format("{}({})", is_view ? "view" : "reshape", want);
  Shape shape;
  s.valid = infer_shape(want, n, shape) && static_cast<int64_t>(shape.size()) <= kMaxDims;
  const bool as_view = s.valid && affine(ref.pos, shape);
  if (is_view) s.valid = as_view;  // view refuses what needs a copy
  if (s.valid) {
    s.next = ref;
    s.next.shape = shape;
    if (!as_view) {
      s.next.pos = iota(n);
      s.next.aliases = false;
    }
    s.storage = as_view ? Share::Same : Share::New;
  }
  if (is_view) s.call = [t, want] { return t.view(want); };
  else s.call = [t, want] { return t.reshape(want); };
  return s;
}

Step plan(Program& in, int op, const Tensor& t, const Ref& ref) {
  const int64_t r = static_cast<int64_t>(ref.shape.size());
  const int64_t n = ref.numel();
  Step s;
  switch (op) {
    case 0: {  // transpose
      const int64_t a = in.dim(r), b = in.dim(r);
      int64_t wa = 0, wb = 0;
      s.what = fmt::format("transpose({}, {})", a, b);
      s.valid = wrap(a, r, wa) && wrap(b, r, wb);
      if (s.valid) {
        Shape shape = ref.shape;
        if (r > 0) std::swap(shape[wa], shape[wb]);
        s.next = remap(ref, shape, [&](const Shape& m, Shape& om) {
          om = m;
          if (r > 0) std::swap(om[wa], om[wb]);
        });
      }
      s.call = [t, a, b] { return t.transpose(a, b); };
      break;
    }
    case 1: {  // permute: a shuffle, dims sometimes negative, at times broken
      std::vector<int64_t> p = iota(r);
      for (int64_t i = r - 1; i > 0; --i) std::swap(p[i], p[in.byte() % (i + 1)]);
      const uint8_t neg = in.byte();
      for (int64_t i = 0; i < r; ++i)
        if ((neg >> (i % 8)) & 1) p[i] -= r;
      const uint8_t broken = in.byte();
      if (broken % 8 == 0) {
        if (r > 0 && (broken & 8)) p.pop_back();
        else p.push_back(in.dim(r));
      } else if (broken % 8 == 1 && r > 0) {
        p[in.byte() % r] = in.dim(r);
      }
      s.what = fmt::format("permute({})", p);
      std::vector<int64_t> w(p.size());
      std::vector<bool> seen(static_cast<size_t>(r), false);
      s.valid = static_cast<int64_t>(p.size()) == r;
      for (size_t i = 0; s.valid && i < p.size(); ++i) {
        s.valid = wrap(p[i], r, w[i]) && (r == 0 || !seen[w[i]]);
        if (s.valid && r > 0) seen[w[i]] = true;
      }
      if (s.valid) {
        Shape shape(static_cast<size_t>(r));
        for (int64_t i = 0; i < r; ++i) shape[i] = ref.shape[w[i]];
        s.next = remap(ref, shape, [&](const Shape& m, Shape& om) {
          om.assign(m.size(), 0);
          for (int64_t i = 0; i < r; ++i) om[w[i]] = m[i];
        });
      }
      s.call = [t, p] { return t.permute(p); };
      break;
    }
    case 2: {  // slice
      const int64_t d = in.dim(r), start = in.arg(-7, 7), end = in.arg(-7, 7), step = in.arg(-1, 4);
      int64_t wd = 0;
      s.what = fmt::format("slice({}, {}, {}, {})", d, start, end, step);
      s.valid = r > 0 && wrap(d, r, wd) && step > 0;
      if (s.valid) {
        const int64_t size = ref.shape[wd];
        int64_t b = start < 0 ? start + size : start, e = end < 0 ? end + size : end;
        b = std::clamp<int64_t>(b, 0, size);
        e = std::clamp<int64_t>(e, b, size);
        const int64_t count = e == b ? 0 : (e - b - 1) / step + 1;
        Shape shape = ref.shape;
        shape[wd] = count;
        s.next = remap(ref, shape, [&](const Shape& m, Shape& om) {
          om = m;
          om[wd] = b + m[wd] * step;
        });
      }
      s.call = [t, d, start, end, step] { return t.slice(d, start, end, step); };
      break;
    }
    case 3: {  // narrow
      const int64_t d = in.dim(r), start = in.arg(-2, 6), length = in.arg(-1, 6);
      int64_t wd = 0;
      s.what = fmt::format("narrow({}, {}, {})", d, start, length);
      // As PyTorch: a negative start counts from the end (start in [-size, size]).
      int64_t st = start;
      s.valid = r > 0 && wrap(d, r, wd) && start >= -ref.shape[wd] && start <= ref.shape[wd];
      if (s.valid && st < 0) st += ref.shape[wd];
      s.valid = s.valid && length >= 0 && st <= ref.shape[wd] - length;
      if (s.valid) {
        Shape shape = ref.shape;
        shape[wd] = length;
        s.next = remap(ref, shape, [&](const Shape& m, Shape& om) {
          om = m;
          om[wd] = st + m[wd];
        });
      }
      s.call = [t, d, start, length] { return t.narrow(d, start, length); };
      break;
    }
    case 4: {  // select
      const int64_t d = in.dim(r), index = in.arg(-6, 6);
      int64_t wd = 0;
      s.what = fmt::format("select({}, {})", d, index);
      s.valid = r > 0 && wrap(d, r, wd) && index >= -ref.shape[wd] && index < ref.shape[wd];
      if (s.valid) {
        const int64_t i = index < 0 ? index + ref.shape[wd] : index;
        Shape shape = ref.shape;
        shape.erase(shape.begin() + wd);
        s.next = remap(ref, shape, [&](const Shape& m, Shape& om) {
          om = m;
          om.insert(om.begin() + wd, i);
        });
      }
      s.call = [t, d, index] { return t.select(d, index); };
      break;
    }
    case 5: {  // expand: new leading dims, size-1 dims grown, -1 kept, at times a bad size
      const uint8_t form = in.byte();
      int64_t lead = form % 4 == 3 ? 2 : form % 4 == 2 ? 1 : 0;
      if (form % 16 == 15 && r > 0) lead = -1;  // fewer dims than the tensor: refused
      const int64_t len = r + lead;
      Shape want(static_cast<size_t>(len));
      for (int64_t i = 0; i < len; ++i) {
        if (i < lead) {
          want[i] = in.arg(0, 4);
          continue;
        }
        const int64_t have = ref.shape[i - lead];
        switch (in.byte() % 4) {
          case 0: want[i] = -1; break;
          case 1: want[i] = have; break;
          case 2: want[i] = in.arg(-2, 5); break;
          default: want[i] = have == 1 ? in.arg(0, 4) : have; break;
        }
      }
      s.what = fmt::format("expand({})", want);
      // Sizes must end up >= 0 (PyTorch refuses a negative size; -1 keeps the old one).
      s.valid = lead >= 0 && len <= kMaxDims;
      Shape shape(static_cast<size_t>(std::max<int64_t>(len, 0)));
      for (int64_t i = 0; s.valid && i < len; ++i) {
        if (i < lead) {
          s.valid = want[i] >= 0;
          shape[i] = want[i];
        } else {
          const int64_t have = ref.shape[i - lead], w = want[i] == -1 ? have : want[i];
          s.valid = w >= 0 && (w == have || have == 1);
          shape[i] = w;
        }
      }
      if (s.valid && sat_numel(shape) > kMaxNumel) {
        s.skip = true;
        break;
      }
      if (s.valid)
        s.next = remap(ref, shape, [&](const Shape& m, Shape& om) {
          om.assign(static_cast<size_t>(r), 0);
          for (int64_t j = 0; j < r; ++j) om[j] = ref.shape[j] == 1 ? 0 : m[j + lead];
        });
      s.call = [t, want] { return t.expand(want); };
      break;
    }
    case 6: {  // unsqueeze
      const int64_t d = in.arg(-r - 3, r + 2);
      int64_t wd = 0;
      s.what = fmt::format("unsqueeze({})", d);
      s.valid = wrap(d, r + 1, wd) && r + 1 <= kMaxDims;
      if (s.valid) {
        Shape shape = ref.shape;
        shape.insert(shape.begin() + wd, 1);
        s.next = remap(ref, shape, [&](const Shape& m, Shape& om) {
          om = m;
          om.erase(om.begin() + wd);
        });
      }
      s.call = [t, d] { return t.unsqueeze(d); };
      break;
    }
    case 7: {  // squeeze()
      s.what = "squeeze()";
      s.valid = true;
      Shape shape;
      for (int64_t size : ref.shape)
        if (size != 1) shape.push_back(size);
      s.next = remap(ref, shape, [&](const Shape& m, Shape& om) {
        om.clear();
        size_t j = 0;
        for (int64_t size : ref.shape) om.push_back(size == 1 ? 0 : m[j++]);
      });
      s.call = [t] { return t.squeeze(); };
      break;
    }
    case 8: {  // squeeze(dim): removes the dim only when its size is 1
      const int64_t d = in.dim(r);
      int64_t wd = 0;
      s.what = fmt::format("squeeze({})", d);
      s.valid = wrap(d, r, wd);
      if (s.valid) {
        if (r == 0 || ref.shape[wd] != 1) {
          s.next = ref;
        } else {
          Shape shape = ref.shape;
          shape.erase(shape.begin() + wd);
          s.next = remap(ref, shape, [&](const Shape& m, Shape& om) {
            om = m;
            om.insert(om.begin() + wd, 0);
          });
        }
      }
      s.call = [t, d] { return t.squeeze(d); };
      break;
    }
    case 9:  // view: only where strides exist for the new shape
      return plan_view(in, t, ref, true);
    case 10:  // reshape: a view where one exists, else a copy
      return plan_view(in, t, ref, false);
    case 11: {  // flatten(start, end), through reshape
      const int64_t a = in.dim(r), b = in.dim(r);
      s.what = fmt::format("flatten({}, {})", a, b);
      Shape shape;
      if (r == 0) {  // as PyTorch: a 0-d tensor's dims are 0 and -1 only
        s.valid = a >= -1 && a <= 0 && b >= -1 && b <= 0;
        shape = {1};
      } else {
        int64_t wa = 0, wb = 0;
        s.valid = wrap(a, r, wa) && wrap(b, r, wb) && wa <= wb;
        if (s.valid) {
          Shape middle(ref.shape.begin() + wa, ref.shape.begin() + wb + 1);
          int64_t joined = 0;
          // A joined size past INT64_MAX (only with 0 elements and huge sizes) cannot exist.
          s.valid = exact_numel(middle, joined);
          shape.assign(ref.shape.begin(), ref.shape.begin() + wa);
          shape.push_back(joined);
          shape.insert(shape.end(), ref.shape.begin() + wb + 1, ref.shape.end());
        }
      }
      if (s.valid) {
        const bool as_view = affine(ref.pos, shape);
        s.next = ref;
        s.next.shape = shape;
        if (!as_view) {
          s.next.pos = iota(n);
          s.next.aliases = false;
        }
        s.storage = as_view ? Share::Same : Share::New;
      }
      s.call = [t, a, b] { return t.flatten(a, b); };
      break;
    }
    case 12: {  // t(): transposes 2 dims, leaves fewer alone, refuses more
      s.what = "t()";
      s.valid = r <= 2;
      if (s.valid && r < 2) s.next = ref;
      if (s.valid && r == 2)
        s.next = remap(ref, Shape{ref.shape[1], ref.shape[0]}, [](const Shape& m, Shape& om) { om = {m[1], m[0]}; });
      s.call = [t] { return t.t(); };
      break;
    }
    default: {  // contiguous(): the same tensor when its elements are consecutive, else a copy
      s.what = "contiguous()";
      s.valid = true;
      s.next = ref;
      if (n == 0) {
        s.storage = Share::Any;
      } else if (consecutive(ref.pos)) {
        s.storage = Share::Same;
      } else {
        s.next.pos = iota(n);
        s.next.aliases = false;
        s.storage = Share::New;
      }
      s.call = [t] { return t.contiguous(); };
      break;
    }
  }
  return s;
}

// The bytes that steer the checks after the chain, read before it (the chain runs to the end).
struct Finale {
  uint32_t sum_dims = 0;  // which dims the dim-wise sum reduces (bit d: dim d)
  uint8_t sum_neg = 0;    // bit d: name dim d negatively
  uint8_t sum_form = 0;   // bit 0: keepdim, bit 1: dims in reverse, bits 2-4 all 0: repeat a dim
  uint8_t write = 0;      // which in-place write
};

Finale read_finale(Program& in) {
  Finale f;
  const uint32_t lo = in.byte();
  f.sum_dims = lo | (static_cast<uint32_t>(in.byte()) << 8);
  f.sum_neg = in.byte();
  f.sum_form = in.byte();
  f.write = in.byte();
  return f;
}

// Sums over a subset of dims (given in any order, negative or not, at times repeated: refused).
void check_sum_dims(const Finale& fin, const Tensor& t, const Ref& ref) {
  const int64_t r = static_cast<int64_t>(ref.shape.size());
  if (r == 0) return;
  const uint32_t bits = fin.sum_dims;
  const uint8_t neg = fin.sum_neg, form = fin.sum_form;
  std::vector<int64_t> dims;
  std::vector<bool> reduced(static_cast<size_t>(r), false);
  for (int64_t d = 0; d < r; ++d)
    if ((bits >> d) & 1) {
      dims.push_back(((neg >> (d % 8)) & 1) ? d - r : d);
      reduced[d] = true;
    }
  if (dims.empty()) return;  // no dims means all dims: sum() covers that
  if (form & 2) std::reverse(dims.begin(), dims.end());
  const bool keepdim = form & 1;
  const bool repeated = (form >> 2) % 8 == 0;
  if (repeated) dims.push_back(dims.front());

  Shape out_shape;
  for (int64_t d = 0; d < r; ++d)
    if (!reduced[d]) out_shape.push_back(ref.shape[d]);
    else if (keepdim) out_shape.push_back(1);
  const int64_t out_n = sat_numel(out_shape);
  if (out_n > kMaxNumel) return;

  Tensor got;
  try {
    got = t.sum(dims, keepdim);
  } catch (const tapestry::Error& e) {
    if (repeated) return;
    fail(fmt::format("sum({}, keepdim={}) threw: {}", dims, keepdim, e.what()));
  }
  if (repeated) fail(fmt::format("sum({}) accepted a repeated dim", dims));

  std::vector<double> want(static_cast<size_t>(out_n), 0.0);
  if (ref.numel() > 0) {
    const Shape out_st = row_strides(out_shape);
    Shape m;
    for (int64_t k = 0; k < ref.numel(); ++k) {
      unravel(k, ref.shape, m);
      int64_t f = 0;
      size_t o = 0;
      for (int64_t d = 0; d < r; ++d) {
        if (!reduced[d]) f += m[d] * out_st[o++];
        else if (keepdim) ++o;  // a kept size-1 dim: index 0
      }
      want[f] += static_cast<double>(ref.idx[k]);
    }
  }
  expect_values(fmt::format("sum({}, keepdim={})", dims, keepdim).c_str(), got, out_shape, want);
}

// One in-place write through t; the view's new values and the base's are predicted.
void check_write(const Finale& fin, Tensor& t, const Ref& ref, const Tensor& base, int64_t base_numel) {
  const int64_t n = ref.numel();
  if (!distinct(ref.pos)) return;  // elements share storage (an expanded dim): no defined write
  if (ref.aliases && ref.pos != ref.idx) fail("reference: an aliasing view whose offsets are not its elements");
  const int64_t r = static_cast<int64_t>(ref.shape.size());
  std::vector<double> view_after(static_cast<size_t>(n));
  const uint64_t version = t.version();
  std::string what;
  int kind = fin.write % 6;
  if (n == 0 && kind != 1 && kind != 4) kind = 0;  // no operand tensors for empty views
  if (kind == 5 && r == 0) kind = 2;               // no row to broadcast
  try {
    tapestry::NoGradGuard no_grad;
    switch (kind) {
      case 0:
        what = "fill_(-0.5)";
        t.fill_(-0.5);
        for (int64_t k = 0; k < n; ++k) view_after[k] = -0.5;
        break;
      case 1:
        what = "add_(1000)";
        t.add_(1000.0);
        for (int64_t k = 0; k < n; ++k) view_after[k] = static_cast<double>(ref.idx[k]) + 1000;
        break;
      case 2: {
        what = "add_(tensor 10000 + k)";
        std::vector<double> other(static_cast<size_t>(n));
        for (int64_t k = 0; k < n; ++k) other[k] = 10000.0 + static_cast<double>(k);
        t.add_(from_values(other, ref.shape));
        for (int64_t k = 0; k < n; ++k) view_after[k] = static_cast<double>(ref.idx[k]) + other[k];
        break;
      }
      case 3: {
        what = "copy_(tensor -(k + 1))";
        std::vector<double> src(static_cast<size_t>(n));
        for (int64_t k = 0; k < n; ++k) src[k] = -static_cast<double>(k + 1);
        t.copy_(from_values(src, ref.shape));
        view_after = src;
        break;
      }
      case 4:
        what = "mul_(-2)";
        t.mul_(-2.0);
        for (int64_t k = 0; k < n; ++k) view_after[k] = -2.0 * static_cast<double>(ref.idx[k]);
        break;
      default: {  // a row broadcast over the leading dims
        const int64_t last = ref.shape.back();
        what = fmt::format("add_(row of {})", last);
        std::vector<double> row(static_cast<size_t>(last));
        for (int64_t j = 0; j < last; ++j) row[j] = 100.0 * static_cast<double>(j + 1);
        t.add_(tapestry::tensor(row, Shape{last}, tapestry::DType::Float64));
        for (int64_t k = 0; k < n; ++k) view_after[k] = static_cast<double>(ref.idx[k]) + row[k % last];
        break;
      }
    }
  } catch (const tapestry::Error& e) {
    fail(fmt::format("write {} threw: {}", what, e.what()));
  }
  g_log += "write " + what + "\n";
  if (n > 0 && t.version() <= version) fail(fmt::format("write {}: the version counter did not move", what));
  expect_values(("view after " + what).c_str(), t, ref.shape, view_after);
  std::vector<double> base_after = as_doubles(iota(base_numel));
  if (ref.aliases)
    for (int64_t k = 0; k < n; ++k) base_after[ref.idx[k]] = view_after[k];
  expect_values(("base after " + what).c_str(), base, base.sizes(), base_after);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tapestry::set_num_threads(1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Program in(data, size);
  g_log.clear();

  Ref ref;
  const int64_t rank = in.byte() % 5;
  for (int64_t i = 0; i < rank; ++i) ref.shape.push_back(in.byte() % 6);
  const int64_t base_numel = sat_numel(ref.shape);
  ref.idx = iota(base_numel);
  ref.pos = ref.idx;
  const Tensor base = from_values(as_doubles(ref.idx), ref.shape);
  g_log += fmt::format("base {}\n", ref.shape);
  check_layout("base", base, ref);
  const Finale fin = read_finale(in);

  Tensor t = base;
  for (int i = 0; i < kMaxOps && !in.done(); ++i) {
    Step s = plan(in, in.byte() % 14, t, ref);
    if (s.skip) {
      g_log += s.what + ": skipped (too many elements)\n";
      continue;
    }
    Tensor got;
    bool ok = false;
    std::string error;
    try {
      got = s.call();
      ok = true;
    } catch (const tapestry::Error& e) {
      error = e.what();
    }
    if (ok != s.valid)
      fail(s.valid ? fmt::format("{} threw, but the reference finds it valid: {}", s.what, error)
                   : fmt::format("{} gave shape {}, but the reference finds it invalid", s.what, got.sizes()));
    g_log += s.what + (ok ? fmt::format(" -> {}\n", got.sizes()) : std::string(" -> Error\n"));
    if (!ok) continue;
    if (s.storage == Share::Same && got.storage() != t.storage())
      fail(s.what + " copied, but the reference finds a view");
    if (s.storage == Share::New && got.storage() == t.storage())
      fail(s.what + " shares its input's storage, but the reference needs a copy");
    t = got;
    ref = std::move(s.next);
    check_layout(s.what.c_str(), t, ref);
  }

  try {
    const int64_t n = ref.numel();
    const std::vector<double> want = as_doubles(ref.idx);
    if (t.numel() != n) fail(fmt::format("numel() {}, reference {}", t.numel(), n));
    if (n > 0 && (t.storage() == base.storage()) != ref.aliases)
      fail(ref.aliases ? "the result lost the base's storage" : "the result shares the base's storage after a copy");
    expect_values("to_vector", t, ref.shape, want);

    const Tensor c = t.contiguous();
    expect_values("contiguous()", c, ref.shape, want);
    if (!c.is_contiguous()) fail("contiguous() is not contiguous");

    const Tensor cl = t.clone();
    expect_values("clone()", cl, ref.shape, want);
    if (!cl.is_contiguous()) fail("clone() is not contiguous");
    if (cl.storage() == t.storage()) fail("clone() shares storage");

    expect_values("to(Float32)", t.to(tapestry::DType::Float32), ref.shape, want);

    double total = 0;
    for (double v : want) total += v;
    const double sum = t.sum().item<double>();
    if (sum != total) fail(fmt::format("sum() {}, reference {}", sum, total));

    check_sum_dims(fin, t, ref);

    // Nothing so far writes: the base still holds 0, 1, 2, ...
    expect_values("base", base, base.sizes(), as_doubles(iota(base_numel)));

    check_write(fin, t, ref, base, base_numel);
  } catch (const tapestry::Error& e) {
    fail(std::string("a check on a valid view threw: ") + e.what());
  }
  return 0;
}
