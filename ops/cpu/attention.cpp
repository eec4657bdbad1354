// Fused scaled dot-product attention, forward and backward, after FlashAttention (Dao et al.,
// 2022) and its second version: the scores of one block of query rows against one block of keys
// are computed, masked, folded into a running (online) softmax and multiplied into the output,
// so no more than one [kRows x kCols] block of scores ever exists per thread, whatever Tq and Tk.
// The forward keeps one log-sum-exp per query row; the backward recomputes each block's
// probabilities from it.
//
// Semantics are those of the unfused composite MultiHeadAttention used before (and of
// tools/reference): a masked score is replaced by -1e9 (so a fully masked row attends evenly to
// every key instead of giving NaN), and masked scores get no gradient. With is_causal and no
// explicit mask, key blocks wholly in a row block's future are skipped: each row keeps key 0,
// so their probabilities would underflow to exactly 0 anyway.
//
// Dropout on the probabilities uses kernels::dropout's counter hash over the flat index of the
// [BH, Tq, Tk] probabilities, so it equals dropout(softmax(scores)) with the same seed, and the
// backward regenerates the mask instead of storing it.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tapestry/ops/cpu/gemm.h"
#include "tapestry/ops/cpu/lanes.h"
#include "tapestry/ops/cpu/loops.h"
#include "tapestry/ops/factory.h"
#include "tapestry/ops/detail/backend.h"
#include "tapestry/ops/profile.h"

