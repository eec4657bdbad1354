// Views (new shape/strides/offset over the same storage, no copy) and the copies contiguous,
// clone and to. Each view's backward maps the gradient back onto the input's layout: a
// transpose transposes it back, a slice writes it into the sliced elements of a zero tensor, an
// expand is summed back by the engine.
#include <algorithm>
#include <numeric>

#include "tapestry/autograd/functions.h"
#include "tapestry/ops/detail/kernels.h"

namespace tapestry {

namespace {

Tensor alias(const Tensor& a, Shape shape, Shape strides, int64_t offset) {
  return make_tensor(a.impl().storage, std::move(shape), std::move(strides), offset, a.dtype());
}

// Resolves one -1 in `shape` from the element count.
Shape infer_shape(const char* op, const Shape& in, const Shape& shape, int64_t numel) {
  Shape out = shape;
  int64_t infer = -1;
  // The product of the given sizes, in 128 bits: huge sizes beside a -1 are valid for an empty input.
  __int128 known = 1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      TP_CHECK(infer < 0, "{}: only one dim can be -1, got shape {}", op, shape);
      infer = static_cast<int64_t>(i);
    } else {
      TP_CHECK(out[i] >= 0, "{}: invalid size {} in shape {}", op, out[i], shape);
      known *= out[i];
      if (known > static_cast<__int128>(INT64_MAX)) known = static_cast<__int128>(INT64_MAX) + 1;  // above any count
    }
  }
  if (infer >= 0) {
    TP_CHECK(known != 0 && numel % known == 0, "{}: shape {} is invalid for an input of shape {} ({} elements)", op,
             shape, in, numel);
    out[infer] = static_cast<int64_t>(numel / known);
  }
  TP_CHECK(shape_numel(out) == numel, "{}: shape {} is invalid for an input of shape {} ({} elements)", op, shape, in,
           numel);
  return out;
}

// Strides that let `new_s` view data laid out as (old_s, old_st), if any exist: dims of the new
// shape must fall within runs of old dims that are contiguous with each other.
bool view_strides(const Shape& old_s, const Shape& old_st, const Shape& new_s, Shape& new_st) {
  new_st.assign(new_s.size(), 1);
  if (shape_numel(old_s) == 0 || old_s.empty()) {
    new_st = contiguous_strides(new_s);
    return true;
  }
  int64_t view_d = static_cast<int64_t>(new_s.size()) - 1;
  int64_t base_stride = old_st.back(), chunk_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(old_s.size()) - 1; d >= 0; --d) {
    chunk_numel *= old_s[d];
    bool chunk_ends = d == 0 || (old_s[d - 1] != 1 && old_st[d - 1] != chunk_numel * base_stride);
    if (!chunk_ends) continue;
    while (view_d >= 0 && (view_numel < chunk_numel || new_s[view_d] == 1)) {
      new_st[view_d] = view_numel * base_stride;
      view_numel *= new_s[view_d];
      --view_d;
    }
    if (view_numel != chunk_numel) return false;
    if (d > 0) {
      base_stride = old_st[d - 1];
      chunk_numel = 1;
      view_numel = 1;
    }
  }
  return view_d == -1;
}

Tensor reshape_backward_node(const char* name, const Tensor& a, Tensor out) {
  Shape in = a.sizes();
  return record(name, out, {a}, [in](const Tensor& g) { return TensorList{reshape(g, in)}; });
}

}  // namespace

Tensor view(const Tensor& a, const Shape& shape_in) {
  Shape shape = infer_shape("view", a.sizes(), shape_in, a.numel());
  Shape st;
  TP_CHECK(view_strides(a.sizes(), a.strides(), shape, st),
           "view: shape {} cannot view an input of shape {} with strides {} without a copy; use reshape()", shape,
           a.sizes(), a.strides());
  return reshape_backward_node("ViewBackward", a, alias(a, shape, st, a.offset()));
}

Tensor reshape(const Tensor& a, const Shape& shape_in) {
  Shape shape = infer_shape("reshape", a.sizes(), shape_in, a.numel());
  Shape st;
  if (view_strides(a.sizes(), a.strides(), shape, st))
    return reshape_backward_node("ViewBackward", a, alias(a, shape, st, a.offset()));
  Tensor c = kernels::contiguous(a);
  return reshape_backward_node("ReshapeBackward", a, alias(c, shape, contiguous_strides(shape), c.offset()));
}

Tensor transpose(const Tensor& a, int64_t d0, int64_t d1) {
  d0 = wrap_dim("transpose", d0, a.dim());
  d1 = wrap_dim("transpose", d1, a.dim());
  Shape s = a.sizes(), st = a.strides();
  if (a.dim() > 0) {
    std::swap(s[d0], s[d1]);
    std::swap(st[d0], st[d1]);
  }
  return record("TransposeBackward", alias(a, s, st, a.offset()), {a},
                [d0, d1](const Tensor& g) { return TensorList{transpose(g, d0, d1)}; });
}

