// The CUDA backend's tiled attention (ops/detail/attention_tiles.h), run on the CPU. Its kernels are
// written as the steps one thread takes between two barriers; here every step runs for every
// thread of a block before the next step starts, which is all a barrier guarantees, so the
// algorithm (online softmax, masks, causal skipping, dropout indices, the backward) is checked
// against the CPU kernel on every run, GPU or not. Shared memory is filled with NaN before each
// tile is staged and the outputs start as NaN, so a read past what was staged or an output left
// unwritten shows. What this cannot check (launch sizes, shared memory limits, the hardware) is
// left to tests/device_check.cpp on a GPU, which runs both attention kernels against the CPU.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "tapestry/ops/detail/attention_tiles.h"
#include "tapestry/ops/cuda.h"
#include "tests/helpers.h"

using namespace tapestry;
namespace tiles = tapestry::kernels::tiles;

namespace {

template <class T> T nan_value() { return std::numeric_limits<T>::quiet_NaN(); }

Tensor nan_filled(const Shape& shape, DType dtype) { return full(shape, std::numeric_limits<double>::quiet_NaN(), TensorOptions(dtype)); }

struct Case {
  Tensor q, k, v, mask;
  bool causal = false;
  double scale = 0.5, dropout = 0;
  uint64_t seed = 17;
};

// A kernel with a thread per query row (the forward, dQ) as the GPU runs it: grid (query blocks,
// slices), kThreads threads per block, each step for every thread before the next step.
template <class T, int HEAD, class Steps>
void emulate_query_rows(const tiles::Params<T>& P, T* out0, T* out1) {
  constexpr int kTile = tiles::tile_len<T, HEAD>();
  std::vector<T> Ks(kTile * HEAD), Vs(kTile * HEAD);
  const int n = tiles::kThreads;
  for (int64_t s = 0; s < P.bh; ++s)
    for (int64_t r0 = 0; r0 < P.tq; r0 += n) {
      std::vector<typename Steps::State> rows(n);
      auto live = [&](int t) { return r0 + t < P.tq; };
      for (int t = 0; t < n; ++t)
        if (live(t)) Steps::begin(P, s, r0 + t, rows[t]);
      const int64_t end = tiles::key_end(P, std::min<int64_t>(P.tq, r0 + n));
      for (int64_t j0 = 0; j0 < end; j0 += kTile) {
        const int64_t len = std::min<int64_t>(kTile, end - j0);
        std::fill(Ks.begin(), Ks.end(), nan_value<T>());
        std::fill(Vs.begin(), Vs.end(), nan_value<T>());
        for (int t = 0; t < n; ++t) tiles::stage_keys<T, HEAD>(P, s, j0, len, t, n, Ks.data(), Vs.data());
        for (int t = 0; t < n; ++t)
          if (live(t)) Steps::consume(P, j0, len, Ks.data(), Vs.data(), rows[t]);
      }
      for (int t = 0; t < n; ++t)
        if (live(t)) Steps::end(P, rows[t], out0, out1);
    }
}

template <class T, int HEAD>
kernels::AttentionOut emulate_forward(const Case& c) {
  const Tensor q = c.q.contiguous(), k = c.k.contiguous(), v = c.v.contiguous();
  Tensor mask_copy;
  const tiles::Params<T> P =
      tiles::make_params<T>("emulate", q, k, v, c.mask, c.causal, c.scale, c.dropout, c.seed, &mask_copy);
  Shape out_shape = q.sizes(), lse_shape(q.sizes().begin(), q.sizes().end() - 1);
  out_shape.back() = P.ev;
  lse_shape.push_back(2);
  Tensor out = nan_filled(out_shape, q.dtype()), lse = nan_filled(lse_shape, q.dtype());
  emulate_query_rows<T, HEAD, tiles::ForwardSteps<T, HEAD>>(P, out.data_ptr<T>(), lse.data_ptr<T>());
  return {out, lse};
}

// The backward: the dQ kernel over query blocks, then the dK/dV kernel over key blocks.
template <class T, int HEAD>
kernels::AttentionGrads emulate_backward(const Case& c, const Tensor& dout_in, const Tensor& out_in,
                                         const Tensor& lse) {
  const Tensor q = c.q.contiguous(), k = c.k.contiguous(), v = c.v.contiguous();
  const Tensor dout = dout_in.contiguous(), out = out_in.contiguous(), stats = lse.contiguous();
  Tensor mask_copy;
  tiles::Params<T> P =
      tiles::make_params<T>("emulate", q, k, v, c.mask, c.causal, c.scale, c.dropout, c.seed, &mask_copy);
  Tensor dq = nan_filled(q.sizes(), q.dtype()), dk = nan_filled(k.sizes(), q.dtype()),
         dv = nan_filled(v.sizes(), q.dtype());
  Tensor d = nan_filled({std::max<int64_t>(P.bh * P.tq, 1)}, q.dtype());
  P.out = out.data_ptr<T>(), P.dout = dout.data_ptr<T>(), P.stats = stats.data_ptr<T>(), P.d = d.data_ptr<T>();
  emulate_query_rows<T, HEAD, tiles::QueryGradSteps<T, HEAD>>(P, dq.data_ptr<T>(), nullptr);
  constexpr int kTile = tiles::tile_len<T, HEAD>();
  const int n = tiles::kThreads;
  std::vector<T> A(kTile * HEAD), B(kTile * HEAD), rows3(3 * kTile);
  for (int64_t s = 0; s < P.bh; ++s)
    for (int64_t c0 = 0; c0 < P.tk; c0 += n) {
      std::vector<tiles::KeyGrad<T, HEAD>> keys(n);
      auto live = [&](int t) { return c0 + t < P.tk; };
      for (int t = 0; t < n; ++t)
        if (live(t)) tiles::dkv_begin(P, s, c0 + t, keys[t]);
      for (int64_t i0 = tiles::query_begin(P, c0); i0 < P.tq; i0 += kTile) {
        const int64_t len = std::min<int64_t>(kTile, P.tq - i0);
        std::fill(A.begin(), A.end(), nan_value<T>());
        std::fill(B.begin(), B.end(), nan_value<T>());
        std::fill(rows3.begin(), rows3.end(), nan_value<T>());
        for (int t = 0; t < n; ++t) tiles::stage_queries<T, HEAD>(P, s, i0, len, t, n, A.data(), B.data(), rows3.data());
        for (int t = 0; t < n; ++t)
          if (live(t)) tiles::dkv_consume(P, i0, len, A.data(), B.data(), rows3.data(), keys[t]);
      }
      for (int t = 0; t < n; ++t)
        if (live(t)) tiles::dkv_end(P, keys[t], dk.data_ptr<T>(), dv.data_ptr<T>());
    }
  return {dq, dk, dv};
}

// Every element within atol + rtol |expected|, NaN exactly where NaN, equal infinities.
void check_close(const Tensor& got, const Tensor& expected, double rtol, double atol, const std::string& what) {
  INFO(what);
  REQUIRE(got.sizes() == expected.sizes());
  const std::vector<double> x = got.to_vector<double>(), y = expected.to_vector<double>();
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const bool same = (std::isnan(x[i]) && std::isnan(y[i])) || x[i] == y[i] ||
                      (!std::isnan(x[i]) && !std::isnan(y[i]) && std::fabs(x[i] - y[i]) <= atol + rtol * std::fabs(y[i]));
    if (!same && bad++ == 0) first = i;
  }
  INFO("first mismatch at flat index ", first, ": ", bad ? x[first] : 0.0, " vs ", bad ? y[first] : 0.0);
  CHECK(bad == 0);
}

