// Indexing and joining: index_select / embedding (backward: index_add), gather (backward:
// scatter_add), cat / stack (backward: slices of the gradient), split / chunk (views), dropout.
#include "tapestry/autograd/functions.h"
#include "tapestry/ops/detail/kernels.h"

namespace tapestry {

Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index) {
  dim = wrap_dim("index_select", dim, a.dim());
  Tensor out = kernels::index_select("index_select", a, dim, index);
  Shape in = a.sizes();
  SavedTensor idx(index, "IndexSelectBackward");
  return record("IndexSelectBackward", out, {a}, [in, dim, idx](const Tensor& g) {
    const Tensor i = idx.get();
    return TensorList{linear_in_grad("IndexAddBackward", kernels::index_add(in, dim, i, g), g,
                                     [dim, i](const Tensor& gg) { return index_select(gg, dim, i); })};
  });
}

int64_t normalize_padding_idx(const char* op, int64_t padding_idx, int64_t rows) {
  TP_CHECK(padding_idx >= -rows && padding_idx < rows,
           "{}: padding_idx {} is out of range for {} rows (expected [-{}, {}); a negative index counts from the end, "
           "as in PyTorch; leave it unset for no padding row)",
           op, padding_idx, rows, rows, rows);
  return padding_idx < 0 ? padding_idx + rows : padding_idx;
}

Tensor embedding(const Tensor& weight, const Tensor& ids, std::optional<int64_t> padding) {
  TP_CHECK(weight.dim() == 2, "embedding: weight must be 2-D [vocab, dim], got shape {}", weight.sizes());
  TP_CHECK(ids.dtype() == DType::Int64, "embedding: ids must be int64, got {} {}", ids.dtype(), ids.sizes());
  const int64_t padding_idx = padding ? normalize_padding_idx("embedding", *padding, weight.size(0)) : -1;
  Tensor flat = kernels::contiguous(ids);
  flat = make_tensor(flat.impl().storage, {flat.numel()}, {1}, flat.offset(), DType::Int64);
  Tensor rows = kernels::index_select("embedding", weight, 0, flat);  // (N, D)
  Shape out_shape = ids.sizes();
  out_shape.push_back(weight.size(1));
  Tensor out = make_tensor(rows.impl().storage, out_shape, contiguous_strides(out_shape), 0, rows.dtype());
  Shape in = weight.sizes();
  SavedTensor saved_ids(flat, "EmbeddingBackward");  // flat may share the caller's ids storage
  return record("EmbeddingBackward", out, {weight}, [in, saved_ids, padding_idx](const Tensor& g) {
    Tensor ids_flat = saved_ids.get();
    Tensor g2 = reshape(g, {ids_flat.numel(), in[1]});
    Tensor gw = kernels::index_add(in, 0, ids_flat, g2);
    if (padding_idx >= 0) kernels::fill_(select(gw, 0, padding_idx), 0.0);
    // Its adjoint: the rows looked up again, the padding row's gradient zero.
    return TensorList{linear_in_grad("EmbeddingBackwardBackward", gw, g2, [ids_flat, padding_idx](const Tensor& gg) {
      Tensor rows = index_select(gg, 0, ids_flat);
      return padding_idx >= 0 ? where(unsqueeze(ne(ids_flat, static_cast<double>(padding_idx)), 1), rows, 0.0) : rows;
    })};
  });
}

Tensor gather(const Tensor& a, int64_t dim, const Tensor& index) {
  dim = wrap_dim("gather", dim, a.dim());
  Tensor out = kernels::gather(a, dim, index);
  Shape in = a.sizes();
  SavedTensor idx(index, "GatherBackward");
  return record("GatherBackward", out, {a}, [in, dim, idx](const Tensor& g) {
    const Tensor i = idx.get();
    return TensorList{linear_in_grad("GatherBackwardBackward", kernels::scatter(in, dim, i, g, true), g,
                                     [dim, i](const Tensor& gg) { return gather(gg, dim, i); })};
  });
}

namespace {

// The checks torch.scatter makes, then src cut down to index's shape (PyTorch reads only that
// corner of a larger src).
Tensor scatter_source(const char* op, const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
  TP_CHECK(index.dtype() == DType::Int64, "{}: index must be int64, got {} {}", op, index.dtype(), index.sizes());
  TP_CHECK(src.dtype() == a.dtype(), "{}: src dtype {} must equal the input's {}", op, src.dtype(), a.dtype());
  TP_CHECK(index.dim() == a.dim() && src.dim() == a.dim(),
           "{}: input {}, index {} and src {} must have the same number of dims", op, a.sizes(), index.sizes(),
           src.sizes());
  Tensor cut = src;
  for (int64_t d = 0; d < index.dim(); ++d) {
    TP_CHECK(index.size(d) <= src.size(d), "{}: index shape {} exceeds src shape {} at dim {}", op, index.sizes(),
             src.sizes(), d);
    TP_CHECK(d == dim || index.size(d) <= a.size(d), "{}: index shape {} exceeds input shape {} at dim {}", op,
             index.sizes(), a.sizes(), d);
    if (index.size(d) < src.size(d)) cut = slice(cut, d, 0, index.size(d));
  }
  return cut;
}

// zeros(shape) with src scattered into it: the differentiable core of scatter and scatter_add,
// whose gradient for src gathers the output's gradient back from the indices.
Tensor scattered(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src, bool accumulate) {
  Tensor out = kernels::scatter(shape, dim, index, src, accumulate);
  SavedTensor idx(index, "ScatterBackward");
  return record(accumulate ? "ScatterAddBackward" : "ScatterBackward", out, {src}, [dim, idx](const Tensor& g) {
    const Tensor i = idx.get();
    Shape gs = g.sizes();
    return TensorList{linear_in_grad("ScatterBackwardBackward", kernels::gather(g, dim, i), g,
                                     [gs, dim, i](const Tensor& gg) { return scattered(gs, dim, i, gg, true); })};
  });
}

}  // namespace