namespace tapestry::kernels::cpu {

namespace {

constexpr int64_t kRows = 64;   // query rows per block
constexpr int64_t kCols = 128;  // keys per block

// kernels::dropout's mask (dropout_keeps) over the flat index of the [BH, Tq, Tk] probabilities.
struct DropoutMask {
  bool on = false;
  uint32_t key = 0, threshold = 0;
  double scale = 1;
  DropoutMask(double p, uint64_t seed) {
    if (p <= 0) return;
    on = true;
    threshold = dropout_threshold(p);
    scale = 1.0 / (1.0 - p);
    key = dropout_key(seed);
  }
  bool keep(uint32_t index) const { return dropout_keeps(index, key, threshold); }
};

// Where one (batch..., head) slice of each operand starts: q, k, v, out and mask share the
// leading dims; a mask broadcasts over them and over Tq and Tk (stride 0).
struct Layout {
  int64_t bh = 0, tq = 0, tk = 0, e = 0, ev = 0;
  std::vector<int64_t> q_off, k_off, v_off, m_off;
  int64_t q_ld = 0, k_ld = 0, v_ld = 0;  // row strides (the last dim has stride 1)
  int64_t m_sq = 0, m_sk = 0;            // the mask's strides over Tq and Tk
  const bool* mask = nullptr;
  bool causal = false;
};

std::vector<int64_t> lead_offsets(const Shape& lead, const Shape& strides) {
  const int64_t n = shape_numel(lead), nd = static_cast<int64_t>(lead.size());
  std::vector<int64_t> off(static_cast<size_t>(n));
  std::vector<int64_t> idx(lead.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t o = 0;  // relative to data_ptr(), which already includes the view's offset
    for (int64_t d = 0; d < nd; ++d) o += idx[d] * strides[d];
    off[static_cast<size_t>(i)] = o;
    for (int64_t d = nd - 1; d >= 0; --d) {
      if (++idx[d] < lead[d]) break;
      idx[d] = 0;
    }
  }
  return off;
}

Shape lead_strides(const Tensor& t, size_t nlead) {
  return Shape(t.strides().begin(), t.strides().begin() + static_cast<int64_t>(nlead));
}

// Row-major [rows x cols] scores of query rows [r0, r0 + rows) against keys [c0, c0 + cols):
// scale * q k^T with masked entries (by the mask or by causality) set to kAttentionMasked. With
// `masked`, also which entries those are (1) and which not (0): the backward must tell a masked
// score from a computed one that happens to equal kAttentionMasked (in float32, any score within
// 32 of -1e9 rounds to it), which the value alone cannot.
template <class T>
void block_scores(const Layout& L, int64_t s, const T* q, const T* k, int64_t r0, int64_t rows, int64_t c0,
                  int64_t cols, T scale, T* S, unsigned char* masked = nullptr) {
  gemm(false, true, rows, cols, L.e, scale, q + L.q_off[s] + r0 * L.q_ld, L.q_ld, k + L.k_off[s] + c0 * L.k_ld,
       L.k_ld, T(0), S, cols);
  if (masked) std::fill(masked, masked + rows * cols, static_cast<unsigned char>(0));
  auto mask_out = [&](int64_t r, int64_t c) {
    S[r * cols + c] = static_cast<T>(kAttentionMasked);
    if (masked) masked[r * cols + c] = 1;
  };
  if (L.mask) {
    const bool* m = L.mask + L.m_off[s];
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        if (m[(r0 + r) * L.m_sq + (c0 + c) * L.m_sk]) mask_out(r, c);
  }
  if (L.causal)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = std::max<int64_t>(0, r0 + r + 1 - c0); c < cols; ++c) mask_out(r, c);
}

// Whether block (r0.., c0..) holds any unmasked entry under causality: key c0 <= last row.
inline bool causal_visible(const Layout& L, int64_t r0, int64_t rows, int64_t c0) {
  return !L.causal || L.mask || c0 <= r0 + rows - 1;
}

Layout make_layout(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                   bool causal) {
  Layout L;
  const int64_t nd = q.dim();
  L.tq = q.size(-2), L.tk = k.size(-2), L.e = q.size(-1), L.ev = v.size(-1);
  const Shape lead(q.sizes().begin(), q.sizes().end() - 2);
  L.bh = shape_numel(lead);
  L.q_off = lead_offsets(lead, lead_strides(q, lead.size()));
  L.k_off = lead_offsets(lead, lead_strides(k, lead.size()));
  L.v_off = lead_offsets(lead, lead_strides(v, lead.size()));
  // gemm wants leading dims of at least the row length (and 1); with E or Tk of 0 the strides
  // may be 0, and then nothing is read through them anyway.
  L.q_ld = std::max({q.stride(-2), L.e, int64_t(1)});
  L.k_ld = std::max({k.stride(-2), L.e, int64_t(1)});
  L.v_ld = std::max({v.stride(-2), L.ev, int64_t(1)});
  L.causal = causal;
  if (mask.defined()) {
    // Strides of the mask broadcast to [lead..., Tq, Tk]: right-aligned, size-1 dims read stride 0.
    Shape full = lead;
    full.push_back(L.tq);
    full.push_back(L.tk);
    const Shape st = attention_mask_strides(op, mask, full);
    L.m_off = lead_offsets(lead, Shape(st.begin(), st.end() - 2));
    L.m_sq = st[nd - 2], L.m_sk = st[nd - 1];
    L.mask = mask.data_ptr<bool>();
  }
  return L;
}

// The rows of each operand must be unit-stride for gemm; anything else is copied once. Views
// such as the heads of a projection ([B, T, H, E] transposed to [B, H, T, E]) pass as they are.
// (A row stride below the row length, e.g. 0 for rows expanded from one, is no gemm layout.)
Tensor rows_ok(const Tensor& t) {
  const bool unit = t.stride(-1) == 1 || t.size(-1) <= 1;
  const bool rows = t.size(-2) <= 1 || t.stride(-2) >= t.size(-1);
  return unit && rows ? t : contiguous(t);
}

// Tasks too small to pay for a thread run serially.
int64_t task_grain(const Layout& L, int64_t rows_per_task) {
  const int64_t work = std::max<int64_t>(1, rows_per_task * std::max<int64_t>(L.tk, 1) * (L.e + L.ev));
  return std::max<int64_t>(1, (1 << 20) / work);
}

// Note [A few query rows]: a decoding step's attention is one query row per (batch, head) (a
// beam's K rows: K) against a few dozen keys, a thousand such slices per step. There the block
// path's set-up (two gemm calls, the online softmax's rescaling, its buffers) cost more than the
// arithmetic, so these slices go through direct loops, a row at a time: the scores as 16-lane
// dot products, one softmax over them all (a single block: no rescaling), and P V accumulated in
// lanes over the value's dims. Same semantics as the block path (masked scores, a fully masked
// row, NaN, no key at all, the saved statistics); the sums run in another order, so the last bit
// may differ. float32 without dropout only: training and float64 keep the block path.
constexpr int64_t kFewRows = 8;

bool few_rows(const Layout& L, DType dtype, bool dropout) {
  return dtype == DType::Float32 && !dropout && L.tq <= kFewRows && L.tk <= kCols;
}

void few_rows_attention(const Layout& L, int64_t s, const float* pq, const float* pk, const float* pv, float scale,
                        float* po, float* pl) {
  float p[kCols];
  const float* ks = pk + L.k_off[s];
  const float* vs = pv + L.v_off[s];
  for (int64_t r = 0; r < L.tq; ++r) {
    const float* qr = pq + L.q_off[s] + r * L.q_ld;
    const bool* m = L.mask ? L.mask + L.m_off[s] + r * L.m_sq : nullptr;
    // Keys masked at the row's end (a padded batch's key padding: cross-attention over a batch of
    // sentences of unequal length) would add exp(-1e9 - max) = 0 to the sum and 0 * v to P V, so
    // they are left out (the sum's vector lanes may then add in another order). Not when every
    // key is masked (the row then attends evenly), nor when no score rises above the masked value.
    int64_t tk = L.tk;
    while (m && tk > 0 && m[(tk - 1) * L.m_sk]) --tk;
    if (tk == 0) tk = L.tk;
    auto scores = [&](int64_t n) {
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t c = 0; c < n; ++c) {
        float x = dot16(qr, ks + c * L.k_ld, L.e) * scale;
        if ((m && m[c * L.m_sk]) || (L.causal && c > r)) x = static_cast<float>(kAttentionMasked);
        p[c] = x;
        mx = std::max(mx, x);  // a NaN score is passed over here, and makes its row NaN below
      }
      return mx;
    };
    float mx = scores(tk);
    if (tk < L.tk && !(mx > static_cast<float>(kAttentionMasked))) mx = scores(tk = L.tk);
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < tk; ++c) {
      p[c] = vexp(p[c] - mx);
      sum += p[c];
    }
    const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
    float* o = po + (s * L.tq + r) * L.ev;
    int64_t j = 0;
    // 32 of the value's dims at a time, even and odd keys apart: four independent chains of
    // multiply-adds rather than one per 16 dims, whose latency bounded the loop.
    for (; j + 32 <= L.ev; j += 32) {
      F16 a0 = {}, a1 = {}, b0 = {}, b1 = {};
      int64_t c = 0;
      for (; c + 2 <= tk; c += 2) {
        const float* v0 = vs + c * L.v_ld + j;
        const float* v1 = v0 + L.v_ld;
        a0 += p[c] * load16(v0), a1 += p[c] * load16(v0 + 16);
        b0 += p[c + 1] * load16(v1), b1 += p[c + 1] * load16(v1 + 16);
      }
      if (c < tk) {
        const float* v0 = vs + c * L.v_ld + j;
        a0 += p[c] * load16(v0), a1 += p[c] * load16(v0 + 16);
      }
      store16(o + j, (a0 + b0) * inv);
      store16(o + j + 16, (a1 + b1) * inv);
    }
    for (; j + 16 <= L.ev; j += 16) {
      F16 acc = {};
      for (int64_t c = 0; c < tk; ++c) acc += p[c] * load16(vs + c * L.v_ld + j);
      store16(o + j, acc * inv);
    }
    for (; j < L.ev; ++j) {
      float acc = 0;
      for (int64_t c = 0; c < tk; ++c) acc += p[c] * vs[c * L.v_ld + j];
      o[j] = acc * inv;
    }
    pl[2 * (s * L.tq + r)] = mx;
    pl[2 * (s * L.tq + r) + 1] = sum == 0.0f ? std::numeric_limits<float>::infinity() : std::log(sum);
  }
}

}  // namespace

