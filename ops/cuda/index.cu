// CUDA indexing kernels: index_select / index_add (embedding lookup and its backward), gather /
// scatter(_add), and cat.
//
// Design:
// - Shape and dtype checks are the CPU's (ops/cpu/index.cpp), with its messages. Index values are
//   range-checked on the device instead, in the kernel that uses them: an index outside
//   [0, size) (the CPU allows no negative index) is recorded with report_error and its access
//   skipped, and the next synchronisation throws naming the op, the index and the size. Index
//   data is never copied to the host, so a lookup does not stall the stream.
// - Inputs are read through their strides (StridedIndexer, the indexed dim's stride zeroed and
//   added back as index * stride), so views need no copies; outputs are fresh and contiguous.
// - index_add and scatter_add may add several sources into one element: atomicAdd (float and
//   double natively on sm_80/sm_90; int64 as unsigned long long, which two's complement makes
//   the same sum). The order of the additions, and so float rounding, is not fixed.
// - cat copies each input into a narrow view of the output with the backend's strided copy_.
#include <vector>

#include "tapestry/ops/cuda/common.cuh"

namespace tapestry::kernels::cuda {

namespace {

void check_index_dtype(const char* op, const Tensor& index) {
  TP_CHECK(index.dtype() == DType::Int64, "{}: index must be int64, got {} {}", op, index.dtype(), index.sizes());
}

// The index values as a flat list read with one stride: a 1-D index in place, any other shape
// (0-d included) contiguous.
struct IndexList {
  Tensor values;
  int64_t stride = 1;
};
IndexList index_list(const Tensor& index) {
  if (index.dim() == 1) return {index, index.stride(0)};
  return {contiguous(index), 1};
}

// A zero-filled contiguous tensor (the accumulators); all-zero bytes are 0 in every dtype.
Tensor zeros_on(const char* op, const Shape& shape, DType dtype, Device device) {
  Tensor out = empty_on(shape, dtype, device);
  const size_t nbytes = static_cast<size_t>(out.numel()) * dtype_size(dtype);
  if (nbytes > 0) TP_CUDA_CHECK(cudaMemsetAsync(out.raw_data(), 0, nbytes, stream()), op);
  return out;
}

__device__ inline void atomic_add(float* p, float v) { atomicAdd(p, v); }
__device__ inline void atomic_add(double* p, double v) { atomicAdd(p, v); }
__device__ inline void atomic_add(int64_t* p, int64_t v) {
  atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
}

__device__ inline bool index_ok(int64_t v, int64_t size, DeviceError* flag, int opid) {
  if (v >= 0 && v < size) return true;
  report_error(flag, kIndexOutOfRange, opid, v, size);
  return false;
}

// Checks a list of index values only: for index_select when the output is empty (another dim is
// 0) but the index is not, where the CPU still refuses bad values.
__global__ void check_index_kernel(const int64_t* index, int64_t stride, int64_t count, int64_t size,
                                   DeviceError* flag, int opid) {
  TP_GRID_STRIDE(j, count) index_ok(index[j * stride], size, flag, opid);
}

// out (contiguous, [outer, count, inner]) = a's slices at the index values along dim. ix walks
// out's shape with a's strides, the indexed dim's stride zeroed; index * dim_stride is added.
template <class T>
__global__ void index_select_kernel(StridedIndexer<1> ix, T* out, const T* a, const int64_t* index,
                                    int64_t index_stride, int64_t count, int64_t inner, int64_t size,
                                    int64_t dim_stride, int64_t n, DeviceError* flag, int opid) {
  TP_GRID_STRIDE(i, n) {
    const int64_t v = index[((i / inner) % count) * index_stride];
    if (!index_ok(v, size, flag, opid)) continue;
    int64_t off[1];
    ix.offsets(i, off);
    out[i] = a[off[0] + v * dim_stride];
  }
}

// out (contiguous, [outer, size, inner]) += src ([outer, count, inner] in row-major order, read
// through ix) at the index values along the middle dim.
template <class T>
__global__ void index_add_kernel(StridedIndexer<1> ix, T* out, const T* src, const int64_t* index,
                                 int64_t index_stride, int64_t count, int64_t inner, int64_t size, int64_t n,
                                 DeviceError* flag, int opid) {
  TP_GRID_STRIDE(i, n) {
    const int64_t row = i / inner, c = i % inner;
    const int64_t v = index[(row % count) * index_stride];
    if (!index_ok(v, size, flag, opid)) continue;
    int64_t off[1];
    ix.offsets(i, off);
    atomic_add(out + ((row / count) * size + v) * inner + c, src[off[0]]);
  }
}

// out (contiguous, index's shape) = a at the index value along dim. ix walks index's shape:
// operand 0 is index, operand 1 is a with the dim's stride zeroed.
template <class T>
__global__ void gather_kernel(StridedIndexer<2> ix, T* out, const T* a, const int64_t* index, int64_t size,
                              int64_t dim_stride, int64_t n, DeviceError* flag, int opid) {
  TP_GRID_STRIDE(i, n) {
    int64_t off[2];
    ix.offsets(i, off);
    const int64_t v = index[off[0]];
    if (!index_ok(v, size, flag, opid)) continue;
    out[i] = a[off[1] + v * dim_stride];
  }
}

// out += src (or out = src) at the index value along dim. ix walks index's shape: operand 0 is out with the
// dim's stride zeroed, 1 is index, 2 is src.
template <class T, bool Accumulate>
__global__ void scatter_kernel(StridedIndexer<3> ix, T* out, const T* src, const int64_t* index, int64_t size,
                                   int64_t dim_stride, int64_t n, DeviceError* flag, int opid) {
  TP_GRID_STRIDE(i, n) {
    int64_t off[3];
    ix.offsets(i, off);
    const int64_t v = index[off[1]];
    if (!index_ok(v, size, flag, opid)) continue;
    if constexpr (Accumulate) {
      atomic_add(out + off[0] + v * dim_stride, src[off[2]]);
    } else {
      out[off[0] + v * dim_stride] = src[off[2]];  // duplicates: one of the stores wins
    }
  }
}

void check_gather_shapes(const char* op, const Shape& a, int64_t dim, const Tensor& index) {
  if (index.numel() == 0) return;  // an empty index reads and writes nothing (PyTorch's gather checks no shapes then)
  TP_CHECK(index.dim() == static_cast<int64_t>(a.size()),
           "{}: index of shape {} must have as many dims as the input {}", op, index.sizes(), a);
  for (int64_t d = 0; d < index.dim(); ++d)
    if (d != dim)
      TP_CHECK(index.size(d) <= a[d], "{}: index shape {} exceeds input shape {} at dim {}", op, index.sizes(), a, d);
}

}  // namespace

Tensor index_select(const char* op, const Tensor& a, int64_t dim, const Tensor& index_in) {
  dim = wrap_dim(op, dim, a.dim());
  TP_CHECK(index_in.dim() <= 1, "{}: index must be 0-D or 1-D, got shape {}", op, index_in.sizes());
  // A 0-d source has one element to select, and its 0-d output room for one (as in PyTorch).
  TP_CHECK(a.dim() > 0 || index_in.numel() == 1, "{}: a 0-d tensor takes exactly one index, got {}", op,
           index_in.numel());
  check_index_dtype(op, index_in);
  const IndexList index = index_list(index_in);
  const int64_t size = a.dim() == 0 ? 1 : a.size(dim);
  const int64_t count = index_in.numel();
  Shape out_shape = a.sizes();
  if (!out_shape.empty()) out_shape[dim] = count;
  Tensor out = empty_on(out_shape, a.dtype(), a.device());
  if (count == 0) return out;
  const int opid = op_id(op);
  const int64_t n = out.numel();
  if (n == 0) {
    check_index_kernel<<<blocks_for(count), kThreads, 0, stream()>>>(index.values.data_ptr<int64_t>(), index.stride,
                                                                     count, size, device_error(), opid);
    TP_CUDA_LAUNCHED(op);
    return out;
  }
  Shape a_strides = a.strides();
  const int64_t dim_stride = a.dim() == 0 ? 0 : a_strides[dim];
  if (a.dim() > 0) a_strides[dim] = 0;
  const StridedIndexer<1> ix = make_indexer<1>(out_shape, {a_strides});
  const int64_t inner = split_at(out_shape, dim).inner;
  dispatch(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    index_select_kernel<T><<<blocks_for(n), kThreads, 0, stream()>>>(
        ix, out.data_ptr<T>(), a.data_ptr<T>(), index.values.data_ptr<int64_t>(), index.stride, count, inner, size,
        dim_stride, n, device_error(), opid);
    TP_CUDA_LAUNCHED(op);
  });
  return out;
}