// The emulated tiled kernels against the CPU kernel: out, statistics, dQ, dK, dV.
void check_case(const Case& c, const std::string& what) {
  const bool f32 = c.q.dtype() == kFloat32;
  const double rtol = f32 ? 2e-5 : 1e-11, atol = f32 ? 2e-6 : 1e-13;
  const kernels::AttentionOut ref =
      kernels::scaled_dot_product_attention(c.q, c.k, c.v, c.mask, c.causal, c.scale, c.dropout, c.seed);
  Generator g(99);
  const Tensor dout = randn(ref.out.sizes(), c.q.dtype(), &g);
  const kernels::AttentionGrads ref_grads = kernels::scaled_dot_product_attention_backward(
      dout, c.q, c.k, c.v, ref.out, ref.lse, c.mask, c.causal, c.scale, c.dropout, c.seed);
  kernels::AttentionOut got;
  kernels::AttentionGrads grads;
  dispatch_floating(c.q.dtype(), "emulate", [&](auto tag) {
    using T = typename decltype(tag)::type;
    tiles::with_head(c.q.size(-1), c.v.size(-1), [&](auto head) {
      constexpr int kHead = decltype(head)::value;
      got = emulate_forward<T, kHead>(c);
      // The backward from the CPU's saved output and statistics, so that each part is checked alone.
      grads = emulate_backward<T, kHead>(c, dout, ref.out, ref.lse);
    });
  });
  check_close(got.out, ref.out, rtol, atol, what + ": out");
  check_close(got.lse, ref.lse, rtol, atol, what + ": statistics");
  check_close(grads.dq, ref_grads.dq, rtol * 10, atol * 10, what + ": dq");
  check_close(grads.dk, ref_grads.dk, rtol * 10, atol * 10, what + ": dk");
  check_close(grads.dv, ref_grads.dv, rtol * 10, atol * 10, what + ": dv");
}

