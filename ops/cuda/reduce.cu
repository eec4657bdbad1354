// CUDA reductions, the kernels::cuda half of ops/cpu/reduce.cpp: sum/max/min over any set of
// dims, sum_of_squares, max/min with indices over one dim, and the row-wise kernels softmax /
// log_softmax and layer norm with their backward passes. Semantics, checks, messages, dtype rules
// and accumulation precision are the CPU's (float32 accumulates in double); read them there.
//
// Design. Every reduction is brought to rows: the reduced dims are moved last through a view
// (make_tensor with permuted sizes and strides), made contiguous when that view is not, so each
// output reads one contiguous row. A row is reduced by a group of G threads (G = 32 to 256: a warp
// or several, chosen from the row length; kThreads / G rows per block): each thread combines a
// strided share of the row, then a warp butterfly of shuffles and, for G > 32, the warps' results
// combined in order from shared memory (group_reduce). Rows longer than kChunk are cut into
// chunks, each reduced by its own group into a partial, and the partials are reduced again the
// same way. Column sums (a contiguous input reduced over its leading dims, as bias gradients are,
// and layer norm's dweight/dbias) skip the transposing copy: each thread adds one column over a
// fixed block of rows into a partial, and a second kernel adds a column's partials in block order.
//
// Determinism: chunks, group sizes and row blocks depend on the shape only and every combination
// happens in a fixed order (no atomics), so results are bit-identical from run to run. They are not
// bit-identical to the CPU's, which adds in another order; both accumulate float32 in double, so
// they agree to float32 rounding. softmax uses vexp, as the CPU does.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "tapestry/ops/cuda/group_reduce.cuh"

namespace tapestry::kernels::cuda {

namespace {

// Rows longer than this are reduced in chunks, one group of threads per chunk.
constexpr int64_t kChunk = 16384;
// Column sums cut the rows into at most kMaxRowBlocks blocks of at least kMinRowBlock rows, so the
// second pass adds at most kMaxRowBlocks partials per column.
constexpr int64_t kMaxRowBlocks = 256, kMinRowBlock = 32;

// ---- combining operators: an identity and a commutative combine (so every lane of a shuffle
// butterfly ends with the same value)

template <class T> __device__ T lowest_value() {
  if constexpr (std::is_floating_point_v<T>) return -std::numeric_limits<T>::infinity();
  else return std::numeric_limits<T>::lowest();
}
template <class T> __device__ T highest_value() {
  if constexpr (std::is_floating_point_v<T>) return std::numeric_limits<T>::infinity();
  else return std::numeric_limits<T>::max();
}

template <class A> struct SumOp {
  __device__ A identity() const { return A(0); }
  __device__ A operator()(A x, A y) const { return x + y; }
};
// NaN wins and sticks, as on the CPU (op::Maximum is torch.maximum's rule).
template <class A> struct MaxOp {
  __device__ A identity() const { return lowest_value<A>(); }
  __device__ A operator()(A x, A y) const { return op::Maximum{}(x, y); }
};
template <class A> struct MinOp {
  __device__ A identity() const { return highest_value<A>(); }
  __device__ A operator()(A x, A y) const { return op::Minimum{}(x, y); }
};

// A value and where it was found, for max/min with indices.
template <class T> struct ValIdx {
  T value;
  int64_t index;
};
// The CPU's answer whatever the order of combination: the first NaN if there is one, else the
// first occurrence of the best value (ties go to the lower index).
template <class T, bool kMax> struct ArgBest {
  __device__ ValIdx<T> identity() const {
    return {kMax ? lowest_value<T>() : highest_value<T>(), std::numeric_limits<int64_t>::max()};
  }
  __device__ ValIdx<T> operator()(const ValIdx<T>& a, const ValIdx<T>& b) const {
    const bool a_nan = is_nan(a.value), b_nan = is_nan(b.value);
    if (a_nan != b_nan) return a_nan ? a : b;
    if (a_nan || a.value == b.value) return a.index < b.index ? a : b;
    return (kMax ? a.value > b.value : a.value < b.value) ? a : b;
  }
};

// What a reduction reads from an input element, in the accumulator type.
template <class A> struct Cast {
  template <class V> __device__ A operator()(V v) const { return static_cast<A>(v); }
};
struct Square {  // in double: a float of 1e20 squares to a finite 1e40
  template <class V> __device__ double operator()(V v) const {
    const double d = static_cast<double>(v);
    return d * d;
  }
};

// ---- group reductions (group_reduce.cuh); a value with its index shuffles as its two parts

template <class T> __device__ ValIdx<T> shfl_xor(const ValIdx<T>& v, int lane_mask) {
  return {cuda::shfl_xor(v.value, lane_mask), cuda::shfl_xor(v.index, lane_mask)};  // the scalar overloads
}

struct RowGroups {
  dim3 grid, block;
};
RowGroups row_groups(int64_t rows, int64_t row_len) {
  const int group = group_size(row_len);
  return {dim3(blocks_for(rows, kThreads / group)), dim3(group, kThreads / group)};
}

// The loop of a row-group kernel: `first` is the first of the block's rows, kept uniform across
// the block (group_reduce synchronises it); a thread's row is first + threadIdx.y.
#define TP_ROW_GROUPS(first, rows)                                                        \
  for (int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.y); first < (rows);      \
       first += static_cast<int64_t>(gridDim.x) * blockDim.y)

// ---- row and column reductions

// Segment s is chunk s % n_chunks of contiguous row s / n_chunks: elements [c * chunk, (c + 1) *
// chunk) clipped to the row; out[s] = its reduction.
template <class In, class A, class Out, class Load, class Op>
__global__ void reduce_rows_kernel(const In* in, Out* out, int64_t segments, int64_t row_len, int64_t chunk,
                                   int64_t n_chunks, Load load, Op combine) {
  TP_ROW_GROUPS(first, segments) {
    const int64_t seg = first + threadIdx.y;
    A acc = combine.identity();
    if (seg < segments) {
      const int64_t row = seg / n_chunks, begin = (seg % n_chunks) * chunk;
      const int64_t end = begin + chunk < row_len ? begin + chunk : row_len;
      const In* p = in + row * row_len;
      for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) acc = combine(acc, load(p[i]));
    }
    acc = group_reduce(acc, combine);
    if (seg < segments && threadIdx.x == 0) out[seg] = static_cast<Out>(acc);
  }
}