Tensor index_add(const Shape& shape, int64_t dim, const Tensor& index_in, const Tensor& src) {
  Tensor out = zeros_on("index_add", shape, src.dtype(), src.device());
  const DimSplit s = split_at(shape, dim);
  const int64_t count = index_in.numel();
  dispatch_numeric(src.dtype(), "index_add", [&](auto tag) {
    using T = typename decltype(tag)::type;
    // The CPU reads src as contiguous [outer, count, inner]; a src of another size would be read
    // out of bounds.
    TP_CHECK(src.numel() == s.outer * count * s.inner,
             "index_add: src of shape {} does not hold {} slices of shape {} along dim {}", src.sizes(), count, shape,
             dim);
    const int64_t n = src.numel();
    if (n == 0) return;
    const IndexList index = index_list(index_in);
    const StridedIndexer<1> ix = make_indexer<1>(src.sizes(), {src.strides()});
    index_add_kernel<T><<<blocks_for(n), kThreads, 0, stream()>>>(
        ix, out.data_ptr<T>(), src.data_ptr<T>(), index.values.data_ptr<int64_t>(), index.stride, count, s.inner,
        s.n, n, device_error(), op_id("index_add"));
    TP_CUDA_LAUNCHED("index_add");
  });
  return out;
}

Tensor gather(const Tensor& a, int64_t dim, const Tensor& index) {
  dim = wrap_dim("gather", dim, a.dim());
  check_gather_shapes("gather", a.sizes(), dim, index);
  check_index_dtype("gather", index);
  Tensor out = empty_on(index.sizes(), a.dtype(), a.device());
  const int64_t n = out.numel();
  if (n == 0) return out;
  const int64_t size = a.dim() == 0 ? 1 : a.size(dim);
  Shape a_strides = a.strides();
  const int64_t dim_stride = a.dim() == 0 ? 0 : a_strides[dim];
  if (a.dim() > 0) a_strides[dim] = 0;
  const StridedIndexer<2> ix = make_indexer<2>(index.sizes(), {index.strides(), a_strides});
  dispatch(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    gather_kernel<T><<<blocks_for(n), kThreads, 0, stream()>>>(ix, out.data_ptr<T>(), a.data_ptr<T>(),
                                                               index.data_ptr<int64_t>(), size, dim_stride, n,
                                                               device_error(), op_id("gather"));
    TP_CUDA_LAUNCHED("gather");
  });
  return out;
}