AttentionOut scaled_dot_product_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                          const Tensor& mask, bool is_causal, double scale, double dropout_p,
                                          uint64_t seed) {
  TP_PROFILE("scaled_dot_product_attention");
  const char* op = "scaled_dot_product_attention";
  Tensor q = rows_ok(q_in), k = rows_ok(k_in), v = rows_ok(v_in);
  Tensor m = mask.defined() ? mask : Tensor();
  Layout L = make_layout(op, q, k, v, m, is_causal);
  Shape out_shape = q.sizes();
  out_shape.back() = L.ev;
  Tensor out = empty(out_shape, q.options());  // every row is written below
  // Per query row: the score maximum and the log of the sum of exp(score - maximum), kept apart:
  // in float32, -1e9 + log(Tk) (a fully masked row) would round back to -1e9.
  Shape lse_shape(q.sizes().begin(), q.sizes().end() - 1);
  lse_shape.push_back(2);
  Tensor lse = empty(lse_shape, q.options());
  if (L.bh == 0 || L.tq == 0) return {out, lse};
  const DropoutMask drop(dropout_p, seed);
  if (few_rows(L, q.dtype(), drop.on)) {
    const float* pq = q.data_ptr<float>();
    const float* pk = k.data_ptr<float>();
    const float* pv = v.data_ptr<float>();
    float* po = out.data_ptr<float>();
    float* pl = lse.data_ptr<float>();
    cpu::parallel_for(0, L.bh, task_grain(L, L.tq), [&](int64_t s0, int64_t s1) {
      for (int64_t s = s0; s < s1; ++s) few_rows_attention(L, s, pq, pk, pv, static_cast<float>(scale), po, pl);
    });
    return {out, lse};
  }
  const int64_t row_blocks = (L.tq + kRows - 1) / kRows;

  dispatch_floating(q.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pq = q.data_ptr<T>();
    const T* pk = k.data_ptr<T>();
    const T* pv = v.data_ptr<T>();
    T* po = out.data_ptr<T>();
    T* pl = lse.data_ptr<T>();
    const T tscale = static_cast<T>(scale);
    cpu::parallel_for(0, L.bh * row_blocks, task_grain(L, kRows), [&](int64_t t0, int64_t t1) {
      std::vector<T> S(static_cast<size_t>(kRows * kCols)), acc(static_cast<size_t>(kRows * L.ev));
      std::vector<T> row_max(kRows), row_sum(kRows);
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t s = t / row_blocks, r0 = (t % row_blocks) * kRows, rows = std::min(kRows, L.tq - r0);
        // Only the block's rows: a decoding step's block is one row of kRows.
        std::fill_n(acc.begin(), rows * L.ev, T(0));
        std::fill_n(row_max.begin(), rows, -std::numeric_limits<T>::infinity());
        std::fill_n(row_sum.begin(), rows, T(0));
        for (int64_t c0 = 0; c0 < L.tk; c0 += kCols) {
          if (!causal_visible(L, r0, rows, c0)) break;
          const int64_t cols = std::min(kCols, L.tk - c0);
          block_scores(L, s, pq, pk, r0, rows, c0, cols, tscale, S.data());
          for (int64_t r = 0; r < rows; ++r) {
            T* Sr = S.data() + r * cols;
            T mx = row_max[r];
#pragma omp simd reduction(max : mx)
            for (int64_t c = 0; c < cols; ++c) mx = std::max(mx, Sr[c]);
            // Rescale what was accumulated under the old maximum.
            const T alpha = row_max[r] == -std::numeric_limits<T>::infinity() ? T(0) : vexp(row_max[r] - mx);
            row_max[r] = mx;
            T sum = 0;
#pragma omp simd reduction(+ : sum)
            for (int64_t c = 0; c < cols; ++c) {
              Sr[c] = vexp(Sr[c] - mx);
              sum += Sr[c];
            }
            row_sum[r] = row_sum[r] * alpha + sum;
            T* ar = acc.data() + r * L.ev;
            if (alpha != T(1))
              for (int64_t j = 0; j < L.ev; ++j) ar[j] *= alpha;
            if (drop.on) {
              // The mask hashes the flat index mod 2^32, so the row's base is taken as uint32.
              const uint32_t base = static_cast<uint32_t>((s * L.tq + r0 + r) * L.tk + c0);
              const T ds = static_cast<T>(drop.scale);
#pragma omp simd
              for (int64_t c = 0; c < cols; ++c) Sr[c] = drop.keep(base + static_cast<uint32_t>(c)) ? Sr[c] * ds : T(0);
            }
          }
          // acc += P V_block
          gemm(false, false, rows, L.ev, cols, T(1), S.data(), cols, pv + L.v_off[s] + c0 * L.v_ld, L.v_ld, T(1),
               acc.data(), L.ev);
        }
        for (int64_t r = 0; r < rows; ++r) {
          T* o = po + (s * L.tq + r0 + r) * L.ev;
          // A sum of 0 (no key seen) gives zeros; a NaN sum (a NaN score) stays NaN in the saved
          // log sum, so that the backward's probabilities of the row are NaN as well.
          const T inv = row_sum[r] == T(0) ? T(0) : T(1) / row_sum[r];
          for (int64_t j = 0; j < L.ev; ++j) o[j] = acc[r * L.ev + j] * inv;
          pl[2 * (s * L.tq + r0 + r)] = row_max[r];
          pl[2 * (s * L.tq + r0 + r) + 1] = row_sum[r] == T(0) ? std::numeric_limits<T>::infinity() : std::log(row_sum[r]);
        }
      }
    });
  });
  return {out, lse};
}