// out[r] = the reduction of row r of a contiguous [rows, row_len] input (rows > 0).
template <class In, class A, class Out, class Load, class Op>
void reduce_rows(const char* op, Device device, const In* in, Out* out, int64_t rows, int64_t row_len, Load load,
                 Op combine) {
  const int64_t n_chunks = row_len > kChunk ? (row_len + kChunk - 1) / kChunk : 1;
  const int64_t chunk = n_chunks > 1 ? kChunk : row_len;
  const RowGroups lg = row_groups(rows * n_chunks, chunk);
  if (n_chunks == 1) {
    reduce_rows_kernel<In, A, Out, Load, Op><<<lg.grid, lg.block, 0, stream()>>>(in, out, rows, row_len, chunk, 1,
                                                                                  load, combine);
    TP_CUDA_LAUNCHED(op);
    return;
  }
  // One partial per chunk, then the partials reduced as rows of their own. The partials go back
  // to the allocator on return, with the kernels that read them queued but maybe not run: safe,
  // as freed memory only goes to work queued later on the same stream (Note [One stream]).
  Tensor partial = empty_on({rows, n_chunks}, dtype_of<A>(), device);
  A* partial_data = partial.data_ptr<A>();
  reduce_rows_kernel<In, A, A, Load, Op><<<lg.grid, lg.block, 0, stream()>>>(in, partial_data, rows * n_chunks,
                                                                              row_len, chunk, n_chunks, load, combine);
  TP_CUDA_LAUNCHED(op);
  reduce_rows<A, A, Out, Cast<A>, Op>(op, device, partial_data, out, rows, n_chunks, Cast<A>{}, combine);
}

// ---- sums of squares over many tensors (gradient norms)

// Up to kSquaresTable tensors of one dtype per launch, passed by value as a kernel argument (no
// copy of a pointer table to the device, so no synchronisation).
constexpr int kSquaresTable = 32;
template <class T> struct SquaresTable {
  const T* data[kSquaresTable];
  int64_t numel[kSquaresTable];
  int64_t first_segment[kSquaresTable + 1];  // tensor t owns segments [first_segment[t], first_segment[t + 1])
  int count;
};

// Segment s is chunk s - first_segment[t] (kChunk elements) of the tensor t that owns it; one group
// of threads per segment writes its sum of squares (in double) to partial[s].
template <class T>
__global__ void sum_of_squares_many_kernel(SquaresTable<T> table, double* partial, int64_t segments) {
  TP_ROW_GROUPS(first, segments) {
    const int64_t seg = first + threadIdx.y;
    double acc = 0;
    if (seg < segments) {
      int t = 0;
      while (t + 1 < table.count && table.first_segment[t + 1] <= seg) ++t;
      const int64_t begin = (seg - table.first_segment[t]) * kChunk;
      const int64_t end = begin + kChunk < table.numel[t] ? begin + kChunk : table.numel[t];
      const T* p = table.data[t];
      for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) acc += Square{}(p[i]);
    }
    acc = group_reduce(acc, SumOp<double>{});
    if (seg < segments && threadIdx.x == 0) partial[seg] = acc;
  }
}

// Rows cut into blocks for column sums, by the shape only.
struct RowBlocks {
  int64_t rows_per_block, count;
};
RowBlocks row_blocks(int64_t rows) {
  const int64_t per_block = std::max(kMinRowBlock, (rows + kMaxRowBlocks - 1) / kMaxRowBlocks);
  return {per_block, (rows + per_block - 1) / per_block};
}