Tensor scatter(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
  dim = wrap_dim("scatter", dim, a.dim());
  Tensor cut = scatter_source("scatter", a, dim, index, src);
  // Which elements receive a value: scatter 1s (no gradient) and test them.
  Tensor marks = ones(index.sizes(), TensorOptions(DType::Float32, a.device()));
  Tensor written = ne(kernels::scatter(a.sizes(), dim, index, marks, false), 0.0);
  return where(written, scattered(a.sizes(), dim, index, cut, false), a);
}

Tensor scatter(const Tensor& a, int64_t dim, const Tensor& index, double value) {
  return scatter(a, dim, index, full(index.sizes(), value, TensorOptions(a.dtype(), a.device())));
}

Tensor scatter_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
  dim = wrap_dim("scatter_add", dim, a.dim());
  Tensor cut = scatter_source("scatter_add", a, dim, index, src);
  return add(a, scattered(a.sizes(), dim, index, cut, true));
}

Tensor cat(const TensorList& tensors, int64_t dim) {
  Tensor out = kernels::cat(tensors, dim);
  dim = wrap_dim("cat", dim, tensors[0].dim());
  std::vector<int64_t> lengths;
  for (const Tensor& t : tensors) lengths.push_back(t.size(dim));
  return record("CatBackward", out, tensors, [lengths, dim](const Tensor& g) {
    TensorList grads;
    int64_t pos = 0;
    for (int64_t len : lengths) {
      grads.push_back(slice(g, dim, pos, pos + len));
      pos += len;
    }
    return grads;
  });
}

Tensor stack(const TensorList& tensors, int64_t dim) {
  TP_CHECK(!tensors.empty(), "stack: expected a non-empty list of tensors");
  dim = wrap_dim("stack", dim, tensors[0].dim() + 1);
  TensorList parts;
  for (size_t i = 0; i < tensors.size(); ++i) {
    TP_CHECK(tensors[i].sizes() == tensors[0].sizes(), "stack: tensor {} has shape {} but tensor 0 has shape {}", i,
             tensors[i].sizes(), tensors[0].sizes());
    parts.push_back(unsqueeze(tensors[i], dim));
  }
  return cat(parts, dim);
}

TensorList split(const Tensor& a, int64_t split_size, int64_t dim) {
  TP_CHECK(a.dim() > 0, "split: cannot split a 0-dim tensor");
  dim = wrap_dim("split", dim, a.dim());
  TP_CHECK(split_size > 0 || (split_size == 0 && a.size(dim) == 0),
           "split: split_size must be positive (0 only for an empty dim), got {} for dim {} of size {}", split_size, dim,
           a.size(dim));
  TensorList parts;
  for (int64_t pos = 0; pos < a.size(dim); pos += split_size) parts.push_back(slice(a, dim, pos, pos + split_size));
  if (parts.empty()) parts.push_back(a);
  return parts;
}

TensorList chunk(const Tensor& a, int64_t chunks, int64_t dim) {
  TP_CHECK(chunks > 0, "chunk: the number of chunks must be positive, got {}", chunks);
  TP_CHECK(a.dim() > 0, "chunk: cannot chunk a 0-dim tensor");
  dim = wrap_dim("chunk", dim, a.dim());
  int64_t n = a.size(dim);
  if (n == 0) return TensorList(static_cast<size_t>(chunks), slice(a, dim, 0, 0));  // as PyTorch: `chunks` empty parts
  return split(a, (n + chunks - 1) / chunks, dim);
}

namespace {
// The mask of `seed`, applied: dropout's backward is the same op on the gradient (self-adjoint),
// so that a recording backward records it too.
Tensor dropout_with_seed(const Tensor& a, double p, uint64_t seed) {
  return record("DropoutBackward", kernels::dropout(a, p, seed), {a}, [p, seed](const Tensor& g) {
    return TensorList{dropout_with_seed(g, p, seed)};
  });
}
}  // namespace

Tensor dropout(const Tensor& a, double p, bool training, Generator* gen) {
  TP_CHECK(p >= 0 && p <= 1, "dropout: probability must be in [0, 1], got {}", p);
  if (!training || p == 0) return a;
  if (p == 1) return mul(a, 0.0);
  // One draw from the generator seeds the whole mask; backward regenerates the same mask from
  // the seed instead of keeping it.
  const uint64_t seed = (gen ? *gen : default_generator()).engine()();
  return dropout_with_seed(a, p, seed);
}

}  // namespace tapestry