AttentionGrads scaled_dot_product_attention_backward(const Tensor& dout_in, const Tensor& q_in, const Tensor& k_in,
                                                     const Tensor& v_in, const Tensor& out, const Tensor& lse,
                                                     const Tensor& mask, bool is_causal, double scale,
                                                     double dropout_p, uint64_t seed) {
  TP_PROFILE("scaled_dot_product_attention_backward");
  const char* op = "scaled_dot_product_attention_backward";
  Tensor q = rows_ok(q_in), k = rows_ok(k_in), v = rows_ok(v_in), dout = rows_ok(dout_in);
  Layout L = make_layout(op, q, k, v, mask, is_causal);
  // dout has out's shape, and may be a view like q (the heads of the next layer's gradient).
  const std::vector<int64_t> do_off =
      lead_offsets(Shape(dout.sizes().begin(), dout.sizes().end() - 2), lead_strides(dout, static_cast<size_t>(dout.dim() - 2)));
  const int64_t do_ld = std::max({dout.stride(-2), L.ev, int64_t(1)});
  Tensor dq = zeros(q.sizes(), q.options()), dk = zeros(k.sizes(), k.options()), dv = zeros(v.sizes(), v.options());
  if (L.bh == 0 || L.tq == 0 || L.tk == 0) return {dq, dk, dv};
  const DropoutMask drop(dropout_p, seed);

  dispatch_floating(q.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *pq = q.data_ptr<T>(), *pk = k.data_ptr<T>(), *pv = v.data_ptr<T>();
    const T *po = out.data_ptr<T>(), *pdo = dout.data_ptr<T>(), *pl = lse.data_ptr<T>();
    T *pdq = dq.data_ptr<T>(), *pdk = dk.data_ptr<T>(), *pdv = dv.data_ptr<T>();
    const T tscale = static_cast<T>(scale);
    // One task per (batch..., head): dK and dV of a key block gather over every query block,
    // and dQ over every key block, so a slice is one thread's and the sums keep one order.
    cpu::parallel_for(0, L.bh, task_grain(L, L.tq), [&](int64_t s0, int64_t s1) {
      std::vector<T> P(static_cast<size_t>(kRows * kCols)), dP(static_cast<size_t>(kRows * kCols));
      std::vector<unsigned char> M(static_cast<size_t>(kRows * kCols));  // which scores the mask took
      std::vector<T> D(static_cast<size_t>(L.tq));
      for (int64_t s = s0; s < s1; ++s) {
        // D_i = dO_i . O_i, which equals sum_j P_ij dP_ij (dropout included).
        const T* dO = pdo + do_off[static_cast<size_t>(s)];
        for (int64_t i = 0; i < L.tq; ++i) {
          const T* o = po + (s * L.tq + i) * L.ev;
          const T* g = dO + i * do_ld;
          T d = 0;
#pragma omp simd reduction(+ : d)
          for (int64_t j = 0; j < L.ev; ++j) d += o[j] * g[j];
          D[i] = d;
        }
        const T* Q = pq + L.q_off[s];
        const T* K = pk + L.k_off[s];
        const T* V = pv + L.v_off[s];
        T* dQ = pdq + s * L.tq * L.e;
        T* dK = pdk + s * L.tk * L.e;
        T* dV = pdv + s * L.tk * L.ev;
        for (int64_t c0 = 0; c0 < L.tk; c0 += kCols) {
          const int64_t cols = std::min(kCols, L.tk - c0);
          for (int64_t r0 = 0; r0 < L.tq; r0 += kRows) {
            const int64_t rows = std::min(kRows, L.tq - r0);
            if (!causal_visible(L, r0, rows, c0)) continue;
            block_scores(L, s, pq, pk, r0, rows, c0, cols, tscale, P.data(), M.data());
            // dP' = dO V^T (the gradient of the dropped probabilities)
            gemm(false, true, rows, cols, L.ev, T(1), dO + r0 * do_ld, do_ld, V + c0 * L.v_ld, L.v_ld, T(0), dP.data(),
                 cols);
            for (int64_t r = 0; r < rows; ++r) {
              const T row_max = pl[2 * (s * L.tq + r0 + r)], log_sum = pl[2 * (s * L.tq + r0 + r) + 1];
              T* Pr = P.data() + r * cols;
              T* dPr = dP.data() + r * cols;
              const unsigned char* Mr = M.data() + r * cols;
              const uint32_t base = static_cast<uint32_t>((s * L.tq + r0 + r) * L.tk + c0);
              const T Dr = D[r0 + r], dscale = static_cast<T>(drop.scale);
              // dS = P (dP - D); masked scores (by the mask, not by value) get none. Two loops, so
              // that each vectorizes without a branch on dropout inside.
              if (drop.on) {
#pragma omp simd
                for (int64_t c = 0; c < cols; ++c) {
                  const bool masked = Mr[c] != 0;
                  const T p = vexp((Pr[c] - row_max) - log_sum);
                  const T z = drop.keep(base + static_cast<uint32_t>(c)) ? dscale : T(0);
                  dPr[c] = masked ? T(0) : p * (dPr[c] * z - Dr);
                  Pr[c] = p * z;  // the dropped probabilities, for dV
                }
              } else {
#pragma omp simd
                for (int64_t c = 0; c < cols; ++c) {
                  const bool masked = Mr[c] != 0;
                  const T p = vexp((Pr[c] - row_max) - log_sum);
                  dPr[c] = masked ? T(0) : p * (dPr[c] - Dr);
                  Pr[c] = p;
                }
              }
            }
            // dV += P'^T dO, dQ += scale dS K, dK += scale dS^T Q
            gemm(true, false, cols, L.ev, rows, T(1), P.data(), cols, dO + r0 * do_ld, do_ld, T(1), dV + c0 * L.ev,
                 L.ev);
            gemm(false, false, rows, L.e, cols, tscale, dP.data(), cols, K + c0 * L.k_ld, L.k_ld, T(1),
                 dQ + r0 * L.e, L.e);
            gemm(true, false, cols, L.e, rows, tscale, dP.data(), cols, Q + r0 * L.q_ld, L.q_ld, T(1), dK + c0 * L.e,
                 L.e);
          }
        }
      }
    });
  });
  return {dq, dk, dv};
}

}  // namespace tapestry::kernels::cpu