// partial[b][c] = column c of a contiguous [rows, cols] input reduced over row block b, in row
// order. Neighbouring threads read neighbouring columns: the reads coalesce.
template <class In, class A, class Load, class Op>
__global__ void reduce_columns_kernel(const In* in, A* partial, int64_t rows, int64_t cols, RowBlocks blocks,
                                      Load load, Op combine) {
  TP_GRID_STRIDE(i, blocks.count * cols) {
    const int64_t b = i / cols, c = i - b * cols;
    const int64_t r0 = b * blocks.rows_per_block;
    const int64_t r1 = r0 + blocks.rows_per_block < rows ? r0 + blocks.rows_per_block : rows;
    A acc = combine.identity();
    for (int64_t r = r0; r < r1; ++r) acc = combine(acc, load(in[r * cols + c]));
    partial[i] = acc;
  }
}

// out[c] = column c's partials combined in block order (zero blocks: the identity).
template <class A, class Out, class Op>
__global__ void combine_columns_kernel(const A* partial, Out* out, int64_t n_blocks, int64_t cols, Op combine) {
  TP_GRID_STRIDE(c, cols) {
    A acc = combine.identity();
    for (int64_t b = 0; b < n_blocks; ++b) acc = combine(acc, partial[b * cols + c]);
    out[c] = static_cast<Out>(acc);
  }
}

// out[c] = the reduction of column c of a contiguous [rows, cols] input (rows, cols > 0).
template <class In, class A, class Out, class Op>
void reduce_columns(const char* op, Device device, const In* in, Out* out, int64_t rows, int64_t cols, Op combine) {
  const RowBlocks blocks = row_blocks(rows);
  Tensor partial = empty_on({blocks.count, cols}, dtype_of<A>(), device);
  reduce_columns_kernel<In, A, Cast<A>, Op><<<blocks_for(blocks.count * cols), kThreads, 0, stream()>>>(
      in, partial.data_ptr<A>(), rows, cols, blocks, Cast<A>{}, combine);
  TP_CUDA_LAUNCHED(op);
  combine_columns_kernel<A, Out, Op><<<blocks_for(cols), kThreads, 0, stream()>>>(partial.data_ptr<A>(), out,
                                                                                  blocks.count, cols, combine);
  TP_CUDA_LAUNCHED(op);
}

// One reduction kind and dtype: `in` is [n_red, n_out] contiguous when `columns`, else
// [n_out, n_red] contiguous.
template <class In, class A, class Out, class Op>
void reduce_as(const char* op, const Tensor& in, bool columns, int64_t n_out, int64_t n_red, const Tensor& out,
               Op combine) {
  const In* data = in.data_ptr<In>();
  Out* result = out.data_ptr<Out>();
  if (columns) reduce_columns<In, A, Out>(op, in.device(), data, result, n_red, n_out, combine);
  else reduce_rows<In, A, Out>(op, in.device(), data, result, n_out, n_red, Cast<A>{}, combine);
}

// ---- max/min with indices

template <class T, class Best>
__global__ void reduce_with_index_kernel(const T* in, T* values, int64_t* indices, int64_t rows, int64_t n,
                                         Best best) {
  TP_ROW_GROUPS(first, rows) {
    const int64_t row = first + threadIdx.y;
    ValIdx<T> acc = best.identity();
    if (row < rows)
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc = best(acc, ValIdx<T>{in[row * n + i], i});
    acc = group_reduce(acc, best);
    if (row < rows && threadIdx.x == 0) {
      values[row] = acc.value;
      indices[row] = acc.index;
    }
  }
}

// ---- topk: k rounds per row, each the best element that ranks after the previous round's pick,
// in the CPU's order (largest: NaN first, then values descending; smallest: values ascending,
// NaN last; ties by lower index), so the selection is the CPU's exactly.

template <class T, bool kLargest> struct TopkOrder {
  // Whether a ranks before b (a strict total order: indices differ).
  __device__ bool before(const ValIdx<T>& a, const ValIdx<T>& b) const {
    const bool a_nan = is_nan(a.value), b_nan = is_nan(b.value);
    if (a_nan != b_nan) return kLargest ? a_nan : b_nan;
    if (a_nan || a.value == b.value) return a.index < b.index;
    return kLargest ? a.value > b.value : a.value < b.value;
  }
  // index -1: no element yet (loses to every element).
  __device__ ValIdx<T> identity() const { return {T(0), -1}; }
  __device__ ValIdx<T> operator()(const ValIdx<T>& a, const ValIdx<T>& b) const {
    if (a.index < 0) return b;
    if (b.index < 0) return a;
    return before(a, b) ? a : b;
  }
};

template <class T, bool kLargest>
__global__ void topk_kernel(const T* in, T* values, int64_t* indices, int64_t rows, int64_t n, int64_t k) {
  const TopkOrder<T, kLargest> order;
  TP_ROW_GROUPS(first, rows) {
    const int64_t row = first + threadIdx.y;
    ValIdx<T> prev = order.identity();
    for (int64_t j = 0; j < k; ++j) {  // k is the same for every thread: group_reduce's barriers match
      ValIdx<T> acc = order.identity();
      if (row < rows)
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
          const ValIdx<T> c{in[row * n + i], i};
          if (prev.index < 0 || order.before(prev, c)) acc = order(acc, c);
        }
      acc = group_reduce(acc, order);
      if (row < rows && threadIdx.x == 0) {
        values[row * k + j] = acc.value;
        indices[row * k + j] = acc.index;
      }
      prev = acc;
    }
  }
}

