// The tiled attention of the CUDA backend (after FlashAttention, Dao et al. 2022, and its second
// version): the [B·H, Tq, Tk] scores never exist in memory, only one tile of keys (or queries) in
// a block's shared memory and one row of state per thread. Written as what one thread does
// between two barriers, __host__ __device__ (TP_HD), so that
//   - ops/cuda/attention.cu launches these steps as kernels (__syncthreads() between them), and
//   - tests/test_attention_tiles.cpp runs the very same steps on the CPU, block by block and
//     thread by thread with the barriers as loop boundaries, against the CPU kernel: the online
//     softmax, masking, causal skipping, dropout indices and the backward's formulas are tested on
//     every CI run, though no GPU is there.
//
// The semantics are ops/cpu/attention.cpp's, term for term: a masked score (by the mask or by
// causality, key j > query i) is -1e9, the saved statistics per query row are the maximum and
// log sum exp(score - maximum), and dropout keeps element (s, i, j) when
// dropout_keeps((s Tq + i) Tk + j mod 2^32). With causality and no mask, keys wholly in a block's
// future are skipped (their probabilities are exactly 0: every row sees key 0). The one place
// the two kernels can differ is there: the CPU skips by blocks of 64 x 128 and this kernel by
// blocks of 64 rows, so with a NaN score in a causal row, which keys beyond it come out NaN
// differs (PyTorch's composite makes them all NaN; docs/cuda.md, known differences).
//
// Three kernels, each thread owning one output row (no atomics, so results are deterministic):
//   forward: a thread per query row; key tiles (K and V) staged in shared memory; the thread keeps
//            its query, running maximum m, running sum l and output accumulator in registers.
//   dQ:      a thread per query row over key tiles, recomputing each probability from the saved
//            statistics; it also writes D_i = dO_i . O_i for the next kernel.
//   dK, dV:  a thread per key over query tiles (Q, dO, the statistics and D staged).
// Registers hold rows of HEAD values, HEAD in {32, 64, 128}: head sizes above 128 are left to
// the gemm kernel.
#pragma once
#include <cstdint>
#include <limits>

#include "tapestry/ops/detail/backend.h"
#include "tapestry/ops/detail/math.h"

#ifdef __CUDA_ARCH__  // the device pass only: the host compiler does not know the pragma
#define TP_UNROLL _Pragma("unroll")
#else
#define TP_UNROLL
#endif