Tensor permute(const Tensor& a, const std::vector<int64_t>& dims) {
  const int64_t n = a.dim();
  TP_CHECK(static_cast<int64_t>(dims.size()) == n, "permute: {} dims given for a tensor of shape {}", dims.size(),
           a.sizes());
  std::vector<int64_t> wrapped(dims.size()), inverse(dims.size());
  std::vector<bool> seen(n, false);
  Shape s(n), st(n);
  for (int64_t i = 0; i < n; ++i) {
    int64_t d = wrap_dim("permute", dims[i], n);
    TP_CHECK(!seen[d], "permute: dims {} repeat dim {}", dims, d);
    seen[d] = true;
    wrapped[i] = d;
    inverse[d] = i;
    s[i] = a.size(d);
    st[i] = a.stride(d);
  }
  return record("PermuteBackward", alias(a, s, st, a.offset()), {a},
                [inverse](const Tensor& g) { return TensorList{permute(g, inverse)}; });
}

Tensor slice(const Tensor& a, int64_t dim, int64_t start, int64_t end, int64_t step) {
  TP_CHECK(a.dim() > 0, "slice: cannot slice a 0-dim tensor");
  dim = wrap_dim("slice", dim, a.dim());
  TP_CHECK(step > 0, "slice: step must be positive, got {}", step);
  const int64_t n = a.size(dim);
  // Python semantics: negative bounds count from the end; out-of-range bounds clamp.
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape s = a.sizes(), st = a.strides();
  s[dim] = (end - start) / step + ((end - start) % step != 0);  // ceil without overflowing for a huge step
  // A step past the end selects one element; its stride is never walked, so clamp it.
  if (s[dim] <= 1) {
    step = 1;
    end = start + s[dim];
  }
  st[dim] = wrapping_add_mul(0, st[dim], step);
  Tensor out = alias(a, s, st, wrapping_add_mul(a.offset(), start, a.stride(dim)));
  Shape in = a.sizes();
  return record("SliceBackward", out, {a}, [in, dim, start, end, step](const Tensor& g) {
    Tensor ga = zeros(in, g.options());
    {
      NoGradGuard raw;  // a kernel copy into the zeros; a recording backward records its adjoint below
      kernels::copy_(slice(ga, dim, start, end, step), g);
    }
    return TensorList{linear_in_grad("SliceBackwardBackward", ga, g, [dim, start, end, step](const Tensor& gg) {
      return slice(gg, dim, start, end, step);
    })};
  });
}

Tensor select(const Tensor& a, int64_t dim, int64_t index) {
  TP_CHECK(a.dim() > 0, "select: cannot select from a 0-dim tensor");
  dim = wrap_dim("select", dim, a.dim());
  const int64_t n = a.size(dim);
  TP_CHECK(index >= -n && index < n, "select: index {} is out of range for dim {} of size {} (tensor shape {})", index,
           dim, n, a.sizes());
  if (index < 0) index += n;
  Shape s = a.sizes(), st = a.strides();
  s.erase(s.begin() + dim);
  st.erase(st.begin() + dim);
  Tensor out = alias(a, s, st, wrapping_add_mul(a.offset(), index, a.stride(dim)));
  Shape in = a.sizes();
  return record("SelectBackward", out, {a}, [in, dim, index](const Tensor& g) {
    Tensor ga = zeros(in, g.options());
    {
      NoGradGuard raw;  // as slice's
      kernels::copy_(select(ga, dim, index), g);
    }
    return TensorList{linear_in_grad("SelectBackwardBackward", ga, g,
                                     [dim, index](const Tensor& gg) { return select(gg, dim, index); })};
  });
}

Tensor expand(const Tensor& a, const Shape& shape_in) {
  const int64_t n = static_cast<int64_t>(shape_in.size()), lead = n - a.dim();
  TP_CHECK(lead >= 0, "expand: cannot expand shape {} to {} (fewer dims)", a.sizes(), shape_in);
  Shape s(n), st(n);
  for (int64_t i = 0; i < n; ++i) {
    int64_t want = shape_in[i];
    if (i < lead) {
      TP_CHECK(want >= 0, "expand: size -1 is not allowed for the new leading dim {} (target {})", i, shape_in);
      s[i] = want;
      st[i] = 0;
      continue;
    }
    int64_t have = a.size(i - lead);
    if (want == -1) want = have;
    TP_CHECK(want >= 0, "expand: invalid size {} for dim {} (target {})", want, i, shape_in);
    TP_CHECK(want == have || have == 1,
             "expand: cannot expand shape {} to {}: dim {} has size {} (only size-1 dims expand)", a.sizes(), shape_in,
             i - lead, have);
    s[i] = want;
    st[i] = have == want ? a.stride(i - lead) : 0;
  }
  // Backward: the engine sums the gradient back to a's shape.
  return record("ExpandBackward", alias(a, s, st, a.offset()), {a}, [](const Tensor& g) { return TensorList{g}; });
}