// ---- softmax over one dim of a contiguous tensor viewed as [outer, n, inner]: row r starts at
// (r / inner) * n * inner + r % inner and steps by inner (the last dim: inner = 1, contiguous rows)

template <class T>
__global__ void softmax_kernel(const T* x, T* y, DimSplit rv, bool log) {
  const int64_t rows = rv.outer * rv.inner, s = rv.inner;
  TP_ROW_GROUPS(first, rows) {
    const int64_t row = first + threadIdx.y;
    const bool valid = row < rows;
    const int64_t base = valid ? (row / s) * rv.n * s + row % s : 0;
    const T* xr = x + base;
    T mx = lowest_value<T>();
    if (valid)
      for (int64_t i = threadIdx.x; i < rv.n; i += blockDim.x) mx = MaxOp<T>{}(mx, xr[i * s]);
    mx = group_reduce(mx, MaxOp<T>{});
    // A row masked entirely to -inf has no max to subtract: softmax gives NaN, as in PyTorch.
    double sum = 0;
    if (valid)
      for (int64_t i = threadIdx.x; i < rv.n; i += blockDim.x) sum += vexp(xr[i * s] - mx);
    sum = group_reduce(sum, SumOp<double>{});
    if (!valid) continue;
    T* yr = y + base;
    if (log) {
      // (x - max) - log(sum), as the CPU kernel: max + log(sum) would round the log-sum away.
      const T log_sum = static_cast<T>(math::log(sum));
      for (int64_t i = threadIdx.x; i < rv.n; i += blockDim.x) yr[i * s] = (xr[i * s] - mx) - log_sum;
    } else {
      const T inv = static_cast<T>(1.0 / sum);
      for (int64_t i = threadIdx.x; i < rv.n; i += blockDim.x) yr[i * s] = vexp(xr[i * s] - mx) * inv;
    }
  }
}

template <class T>
__global__ void softmax_backward_kernel(const T* y, const T* dy, T* dx, DimSplit rv, bool log) {
  const int64_t rows = rv.outer * rv.inner, s = rv.inner;
  TP_ROW_GROUPS(first, rows) {
    const int64_t row = first + threadIdx.y;
    const bool valid = row < rows;
    const int64_t base = valid ? (row / s) * rv.n * s + row % s : 0;
    const T* yr = y + base;
    const T* gr = dy + base;
    double dot = 0;
    if (valid)
      for (int64_t i = threadIdx.x; i < rv.n; i += blockDim.x)
        dot += log ? static_cast<double>(gr[i * s]) : static_cast<double>(gr[i * s]) * yr[i * s];
    dot = group_reduce(dot, SumOp<double>{});
    if (!valid) continue;
    const T d = static_cast<T>(dot);
    T* dr = dx + base;
    // d log_softmax: dx = dy - softmax * sum(dy); d softmax: dx = y * (dy - sum(dy * y))
    for (int64_t i = threadIdx.x; i < rv.n; i += blockDim.x)
      dr[i * s] = log ? gr[i * s] - vexp(yr[i * s]) * d : yr[i * s] * (gr[i * s] - d);
  }
}

// ---- layer norm over contiguous rows of n

template <class T>
__global__ void layer_norm_kernel(const T* x, const T* weight, const T* bias, T* y, T* mean_out, T* rstd_out,
                                  int64_t rows, int64_t n, double eps, bool center) {
  TP_ROW_GROUPS(first, rows) {
    const int64_t row = first + threadIdx.y;
    const bool valid = row < rows;
    const T* xr = x + (valid ? row : 0) * n;
    double sum = 0;
    if (valid && center)
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += xr[i];
    sum = group_reduce(sum, SumOp<double>{});
    const double mean = center ? sum / static_cast<double>(n) : 0.0;  // RMSNorm: none subtracted
    // The variance from the mean (two passes over the row, the second from cache): no cancellation.
    double sq = 0;
    if (valid)
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sq += (xr[i] - mean) * (xr[i] - mean);
    sq = group_reduce(sq, SumOp<double>{});
    if (!valid) continue;
    const double var = sq / static_cast<double>(n);  // biased, as in the paper and PyTorch
    const T m = static_cast<T>(mean), rs = static_cast<T>(1.0 / math::sqrt(var + eps));
    if (threadIdx.x == 0) {
      mean_out[row] = m;
      rstd_out[row] = rs;
    }
    T* yr = y + row * n;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      T v = (xr[i] - m) * rs;
      if (weight) v *= weight[i];
      if (bias) v += bias[i];
      yr[i] = v;
    }
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), with g = dy * weight; RMSNorm has no mean(g) term
template <class T>
__global__ void layer_norm_backward_kernel(const T* dy, const T* x, const T* mean, const T* rstd, const T* weight,
                                           T* dx, int64_t rows, int64_t n, bool center) {
  TP_ROW_GROUPS(first, rows) {
    const int64_t row = first + threadIdx.y;
    const bool valid = row < rows;
    const int64_t base = (valid ? row : 0) * n;
    const T m = valid ? mean[row] : T(0), rs = valid ? rstd[row] : T(0);
    double sum_g = 0, sum_gx = 0;
    if (valid)
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const T gi = weight ? dy[base + i] * weight[i] : dy[base + i];
        sum_g += gi;
        sum_gx += gi * (x[base + i] - m) * rs;
      }
    sum_g = group_reduce(sum_g, SumOp<double>{});
    sum_gx = group_reduce(sum_gx, SumOp<double>{});
    if (!valid) continue;
    const T mg = center ? static_cast<T>(sum_g / n) : T(0), mgx = static_cast<T>(sum_gx / n);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const T gi = weight ? dy[base + i] * weight[i] : dy[base + i];
      dx[base + i] = rs * (gi - mg - (x[base + i] - m) * rs * mgx);
    }
  }
}