namespace tapestry::kernels::tiles {

constexpr int kThreads = 64;  // threads per block: the query rows (or keys) of a block
constexpr int kMaxLead = 8;   // leading dims of a broadcast mask read in place (more: copied)
constexpr int kMaxHead = 128;

// Keys (or queries) per shared tile: two tiles of HEAD values in at most 32 KiB, at most 64.
template <class T, int HEAD> constexpr int tile_len() {
  constexpr int fit = 16384 / (HEAD * static_cast<int>(sizeof(T)));
  return fit < 64 ? fit : 64;
}

// The mask as a strided view broadcast to [lead..., Tq, Tk] (stride 0 where it broadcasts).
struct MaskView {
  const bool* data = nullptr;
  int nlead = 0;
  int64_t lead_sizes[kMaxLead] = {}, lead_strides[kMaxLead] = {};
  int64_t sq = 0, sk = 0;  // strides over Tq and Tk
  // The mask of slice s (s = the flat index over the leading dims); null without a mask.
  TP_HD const bool* slice(int64_t s) const {
    if (!data) return nullptr;
    int64_t off = 0;
    for (int d = nlead - 1; d >= 0; --d) {
      off += (s % lead_sizes[d]) * lead_strides[d];
      s /= lead_sizes[d];
    }
    return data + off;
  }
};

template <class T>
struct Params {
  const T *q = nullptr, *k = nullptr, *v = nullptr;  // contiguous [BH, T, E]
  const T *out = nullptr, *dout = nullptr;           // contiguous [BH, Tq, Ev] (backward)
  const T* stats = nullptr;                          // [BH, Tq, 2]: (max, log sum) (backward)
  T* d = nullptr;                                    // [BH, Tq]: dO . O (written by dQ, read by dK dV)
  int64_t bh = 0, tq = 0, tk = 0, e = 0, ev = 0;
  T scale = 1;
  MaskView mask;
  bool causal = false;
  bool drop = false;
  uint32_t key = 0, threshold = 0;
  T drop_scale = 1;
};

template <class T> TP_HD inline bool is_masked(const Params<T>& P, const bool* mask_slice, int64_t i, int64_t j) {
  return (mask_slice && mask_slice[i * P.mask.sq + j * P.mask.sk]) || (P.causal && j > i);
}
// The dropout factor z of probability (s, i, j): 0 or 1 / (1 - p); 1 without dropout.
template <class T> TP_HD inline T drop_factor(const Params<T>& P, int64_t s, int64_t i, int64_t j) {
  if (!P.drop) return T(1);
  const uint32_t index = static_cast<uint32_t>((s * P.tq + i) * P.tk + j);
  return dropout_keeps(index, P.key, P.threshold) ? P.drop_scale : T(0);
}
// Keys that query rows below row_end can see (causality without a mask: none past the last row).
template <class T> TP_HD inline int64_t key_end(const Params<T>& P, int64_t row_end) {
  return P.causal && !P.mask.data ? (row_end < P.tk ? row_end : P.tk) : P.tk;
}
// The first query row that can see key `key0` or a later one.
template <class T> TP_HD inline int64_t query_begin(const Params<T>& P, int64_t key0) {
  return P.causal && !P.mask.data ? (key0 < P.tq ? key0 : P.tq) : 0;
}
template <class T, int HEAD> TP_HD inline T dot(const T* a, const T* b, int64_t n) {
  T acc = 0;
  TP_UNROLL
  for (int d = 0; d < HEAD; ++d)
    if (d < n) acc += a[d] * b[d];
  return acc;
}

// Thread t of n copies rows [r0, r0 + len) of the [rows, width] slice `src` into `dst` [len, HEAD].
// A tile holds at most 64 x 128 values, so the position within it is 32-bit (a 64-bit division
// per element would cost as much as the tile's arithmetic on a GPU).
template <class T, int HEAD>
TP_HD inline void stage_rows(const T* src, int64_t width, int64_t r0, int64_t len, int t, int n, T* dst) {
  const int w = static_cast<int>(width), count = static_cast<int>(len) * w;
  const T* from = src + r0 * width;
  for (int x = t; x < count; x += n) {
    const int row = x / w, col = x - row * w;
    dst[row * HEAD + col] = from[x];
  }
}

// ---- forward: one query row per thread
template <class T, int HEAD>
struct ForwardRow {
  T q[HEAD], acc[HEAD];
  T m, l;  // the running maximum and sum exp(score - m)
  int64_t s, i;
  const bool* mask;
};

template <class T, int HEAD>
TP_HD inline void forward_begin(const Params<T>& P, int64_t s, int64_t i, ForwardRow<T, HEAD>& r) {
  r.s = s, r.i = i, r.mask = P.mask.slice(s);
  r.m = -std::numeric_limits<T>::infinity(), r.l = 0;
  const T* q = P.q + (s * P.tq + i) * P.e;
  TP_UNROLL
  for (int d = 0; d < HEAD; ++d) {
    r.q[d] = d < P.e ? q[d] : T(0);
    r.acc[d] = 0;
  }
}

// Thread t of n stages keys [j0, j0 + len) of slice s: K into Ks and V into Vs, [len, HEAD] each.
template <class T, int HEAD>
TP_HD inline void stage_keys(const Params<T>& P, int64_t s, int64_t j0, int64_t len, int t, int n, T* Ks, T* Vs) {
  stage_rows<T, HEAD>(P.k + s * P.tk * P.e, P.e, j0, len, t, n, Ks);
  stage_rows<T, HEAD>(P.v + s * P.tk * P.ev, P.ev, j0, len, t, n, Vs);
}

// Folds keys [j0, j0 + len) (len <= TILE) into the row's state: the tile's maximum first, then one
// rescale of what was accumulated under the old maximum, as the CPU kernel does per block.
template <class T, int HEAD, int TILE>
TP_HD inline void forward_consume(const Params<T>& P, int64_t j0, int64_t len, const T* Ks, const T* Vs,
                                  ForwardRow<T, HEAD>& r) {
  T score[TILE];
  T mx = r.m;
  for (int c = 0; c < TILE && c < len; ++c) {
    const T v = is_masked(P, r.mask, r.i, j0 + c) ? static_cast<T>(kAttentionMasked) : P.scale * dot<T, HEAD>(r.q, Ks + c * HEAD, P.e);
    score[c] = v;
    mx = v > mx ? v : mx;  // NaN is passed over, as std::max in the CPU kernel
  }
  const T alpha = r.m == -std::numeric_limits<T>::infinity() ? T(0) : vexp(r.m - mx);
  r.m = mx;
  r.l *= alpha;
  TP_UNROLL
  for (int d = 0; d < HEAD; ++d) r.acc[d] *= alpha;
  for (int c = 0; c < TILE && c < len; ++c) {
    const T p = vexp(score[c] - mx);
    r.l += p;
    const T pz = p * drop_factor(P, r.s, r.i, j0 + c);
    const T* v = Vs + c * HEAD;
    TP_UNROLL
    for (int d = 0; d < HEAD; ++d)
      if (d < P.ev) r.acc[d] += pz * v[d];  // (the tile's padding is never staged)
  }
}

// out [BH, Tq, Ev] and stats [BH, Tq, 2]. A sum of 0 (no key) gives zeros; a NaN sum stays NaN.
template <class T, int HEAD>
TP_HD inline void forward_end(const Params<T>& P, const ForwardRow<T, HEAD>& r, T* out, T* stats) {
  const int64_t row = r.s * P.tq + r.i;
  const T inv = r.l == T(0) ? T(0) : T(1) / r.l;
  TP_UNROLL
  for (int d = 0; d < HEAD; ++d)
    if (d < P.ev) out[row * P.ev + d] = r.acc[d] * inv;
  stats[2 * row] = r.m;
  stats[2 * row + 1] = r.l == T(0) ? std::numeric_limits<T>::infinity() : math::log(r.l);
}

// ---- backward, dQ: one query row per thread
template <class T, int HEAD>
struct QueryGrad {
  T q[HEAD], dout[HEAD], dq[HEAD];
  T row_max, log_sum, d;  // the saved statistics and D = dO . O
  int64_t s, i;
  const bool* mask;
};

template <class T, int HEAD>
TP_HD inline void dq_begin(const Params<T>& P, int64_t s, int64_t i, QueryGrad<T, HEAD>& r) {
  r.s = s, r.i = i, r.mask = P.mask.slice(s);
  const int64_t row = s * P.tq + i;
  const T *q = P.q + row * P.e, *g = P.dout + row * P.ev, *o = P.out + row * P.ev;
  T d = 0;
  TP_UNROLL
  for (int x = 0; x < HEAD; ++x) {
    r.q[x] = x < P.e ? q[x] : T(0);
    r.dout[x] = x < P.ev ? g[x] : T(0);
    r.dq[x] = 0;
    if (x < P.ev) d += o[x] * g[x];
  }
  r.d = d;
  r.row_max = P.stats[2 * row], r.log_sum = P.stats[2 * row + 1];
  P.d[row] = d;
}

// dS = P (dP' z - D) with dP' = dO . v (0 where masked); dQ += scale dS k, over keys [j0, j0 + len).
template <class T, int HEAD>
TP_HD inline void dq_consume(const Params<T>& P, int64_t j0, int64_t len, const T* Ks, const T* Vs,
                             QueryGrad<T, HEAD>& r) {
  for (int64_t c = 0; c < len; ++c) {
    const int64_t j = j0 + c;
    if (is_masked(P, r.mask, r.i, j)) continue;  // dS = 0 there
    const T* k = Ks + c * HEAD;
    const T score = P.scale * dot<T, HEAD>(r.q, k, P.e);
    const T p = vexp((score - r.row_max) - r.log_sum);
    const T ds = p * (dot<T, HEAD>(r.dout, Vs + c * HEAD, P.ev) * drop_factor(P, r.s, r.i, j) - r.d);
    const T g = P.scale * ds;
    TP_UNROLL
    for (int x = 0; x < HEAD; ++x)
      if (x < P.e) r.dq[x] += g * k[x];
  }
}

template <class T, int HEAD> TP_HD inline void dq_end(const Params<T>& P, const QueryGrad<T, HEAD>& r, T* dq) {
  T* o = dq + (r.s * P.tq + r.i) * P.e;
  TP_UNROLL
  for (int x = 0; x < HEAD; ++x)
    if (x < P.e) o[x] = r.dq[x];
}

// The forward and dQ kernels are one loop (a thread per query row over staged key tiles) around
// different steps: these bundle each kernel's state and steps for that loop.
template <class T, int HEAD>
struct ForwardSteps {
  using State = ForwardRow<T, HEAD>;
  TP_HD static void begin(const Params<T>& P, int64_t s, int64_t i, State& r) { forward_begin(P, s, i, r); }
  TP_HD static void consume(const Params<T>& P, int64_t j0, int64_t len, const T* Ks, const T* Vs, State& r) {
    forward_consume<T, HEAD, tile_len<T, HEAD>()>(P, j0, len, Ks, Vs, r);
  }
  TP_HD static void end(const Params<T>& P, const State& r, T* out, T* stats) { forward_end(P, r, out, stats); }
};
template <class T, int HEAD>
struct QueryGradSteps {
  using State = QueryGrad<T, HEAD>;
  TP_HD static void begin(const Params<T>& P, int64_t s, int64_t i, State& r) { dq_begin(P, s, i, r); }
  TP_HD static void consume(const Params<T>& P, int64_t j0, int64_t len, const T* Ks, const T* Vs, State& r) {
    dq_consume(P, j0, len, Ks, Vs, r);
  }
  TP_HD static void end(const Params<T>& P, const State& r, T* dq, T*) { dq_end(P, r, dq); }
};

// ---- backward, dK and dV: one key per thread
template <class T, int HEAD>
struct KeyGrad {
  T k[HEAD], v[HEAD], dk[HEAD], dv[HEAD];
  int64_t s, j;
  const bool* mask;
};

template <class T, int HEAD>
TP_HD inline void dkv_begin(const Params<T>& P, int64_t s, int64_t j, KeyGrad<T, HEAD>& r) {
  r.s = s, r.j = j, r.mask = P.mask.slice(s);
  const T *k = P.k + (s * P.tk + j) * P.e, *v = P.v + (s * P.tk + j) * P.ev;
  TP_UNROLL
  for (int x = 0; x < HEAD; ++x) {
    r.k[x] = x < P.e ? k[x] : T(0);
    r.v[x] = x < P.ev ? v[x] : T(0);
    r.dk[x] = r.dv[x] = 0;
  }
}

// Thread t of n stages query rows [i0, i0 + len) of slice s: Q, dO, and (max, log sum, D) per row.
template <class T, int HEAD>
TP_HD inline void stage_queries(const Params<T>& P, int64_t s, int64_t i0, int64_t len, int t, int n, T* Qs, T* dOs,
                                T* rows) {
  stage_rows<T, HEAD>(P.q + s * P.tq * P.e, P.e, i0, len, t, n, Qs);
  stage_rows<T, HEAD>(P.dout + s * P.tq * P.ev, P.ev, i0, len, t, n, dOs);
  for (int64_t x = t; x < len; x += n) {
    const int64_t row = s * P.tq + i0 + x;
    rows[3 * x] = P.stats[2 * row], rows[3 * x + 1] = P.stats[2 * row + 1], rows[3 * x + 2] = P.d[row];
  }
}

// dV += P z dO and dK += scale dS q over query rows [i0, i0 + len). A masked score takes part
// with its -1e9 in dV (its probability is 0 but for a fully masked row, as in the forward).
template <class T, int HEAD>
TP_HD inline void dkv_consume(const Params<T>& P, int64_t i0, int64_t len, const T* Qs, const T* dOs, const T* rows,
                              KeyGrad<T, HEAD>& r) {
  for (int64_t c = 0; c < len; ++c) {
    const int64_t i = i0 + c;
    const T* q = Qs + c * HEAD;
    const T* g = dOs + c * HEAD;
    const bool masked = is_masked(P, r.mask, i, r.j);
    const T score = masked ? static_cast<T>(kAttentionMasked) : P.scale * dot<T, HEAD>(q, r.k, P.e);
    const T p = vexp((score - rows[3 * c]) - rows[3 * c + 1]);
    const T z = drop_factor(P, r.s, i, r.j);
    const T pz = p * z;
    TP_UNROLL
    for (int x = 0; x < HEAD; ++x)
      if (x < P.ev) r.dv[x] += pz * g[x];
    if (masked) continue;
    const T ds = P.scale * p * (dot<T, HEAD>(g, r.v, P.ev) * z - rows[3 * c + 2]);
    TP_UNROLL
    for (int x = 0; x < HEAD; ++x)
      if (x < P.e) r.dk[x] += ds * q[x];
  }
}

template <class T, int HEAD>
TP_HD inline void dkv_end(const Params<T>& P, const KeyGrad<T, HEAD>& r, T* dk, T* dv) {
  const int64_t row = r.s * P.tk + r.j;
  TP_UNROLL
  for (int x = 0; x < HEAD; ++x) {
    if (x < P.e) dk[row * P.e + x] = r.dk[x];
    if (x < P.ev) dv[row * P.ev + x] = r.dv[x];
  }
}

// ---- host side
// Whether the tiled kernels take head sizes e and ev, and the HEAD they are built for.
inline bool head_fits(int64_t e, int64_t ev) { return e <= kMaxHead && ev <= kMaxHead; }
template <class F> void with_head(int64_t e, int64_t ev, F&& f) {
  const int64_t w = e > ev ? e : ev;
  if (w <= 32) f(std::integral_constant<int, 32>{});
  else if (w <= 64) f(std::integral_constant<int, 64>{});
  else f(std::integral_constant<int, 128>{});
}

// The parameters for contiguous q [lead..., Tq, E], k [lead..., Tk, E], v [lead..., Tk, Ev] (on
// one device; the pointers are that device's). A mask with more than kMaxLead leading dims is
// copied to a contiguous [BH, Tq, Tk] (kept alive in *mask_copy).
template <class T>
Params<T> make_params(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                      bool causal, double scale, double dropout_p, uint64_t seed, Tensor* mask_copy) {
  check_attention_operands(op, q, k, v);
  TP_CHECK(q.is_contiguous() && k.is_contiguous() && v.is_contiguous(), "{}: q, k and v must be contiguous here", op);
  const Shape lead(q.sizes().begin(), q.sizes().end() - 2);
  Params<T> P;
  P.q = q.data_ptr<T>(), P.k = k.data_ptr<T>(), P.v = v.data_ptr<T>();
  P.tq = q.size(-2), P.tk = k.size(-2), P.e = q.size(-1), P.ev = v.size(-1);
  P.bh = shape_numel(lead);
  P.scale = static_cast<T>(scale);
  P.causal = causal;
  if (dropout_p > 0) {
    P.drop = true;
    P.key = dropout_key(seed), P.threshold = dropout_threshold(dropout_p);
    P.drop_scale = static_cast<T>(1.0 / (1.0 - dropout_p));
  }
  if (mask.defined()) {
    Shape full = lead;
    full.push_back(P.tq);
    full.push_back(P.tk);
    Shape st = attention_mask_strides(op, mask, full);
    Tensor m = mask;
    if (lead.size() > static_cast<size_t>(kMaxLead)) {
      *mask_copy = contiguous(make_tensor(mask.impl().storage, full, st, mask.offset(), DType::Bool));
      m = *mask_copy;
      st = {P.tq * P.tk, P.tk, 1};
      full = {P.bh, P.tq, P.tk};
    }
    P.mask.data = m.data_ptr<bool>();
    P.mask.nlead = static_cast<int>(full.size()) - 2;
    for (int d = 0; d < P.mask.nlead; ++d) P.mask.lead_sizes[d] = full[d], P.mask.lead_strides[d] = st[d];
    P.mask.sq = st[full.size() - 2], P.mask.sk = st[full.size() - 1];
  }
  return P;
}

}  // namespace tapestry::kernels::tiles