Case make_case(const Shape& lead, int64_t tq, int64_t tk, int64_t e, int64_t ev, DType dtype, uint64_t seed = 1) {
  Generator g(seed);
  auto with = [&lead](int64_t a, int64_t b) {
    Shape s = lead;
    s.push_back(a);
    s.push_back(b);
    return s;
  };
  Case c;
  c.q = randn(with(tq, e), dtype, &g), c.k = randn(with(tk, e), dtype, &g), c.v = randn(with(tk, ev), dtype, &g);
  c.scale = e > 0 ? 1.0 / std::sqrt(static_cast<double>(e)) : 1.0;
  return c;
}

}  // namespace

TEST_CASE("tiled attention (the CUDA kernels' steps, run on the CPU) equals the CPU kernel") {
  for (DType dtype : {kFloat64, kFloat32}) {
    const std::string dt = dtype_name(dtype);
    SUBCASE("shapes across tiles and blocks, each head size") {
      check_case(make_case({2, 3}, 70, 130, 16, 24, dtype), dt + " 70 x 130, e 16, ev 24");
      check_case(make_case({2}, 1, 1, 5, 5, dtype), dt + " one query, one key");
      check_case(make_case({3}, 65, 64, 64, 64, dtype), dt + " 65 x 64, head 64");
      check_case(make_case({1}, 40, 33, 100, 20, dtype), dt + " head 128 (e 100, ev 20)");
      check_case(make_case({}, 9, 200, 8, 8, dtype), dt + " no leading dims, 9 x 200");
    }
    SUBCASE("causal: square, more keys, more queries") {
      for (auto [tq, tk] : {std::pair<int64_t, int64_t>{130, 130}, {20, 150}, {150, 40}}) {
        Case c = make_case({2}, tq, tk, 12, 12, dtype);
        c.causal = true;
        check_case(c, fmt::format("{} causal {} x {}", dt, tq, tk));
      }
    }
    SUBCASE("masks: padding, full, fully masked rows, with causality, more than 8 leading dims") {
      Case c = make_case({2, 2}, 70, 90, 8, 8, dtype);
      Generator g(5);
      c.mask = gt(rand({2, 1, 1, 90}, kFloat64, &g), 0.7);  // padding, broadcast over heads and queries
      check_case(c, dt + " padding mask");
      c.mask = gt(rand({70, 90}, kFloat64, &g), 0.5);
      check_case(c, dt + " full mask");
      Tensor m = zeros({70, 90}, kBool);
      m.narrow(0, 3, 2).fill_(1.0);  // queries 3 and 4 see nothing: they attend evenly
      c.mask = logical_or(m, gt(rand({70, 90}, kFloat64, &g), 0.8));
      check_case(c, dt + " fully masked rows");
      c.causal = true;
      check_case(c, dt + " mask and causal");
      Case deep = make_case({1, 1, 1, 1, 1, 1, 1, 2, 2}, 6, 7, 4, 4, dtype);
      deep.mask = gt(rand({1, 1, 1, 1, 1, 1, 1, 2, 1, 6, 7}, kFloat64, &g), 0.5).squeeze(-3);
      check_case(deep, dt + " 9 leading dims (the mask is copied)");
    }
    SUBCASE("dropout: the same elements as the CPU kernel") {
      Case c = make_case({2, 2}, 70, 130, 8, 8, dtype);
      c.dropout = 0.3, c.seed = 1234;
      check_case(c, dt + " dropout 0.3");
      c.causal = true;
      check_case(c, dt + " dropout 0.3, causal");
    }
    SUBCASE("empty sizes and zero widths") {
      check_case(make_case({2}, 3, 0, 4, 4, dtype), dt + " no keys");
      check_case(make_case({2}, 3, 5, 0, 4, dtype), dt + " e = 0");
      check_case(make_case({2}, 3, 5, 4, 0, dtype), dt + " ev = 0");
      check_case(make_case({0}, 3, 5, 4, 4, dtype), dt + " no slices");
      check_case(make_case({2}, 0, 5, 4, 4, dtype), dt + " no queries");
    }
    SUBCASE("inf and NaN: NaN where the CPU kernel has NaN") {
      Case c = make_case({1}, 5, 6, 4, 4, dtype);
      c.q.select(0, 0).select(0, 1).select(0, 2).fill_(std::numeric_limits<double>::quiet_NaN());
      c.v.select(0, 0).select(0, 3).select(0, 0).fill_(std::numeric_limits<double>::infinity());
      Generator g(8);
      c.mask = gt(rand({5, 6}, kFloat64, &g), 0.6);
      check_case(c, dt + " NaN in q, inf in v, with a mask");
    }
  }
}