// dweight = sum_rows dy * xhat, dbias = sum_rows dy: per (row block, column) partials in double,
// laid out as [block][column] for combine_columns_kernel.
template <class T>
__global__ void layer_norm_weight_grads_kernel(const T* dy, const T* x, const T* mean, const T* rstd,
                                               double* partial_w, double* partial_b, int64_t rows, int64_t n,
                                               RowBlocks blocks) {
  TP_GRID_STRIDE(i, blocks.count * n) {
    const int64_t b = i / n, c = i - b * n;
    const int64_t r0 = b * blocks.rows_per_block;
    const int64_t r1 = r0 + blocks.rows_per_block < rows ? r0 + blocks.rows_per_block : rows;
    double sw = 0, sb = 0;
    for (int64_t r = r0; r < r1; ++r) {
      const T gi = dy[r * n + c];
      sw += gi * (x[r * n + c] - mean[r]) * rstd[r];
      sb += gi;
    }
    partial_w[i] = sw;
    partial_b[i] = sb;
  }
}

}  // namespace

Tensor sum_of_squares(const std::vector<Tensor>& tensors) {
  const Device device = tensors[0].device();  // the dispatcher routes an empty list to the CPU
  Tensor out = empty_on({}, DType::Float64, device);
  std::vector<Tensor> parts;  // contiguous, non-empty
  int64_t segments = 0;
  for (const Tensor& t : tensors) {
    dispatch_floating(t.dtype(), "sum_of_squares", [](auto) {});
    if (t.numel() == 0) continue;
    parts.push_back(contiguous(t));
    segments += (t.numel() + kChunk - 1) / kChunk;
  }
  if (segments == 0) {
    fill_(out, 0.0);
    return out;
  }
  // One partial per segment, in list order, then the partials added as one row (a fixed order).
  Tensor partial = empty_on({segments}, DType::Float64, device);
  int64_t base = 0;
  for (size_t i = 0; i < parts.size();) {
    dispatch_floating(parts[i].dtype(), "sum_of_squares", [&](auto tag) {
      using T = typename decltype(tag)::type;
      SquaresTable<T> table{};
      int64_t launch_segments = 0;
      for (; i < parts.size() && table.count < kSquaresTable && parts[i].dtype() == dtype_of<T>(); ++i) {
        table.data[table.count] = parts[i].data_ptr<T>();
        table.numel[table.count] = parts[i].numel();
        table.first_segment[table.count] = launch_segments;
        launch_segments += (parts[i].numel() + kChunk - 1) / kChunk;
        ++table.count;
      }
      table.first_segment[table.count] = launch_segments;
      const RowGroups lg = row_groups(launch_segments, kChunk);
      sum_of_squares_many_kernel<T><<<lg.grid, lg.block, 0, stream()>>>(table, partial.data_ptr<double>() + base,
                                                                         launch_segments);
      TP_CUDA_LAUNCHED("sum_of_squares");
      base += launch_segments;
    });
  }
  reduce_rows<double, double, double>("sum_of_squares", device, partial.data_ptr<double>(), out.data_ptr<double>(), 1,
                                      segments, Cast<double>{}, SumOp<double>{});
  return out;
}