Tensor scatter(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src, bool accumulate) {
  const char* op = accumulate ? "scatter_add" : "scatter";
  dim = wrap_dim(op, dim, static_cast<int64_t>(shape.size()));
  check_gather_shapes(op, shape, dim, index);
  check_index_dtype(op, index);
  TP_CHECK(src.sizes() == index.sizes(), "{}: src shape {} must equal index shape {}", op, src.sizes(), index.sizes());
  Tensor out = zeros_on(op, shape, src.dtype(), src.device());
  Shape o_strides = out.strides();
  const int64_t size = shape.empty() ? 1 : shape[dim];
  const int64_t dim_stride = shape.empty() ? 0 : o_strides[dim];
  if (!shape.empty()) o_strides[dim] = 0;
  dispatch_numeric(src.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t n = index.numel();
    if (n == 0) return;
    const StridedIndexer<3> ix = make_indexer<3>(index.sizes(), {o_strides, index.strides(), src.strides()});
    auto launch = [&](auto kernel) {
      kernel<<<blocks_for(n), kThreads, 0, stream()>>>(ix, out.data_ptr<T>(), src.data_ptr<T>(),
                                                       index.data_ptr<int64_t>(), size, dim_stride, n, device_error(),
                                                       op_id(op));
    };
    if (accumulate) {
      launch(scatter_kernel<T, true>);
    } else {
      launch(scatter_kernel<T, false>);
    }
    TP_CUDA_LAUNCHED(op);
  });
  return out;
}

}  // namespace tapestry::kernels::cuda