Tensor unfold(const Tensor& a, int64_t dim, int64_t size, int64_t step) {
  dim = wrap_dim("unfold", dim, a.dim());
  const int64_t n = a.dim() == 0 ? 1 : a.size(dim);
  TP_CHECK(size >= 0, "unfold: size must be non-negative, got {}", size);
  TP_CHECK(step > 0, "unfold: step must be positive, got {}", step);
  TP_CHECK(size <= n, "unfold: window size {} exceeds dim {} of size {} (tensor shape {})", size, dim, n, a.sizes());
  Shape s = a.sizes(), st = a.strides();
  if (a.dim() == 0) {  // a 0-d tensor is one window of `size` (0 or 1) elements, as in PyTorch
    s = {size};
    st = {1};
  } else {
    const int64_t along = st[dim];
    s[dim] = (n - size) / step + 1;
    st[dim] = wrapping_add_mul(0, along, step);
    s.push_back(size);
    st.push_back(along);
  }
  Shape in = a.sizes();
  const int64_t windows = a.dim() == 0 ? 1 : s[dim];
  return record("UnfoldBackward", alias(a, s, st, a.offset()), {a}, [in, dim, size, step, windows](const Tensor& g) {
    Tensor ga = zeros(in, g.options());
    {
      NoGradGuard raw;  // kernel adds into the zeros; a recording backward records the adjoint below
      if (in.empty()) {
        if (size == 1) kernels::copy_(ga, reshape(g, {}));
      } else {
        // Element k of every window: a step-strided slice of the input, which no two windows'
        // k-th elements share, so each k is one in-place add.
        const int64_t last = g.dim() - 1;
        for (int64_t k = 0; k < size && windows > 0; ++k) {
          Tensor dst = slice(ga, dim, k, k + (windows - 1) * step + 1, step);
          kernels::binary_("unfold", kernels::Binary::Add, dst, select(g, last, k));
        }
      }
    }
    return TensorList{linear_in_grad("UnfoldBackwardBackward", ga, g,
                                     [dim, size, step](const Tensor& gg) { return unfold(gg, dim, size, step); })};
  });
}

Tensor squeeze(const Tensor& a) {
  Shape s, st;
  for (int64_t d = 0; d < a.dim(); ++d)
    if (a.size(d) != 1) {
      s.push_back(a.size(d));
      st.push_back(a.stride(d));
    }
  return reshape_backward_node("SqueezeBackward", a, alias(a, s, st, a.offset()));
}

Tensor squeeze(const Tensor& a, int64_t dim) {
  dim = wrap_dim("squeeze", dim, a.dim());
  if (a.dim() == 0 || a.size(dim) != 1) return reshape_backward_node("SqueezeBackward", a, alias(a, a.sizes(), a.strides(), a.offset()));
  Shape s = a.sizes(), st = a.strides();
  s.erase(s.begin() + dim);
  st.erase(st.begin() + dim);
  return reshape_backward_node("SqueezeBackward", a, alias(a, s, st, a.offset()));
}

Tensor unsqueeze(const Tensor& a, int64_t dim) {
  dim = wrap_dim("unsqueeze", dim, a.dim() + 1);
  Shape s = a.sizes(), st = a.strides();
  int64_t stride = dim < a.dim() ? wrapping_add_mul(0, a.stride(dim), a.size(dim)) : 1;
  s.insert(s.begin() + dim, 1);
  st.insert(st.begin() + dim, stride);
  return reshape_backward_node("UnsqueezeBackward", a, alias(a, s, st, a.offset()));
}

Tensor contiguous(const Tensor& a) {
  if (a.is_contiguous()) return a;
  return record("ContiguousBackward", kernels::contiguous(a), {a}, [](const Tensor& g) { return TensorList{g}; });
}

Tensor clone(const Tensor& a) {
  Tensor out = empty(a.sizes(), a.options());
  kernels::copy_(out, a);
  return record("CloneBackward", out, {a}, [](const Tensor& g) { return TensorList{g}; });
}

Tensor to(const Tensor& a, DType dtype) {
  if (a.dtype() == dtype) return a;
  DType in = a.dtype();
  TP_CHECK(!(GradMode::is_enabled() && a.requires_grad() && !is_floating(dtype)),
           "to: cannot convert a tensor that requires grad to {} (gradients need a floating type)", dtype);
  return record("ToBackward", kernels::to_dtype(a, dtype), {a}, [in](const Tensor& g) { return TensorList{to(g, in)}; });
}

Tensor to(const Tensor& a, Device device) {
  if (a.device() == device) return a;
  Device in = a.device();
  return record("ToDeviceBackward", kernels::to_device(a, device), {a},
                [in](const Tensor& g) { return TensorList{to(g, in)}; });
}

}  // namespace tapestry