Tensor reduce(const char* op, Reduce kind, const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  const int64_t nd = a.dim();
  std::vector<bool> mask = dims_mask(op, dims, nd);
  if (dims.empty()) mask.assign(nd, true);  // no dims: reduce everything
  // The input seen as [kept..., reduced...]: a view with permuted sizes and strides.
  Shape out_shape, kept_sizes, kept_strides, red_sizes, red_strides;
  for (int64_t d = 0; d < nd; ++d) {
    if (mask[d]) {
      red_sizes.push_back(a.size(d));
      red_strides.push_back(a.stride(d));
      if (keepdim) out_shape.push_back(1);
    } else {
      kept_sizes.push_back(a.size(d));
      kept_strides.push_back(a.stride(d));
      out_shape.push_back(a.size(d));
    }
  }
  const bool red_empty = std::find(red_sizes.begin(), red_sizes.end(), 0) != red_sizes.end();
  if (kind != Reduce::Sum)
    TP_CHECK(!red_empty, "{}: cannot reduce an empty dimension (input shape {}, dims {})", op, a.sizes(), dims);
  const int64_t n_out = shape_numel(kept_sizes);
  const DType out_dtype = (kind == Reduce::Sum && !is_floating(a.dtype())) ? DType::Int64 : a.dtype();
  Tensor out = empty_on(out_shape, out_dtype, a.device());
  if (n_out == 0) return out;
  if (red_empty) {  // a sum over nothing; the empty input's strides address nothing, so never read them
    fill_(out, 0.0);
    return out;
  }
  if (a.dtype() == DType::Bool) TP_CHECK(kind == Reduce::Sum, "{}: not supported for bool tensors", op);
  const int64_t n_red = shape_numel(red_sizes);

  // Reducing the leading dims of a contiguous input ([rows, cols] -> [cols], as bias gradients
  // do) sums columns in place; anything else reads contiguous rows of the permuted view.
  bool columns = a.is_contiguous() && n_red > 1 && n_out > 1;
  const int64_t n_red_dims = static_cast<int64_t>(red_sizes.size());
  for (int64_t d = 0; d < nd && columns; ++d) columns = mask[d] == (d < n_red_dims);
  Tensor in = a;
  if (!columns) {
    Shape sizes = kept_sizes, strides = kept_strides;
    sizes.insert(sizes.end(), red_sizes.begin(), red_sizes.end());
    strides.insert(strides.end(), red_strides.begin(), red_strides.end());
    in = contiguous(tapestry::make_tensor(a.impl().storage, sizes, strides, a.offset(), a.dtype()));
  }

  dispatch(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, bool>) {
      reduce_as<bool, int64_t, int64_t>(op, in, columns, n_out, n_red, out, SumOp<int64_t>{});
    } else {
      // Float sums accumulate in double, integer sums in int64; max/min are exact in T.
      using SumAcc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;
      using SumOut = std::conditional_t<std::is_floating_point_v<T>, T, int64_t>;
      if (kind == Reduce::Sum) reduce_as<T, SumAcc, SumOut>(op, in, columns, n_out, n_red, out, SumOp<SumAcc>{});
      else if (kind == Reduce::Max) reduce_as<T, T, T>(op, in, columns, n_out, n_red, out, MaxOp<T>{});
      else reduce_as<T, T, T>(op, in, columns, n_out, n_red, out, MinOp<T>{});
    }
  });
  return out;
}

std::pair<Tensor, Tensor> reduce_with_index(const char* op, Reduce kind, const Tensor& a, int64_t dim, bool keepdim) {
  const int64_t nd = a.dim();
  dim = wrap_dim(op, dim, nd);
  const int64_t n = nd == 0 ? 1 : a.size(dim);
  TP_CHECK(n > 0, "{}: cannot reduce an empty dimension (input shape {}, dim {})", op, a.sizes(), dim);
  // The input seen with `dim` last: [kept..., n].
  Shape out_shape, sizes, strides;
  for (int64_t d = 0; d < nd; ++d) {
    if (d == dim) {
      if (keepdim) out_shape.push_back(1);
      continue;
    }
    sizes.push_back(a.size(d));
    strides.push_back(a.stride(d));
    out_shape.push_back(a.size(d));
  }
  if (nd > 0) {
    sizes.push_back(n);
    strides.push_back(a.stride(dim));
  }
  Tensor values = empty_on(out_shape, a.dtype(), a.device());
  Tensor indices = empty_on(out_shape, DType::Int64, a.device());
  dispatch_numeric(a.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t rows = values.numel();
    if (rows == 0) return;
    Tensor in = contiguous(tapestry::make_tensor(a.impl().storage, sizes, strides, a.offset(), a.dtype()));
    const RowGroups lg = row_groups(rows, n);
    using MaxBest = ArgBest<T, true>;
    using MinBest = ArgBest<T, false>;
    if (kind == Reduce::Max)
      reduce_with_index_kernel<T, MaxBest><<<lg.grid, lg.block, 0, stream()>>>(
          in.data_ptr<T>(), values.data_ptr<T>(), indices.data_ptr<int64_t>(), rows, n, MaxBest{});
    else
      reduce_with_index_kernel<T, MinBest><<<lg.grid, lg.block, 0, stream()>>>(
          in.data_ptr<T>(), values.data_ptr<T>(), indices.data_ptr<int64_t>(), rows, n, MinBest{});
    TP_CUDA_LAUNCHED(op);
  });
  return {values, indices};
}