TEST_CASE("tiled attention: the head size picks the kernel, and cuda::parse_attention_kernel") {
  int picked = 0;
  tiles::with_head(3, 40, [&](auto head) { picked = decltype(head)::value; });
  CHECK(picked == 64);
  tiles::with_head(0, 0, [&](auto head) { picked = decltype(head)::value; });
  CHECK(picked == 32);
  CHECK(tiles::head_fits(128, 128));
  CHECK_FALSE(tiles::head_fits(129, 64));
  CHECK(tiles::tile_len<float, 64>() == 64);
  CHECK(tiles::tile_len<double, 128>() == 16);
  CHECK(cuda::parse_attention_kernel("tiled") == cuda::AttentionKernel::Tiled);
  CHECK(cuda::parse_attention_kernel("gemm") == cuda::AttentionKernel::Gemm);
  CHECK(cuda::parse_attention_kernel("auto") == cuda::AttentionKernel::Auto);
  CHECK_THROWS_WITH_AS(cuda::parse_attention_kernel("fast"), doctest::Contains("expected auto, gemm or tiled"), Error);
  const cuda::AttentionKernel before = cuda::attention_kernel();
  cuda::set_attention_kernel(cuda::AttentionKernel::Tiled);
  CHECK(cuda::attention_kernel() == cuda::AttentionKernel::Tiled);
  cuda::set_attention_kernel(before);
}