std::pair<Tensor, Tensor> topk(const Tensor& a, int64_t k, int64_t dim, bool largest, bool sorted) {
  if (!topk_on_device(k, sorted) || a.dim() == 0) {  // through the host (see host_fallback.cu)
    auto [values, indices] = cpu::topk(to_device(a, Device::CPU), k, dim, largest, sorted);
    return {to_device(values, a.device()), to_device(indices, a.device())};
  }
  dim = wrap_dim("topk", dim, a.dim());
  const int64_t n = a.size(dim);
  TP_CHECK(k >= 0 && k <= n, "topk: selected index k out of range: k = {} for dim {} of size {} (input shape {})", k,
           dim, n, a.sizes());
  // Rows along `dim`: the input seen with `dim` last, [kept..., n], and the result [kept..., k],
  // returned as a view with `dim` back in place and made contiguous (the CPU's layout).
  const int64_t nd = a.dim();
  Shape sizes, strides, kept;
  for (int64_t d = 0; d < nd; ++d)
    if (d != dim) {
      sizes.push_back(a.size(d));
      strides.push_back(a.stride(d));
      kept.push_back(a.size(d));
    }
  sizes.push_back(n);
  strides.push_back(a.stride(dim));
  kept.push_back(k);
  Tensor values = empty_on(kept, a.dtype(), a.device());
  Tensor indices = empty_on(kept, DType::Int64, a.device());
  const int64_t rows = n == 0 ? 0 : values.numel() / std::max<int64_t>(k, 1);
  dispatch_numeric(a.dtype(), "topk", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (rows == 0 || k == 0) return;
    Tensor in = contiguous(tapestry::make_tensor(a.impl().storage, sizes, strides, a.offset(), a.dtype()));
    const RowGroups lg = row_groups(rows, n);
    if (largest)
      topk_kernel<T, true><<<lg.grid, lg.block, 0, stream()>>>(in.data_ptr<T>(), values.data_ptr<T>(),
                                                               indices.data_ptr<int64_t>(), rows, n, k);
    else
      topk_kernel<T, false><<<lg.grid, lg.block, 0, stream()>>>(in.data_ptr<T>(), values.data_ptr<T>(),
                                                                indices.data_ptr<int64_t>(), rows, n, k);
    TP_CUDA_LAUNCHED("topk");
  });
  if (dim == nd - 1) return {values, indices};
  // [kept..., k] back to the input's dim order: k moves from last to `dim`.
  auto restore = [&](const Tensor& t) {
    Shape s = t.sizes(), st = t.strides();
    s.insert(s.begin() + dim, s.back());
    st.insert(st.begin() + dim, st.back());
    s.pop_back();
    st.pop_back();
    return contiguous(tapestry::make_tensor(t.impl().storage, s, st, t.offset(), t.dtype()));
  };
  return {restore(values), restore(indices)};
}

Tensor softmax(const Tensor& a_in, int64_t dim, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  dim = wrap_dim(op, dim, a_in.dim());
  Tensor out = empty_on(a_in.sizes(), a_in.dtype(), a_in.device());
  dispatch_floating(a_in.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (out.numel() == 0) return;
    Tensor a = contiguous(a_in);
    const DimSplit rv = split_at(a.sizes(), dim);
    const RowGroups lg = row_groups(rv.outer * rv.inner, rv.n);
    softmax_kernel<T><<<lg.grid, lg.block, 0, stream()>>>(a.data_ptr<T>(), out.data_ptr<T>(), rv, log);
    TP_CUDA_LAUNCHED(op);
  });
  return out;
}

Tensor softmax_backward(const Tensor& y_in, const Tensor& dy_in, int64_t dim, bool log) {
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  dim = wrap_dim(op, dim, y_in.dim());
  // The CPU trusts its caller here; on the GPU a mismatch would read out of bounds.
  TP_CHECK(dy_in.sizes() == y_in.sizes(), "{}: gradient shape {} does not match the output shape {}", op,
           dy_in.sizes(), y_in.sizes());
  Tensor dx = empty_on(y_in.sizes(), y_in.dtype(), y_in.device());
  dispatch_floating(y_in.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (dx.numel() == 0) return;
    Tensor y = contiguous(y_in), dy = contiguous(dy_in);
    const DimSplit rv = split_at(y.sizes(), dim);
    const RowGroups lg = row_groups(rv.outer * rv.inner, rv.n);
    softmax_backward_kernel<T><<<lg.grid, lg.block, 0, stream()>>>(y.data_ptr<T>(), dy.data_ptr<T>(),
                                                                    dx.data_ptr<T>(), rv, log);
    TP_CUDA_LAUNCHED(op);
  });
  return dx;
}

LayerNormOut layer_norm(const Tensor& x_in, int64_t norm_dims, const Tensor& weight, const Tensor& bias, double eps,
                        bool center) {
  // autograd's layer_norm checks shapes with its messages; these guard the kernel's reads.
  TP_CHECK(norm_dims >= 0 && norm_dims <= x_in.dim(), "layer_norm: cannot normalize the last {} dims of shape {}",
           norm_dims, x_in.sizes());
  const Shape row_shape(x_in.sizes().begin(), x_in.sizes().end() - norm_dims);
  const Shape norm_shape(x_in.sizes().end() - norm_dims, x_in.sizes().end());
  const int64_t rows = shape_numel(row_shape), n = shape_numel(norm_shape);
  if (weight.defined())
    TP_CHECK(weight.numel() == n && weight.dtype() == x_in.dtype(), "layer_norm: weight {} {} must be {} {}",
             weight.dtype(), weight.sizes(), x_in.dtype(), norm_shape);
  if (bias.defined())
    TP_CHECK(bias.numel() == n && bias.dtype() == x_in.dtype(), "layer_norm: bias {} {} must be {} {}", bias.dtype(),
             bias.sizes(), x_in.dtype(), norm_shape);
  const Device device = x_in.device();
  LayerNormOut r{empty_on(x_in.sizes(), x_in.dtype(), device), empty_on(row_shape, x_in.dtype(), device),
                 empty_on(row_shape, x_in.dtype(), device)};
  dispatch_floating(x_in.dtype(), "layer_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    // Rows of no elements (n = 0) get a NaN mean and rstd (0 / 0), where the CPU leaves them unwritten.
    if (rows == 0) return;
    Tensor x = contiguous(x_in);
    Tensor w = weight.defined() ? contiguous(weight) : weight, b = bias.defined() ? contiguous(bias) : bias;
    const RowGroups lg = row_groups(rows, n);
    layer_norm_kernel<T><<<lg.grid, lg.block, 0, stream()>>>(
        x.data_ptr<T>(), w.defined() ? w.data_ptr<T>() : nullptr, b.defined() ? b.data_ptr<T>() : nullptr,
        r.y.data_ptr<T>(), r.mean.data_ptr<T>(), r.rstd.data_ptr<T>(), rows, n, eps, center);
    TP_CUDA_LAUNCHED("layer_norm");
  });
  return r;
}

LayerNormGrads layer_norm_backward(const Tensor& dy_in, const Tensor& x_in, const Tensor& mean_in,
                                   const Tensor& rstd_in, int64_t norm_dims, const Tensor& weight,
                                   bool need_weight_grads, bool center) {
  const char* op = "layer_norm_backward";
  TP_CHECK(norm_dims >= 0 && norm_dims <= x_in.dim(), "{}: cannot normalize the last {} dims of shape {}", op,
           norm_dims, x_in.sizes());
  const Shape row_shape(x_in.sizes().begin(), x_in.sizes().end() - norm_dims);
  const Shape norm_shape(x_in.sizes().end() - norm_dims, x_in.sizes().end());
  const int64_t rows = shape_numel(row_shape), n = shape_numel(norm_shape);
  TP_CHECK(dy_in.sizes() == x_in.sizes(), "{}: gradient shape {} does not match the input shape {}", op,
           dy_in.sizes(), x_in.sizes());
  TP_CHECK(mean_in.numel() == rows && rstd_in.numel() == rows,
           "{}: mean and rstd must hold one value per row ({}), got shapes {} and {}", op, row_shape,
           mean_in.sizes(), rstd_in.sizes());
  if (weight.defined())
    TP_CHECK(weight.numel() == n, "{}: weight {} must match the normalized shape {}", op, weight.sizes(), norm_shape);
  const Device device = x_in.device();
  LayerNormGrads g{empty_on(x_in.sizes(), x_in.dtype(), device), Tensor(), Tensor()};
  if (need_weight_grads) {  // also without a weight (a bias alone), as the CPU does
    g.dweight = empty_on(norm_shape, x_in.dtype(), device);
    g.dbias = empty_on(norm_shape, x_in.dtype(), device);
  }
  dispatch_floating(x_in.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    Tensor x = contiguous(x_in), dy = contiguous(dy_in);
    Tensor mean = contiguous(mean_in), rstd = contiguous(rstd_in);
    if (g.dx.numel() > 0) {
      Tensor w = weight.defined() ? contiguous(weight) : weight;
      const RowGroups lg = row_groups(rows, n);
      layer_norm_backward_kernel<T><<<lg.grid, lg.block, 0, stream()>>>(
          dy.data_ptr<T>(), x.data_ptr<T>(), mean.data_ptr<T>(), rstd.data_ptr<T>(),
          w.defined() ? w.data_ptr<T>() : nullptr, g.dx.data_ptr<T>(), rows, n, center);
      TP_CUDA_LAUNCHED(op);
    }
    if (!need_weight_grads || n == 0) return;
    // No rows: no blocks, and the combine writes zeros.
    const RowBlocks blocks = row_blocks(rows);
    Tensor partial_w = empty_on({blocks.count, n}, DType::Float64, device);
    Tensor partial_b = empty_on({blocks.count, n}, DType::Float64, device);
    if (blocks.count > 0) {
      layer_norm_weight_grads_kernel<T><<<blocks_for(blocks.count * n), kThreads, 0, stream()>>>(
          dy.data_ptr<T>(), x.data_ptr<T>(), mean.data_ptr<T>(), rstd.data_ptr<T>(), partial_w.data_ptr<double>(),
          partial_b.data_ptr<double>(), rows, n, blocks);
      TP_CUDA_LAUNCHED(op);
    }
    using Sum = SumOp<double>;
    combine_columns_kernel<double, T, Sum><<<blocks_for(n), kThreads, 0, stream()>>>(
        partial_w.data_ptr<double>(), g.dweight.data_ptr<T>(), blocks.count, n, Sum{});
    TP_CUDA_LAUNCHED(op);
    combine_columns_kernel<double, T, Sum><<<blocks_for(n), kThreads, 0, stream()>>>(
        partial_b.data_ptr<double>(), g.dbias.data_ptr<T>(), blocks.count, n, Sum{});
    TP_CUDA_LAUNCHED(op);
  });
  return g;
}

}  // namespace tapestry::kernels::cuda
