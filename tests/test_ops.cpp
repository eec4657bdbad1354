// Forward values of every op against hand-computed numbers, on contiguous, strided and
// broadcast inputs.
#include <cmath>

#include "tapestry/ops/cpu/gemm.h"
#include "tests/helpers.h"

using namespace tapestry;
using namespace tapestry::testing;

TEST_CASE("binary ops broadcast like NumPy") {
  Tensor a = tensor({1.f, 2.f, 3.f, 4.f, 5.f, 6.f}, {2, 3});
  Tensor row = tensor({10.f, 20.f, 30.f});
  Tensor col = tensor({1.f, 2.f}, {2, 1});
  check_values(a + row, {11, 22, 33, 14, 25, 36});
  check_values(a - col, {0, 1, 2, 2, 3, 4});
  check_values(a * col, {1, 2, 3, 8, 10, 12});
  check_values(a / row, {0.1, 0.1, 0.1, 0.4, 0.25, 0.2});
  check_values(col + row, {11, 21, 31, 12, 22, 32});  // (2,1) + (3) -> (2,3)
  check_values(a * 2.0f, {2, 4, 6, 8, 10, 12});
  check_values(1.0 - a, {0, -1, -2, -3, -4, -5});
  check_values(12.0 / a, {12, 6, 4, 3, 2.4, 2});
  check_values(-a, {-1, -2, -3, -4, -5, -6});
  check_values(a.t() + tensor({1.f, 2.f}), {2, 6, 3, 7, 4, 8});  // transposed input
  check_values(maximum(a, full({}, 3.5)), {3.5, 3.5, 3.5, 4, 5, 6});
  check_values(minimum(a, row), {1, 2, 3, 4, 5, 6});
  check_values(arange(4) + arange(4), {0, 2, 4, 6});
  check_values(arange(4) * 3.0, {0, 3, 6, 9});
}

TEST_CASE("unary ops match their definitions") {
  Tensor x = tensor({-2.0, -0.5, 0.0, 0.5, 2.0}, {}, kFloat64);
  check_values(exp(x), {std::exp(-2.0), std::exp(-0.5), 1, std::exp(0.5), std::exp(2.0)});
  check_values(log(tensor({1.0, M_E, 10.0}, {}, kFloat64)), {0, 1, std::log(10.0)});
  check_values(sqrt(tensor({4.0, 9.0}, {}, kFloat64)), {2, 3});
  check_values(rsqrt(tensor({4.0, 0.25}, {}, kFloat64)), {0.5, 2});
  check_values(pow(tensor({2.0, 3.0}, {}, kFloat64), 3.0), {8, 27});
  check_values(pow(tensor({4.0}, {}, kFloat64), -0.5), {0.5});
  check_values(tanh(x), {std::tanh(-2.0), std::tanh(-0.5), 0, std::tanh(0.5), std::tanh(2.0)});
  check_values(relu(x), {0, 0, 0, 0.5, 2});
  // gelu(x) = x * Phi(x); Phi(0.5) = 0.691462461274013, Phi(2) = 0.977249868051821
  check_values(gelu(x), {-2 * (1 - 0.977249868051821), -0.5 * (1 - 0.691462461274013), 0,
                         0.5 * 0.691462461274013, 2 * 0.977249868051821});
  check_values(sigmoid(x), {1 / (1 + std::exp(2.0)), 1 / (1 + std::exp(0.5)), 0.5, 1 / (1 + std::exp(-0.5)),
                            1 / (1 + std::exp(-2.0))});
  check_values(sigmoid(tensor({-1000.0, 1000.0}, {}, kFloat64)), {0, 1});  // no overflow
  check_values(abs(x), {2, 0.5, 0, 0.5, 2});
  check_values(clamp(x, -1, 1), {-1, -0.5, 0, 0.5, 1});
  check_values(abs(arange(-2.0, 2.0, 1.0, kInt64)), {2, 1, 0, 1});
  check_values(x.slice(0, 0, 5, 2).exp(), {std::exp(-2.0), 1, std::exp(2.0)});  // strided input
}

TEST_CASE("comparisons give bool masks - where and masked_fill select") {
  Tensor a = tensor({1.f, 2.f, 3.f});
  Tensor b = tensor({3.f, 2.f, 1.f});
  check_values(eq(a, b), {0, 1, 0});
  check_values(ne(a, b), {1, 0, 1});
  check_values(lt(a, b), {1, 0, 0});
  check_values(le(a, b), {1, 1, 0});
  check_values(gt(a, 1.5), {0, 1, 1});
  check_values(ge(a, 2.0), {0, 1, 1});
  check_values(logical_not(gt(a, 1.5)), {1, 0, 0});
  check_values(where(gt(a, b), a, b), {3, 2, 3});
  check_values(where(gt(a, 1.5), a, 0.0), {0, 2, 3});
  Tensor m = tensor({1.f, 2.f, 3.f, 4.f}, {2, 2});
  Tensor causal = gt(arange(2).unsqueeze(0), arange(2).unsqueeze(1));  // j > i
  check_values(m.masked_fill(causal, -1e9), {1, -1e9, 3, 4});
  m.masked_fill_(causal, 0.0);
  check_values(m, {1, 0, 3, 4});
}

TEST_CASE("reductions over any dims with keepdim") {
  Tensor a = arange(0.0, 24.0, 1.0, kFloat32).reshape({2, 3, 4});
  check_values(sum(a), {276});
  check_values(sum(a, {0}), {12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34});
  Tensor s = sum(a, {0, 2}, true);
  CHECK(s.sizes() == Shape{1, 3, 1});
  check_values(s, {60, 92, 124});
  check_values(sum(a, {-1}).select(0, 1), {54, 70, 86});
  check_values(mean(a, {1}), {4, 5, 6, 7, 16, 17, 18, 19});
  check_values(a.mean(), {11.5});
  check_values(sum(a.transpose(0, 2), {2}), {12, 20, 28, 14, 22, 30, 16, 24, 32, 18, 26, 34});
  check_values(sum(arange(5)), {10});
  CHECK(sum(arange(5)).dtype() == kInt64);
  check_values(sum(gt(arange(5), 1)), {3});
  // var with Bessel's correction: var([1,2,3,4]) = 1.6667; population: 1.25
  Tensor v = tensor({1.0, 2.0, 3.0, 4.0}, {}, kFloat64);
  check_values(var(v), {5.0 / 3.0});
  check_values(var(v, {}, 0), {1.25});
  check_values(var(tensor({1.0, 3.0, 2.0, 6.0}, {2, 2}, kFloat64), {1}), {2, 8});
  check_values(sum(zeros({0, 3}), {0}), {0, 0, 0});
}

TEST_CASE("max and min give values and indices, first occurrence on ties") {
  Tensor a = tensor({3.f, 7.f, 7.f, 1.f, -2.f, 5.f}, {2, 3});
  auto [vals, idx] = max(a, 1);
  check_values(vals, {7, 5});
  CHECK(idx.to_vector<int64_t>() == std::vector<int64_t>{1, 2});
  auto mn = min(a, 0, true);
  CHECK(mn.values.sizes() == Shape{1, 3});
  check_values(mn.values, {1, -2, 5});
  CHECK(mn.indices.to_vector<int64_t>() == std::vector<int64_t>{1, 1, 1});
  CHECK(argmax(a, 0).to_vector<int64_t>() == std::vector<int64_t>{0, 0, 0});
  CHECK(argmax(a.t(), 0).to_vector<int64_t>() == std::vector<int64_t>{1, 2});
  check_values(max(a), {7});
  check_values(min(a), {-2});
  CHECK(std::isnan(max(tensor({1.0, NAN, 3.0}, {}, kFloat64)).item<double>()));
}

TEST_CASE("max, min and argmax over long rows (the vectorized path): first occurrence, NaN first, signed zeros") {
  // Rows of 64 and more take the 16-lane path; the scalar loop over the same values is the reference.
  Generator g(11);
  for (int64_t n : {64, 65, 100, 1000}) {
    Tensor x = randint(-5, 6, {7, n}, kFloat64, &g);  // few distinct values: many ties
    std::vector<double> v = x.to_vector<double>();
    v[static_cast<size_t>(1 * n + n - 1)] = NAN;                  // row 1: a NaN at the end
    v[static_cast<size_t>(2 * n + 3)] = NAN, v[static_cast<size_t>(2 * n + 40)] = NAN;  // row 2: the first NaN wins
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(3 * n + i)] = i % 2 ? 0.0 : -0.0;  // row 3: -0 first
    v[static_cast<size_t>(4 * n + n - 1)] = 99;                   // row 4: the maximum at the end
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(5 * n + i)] = -INFINITY;
    for (DType dt : {kFloat64, kFloat32, kInt64}) {
      std::vector<double> finite = v;  // int64: NaN and -inf become 0 and -1e9
      for (double& e : finite) e = std::isnan(e) ? 0.0 : std::isinf(e) ? std::copysign(1e9, e) : e;
      Tensor t = tensor(dt == kInt64 ? finite : v, {7, n}).to(dt);
      const std::vector<double> tv = t.to(kFloat64).to_vector<double>();
      for (bool is_max : {true, false}) {
        auto [vals, idx] = is_max ? max(t, 1) : min(t, 1);
        const std::vector<double> got = vals.to(kFloat64).to_vector<double>();
        const std::vector<int64_t> at = idx.to_vector<int64_t>();
        for (int64_t r = 0; r < 7; ++r) {
          int64_t best = 0;
          const double* row = tv.data() + r * n;
          for (int64_t i = 1; i < n && !std::isnan(row[best]); ++i)
            if (std::isnan(row[i]) || (is_max ? row[i] > row[best] : row[i] < row[best])) best = i;
          CHECK_MESSAGE(at[static_cast<size_t>(r)] == best, "row ", r, " n ", n, " ", dt);
          const double want = row[best], have = got[static_cast<size_t>(r)];
          CHECK((std::isnan(want) ? std::isnan(have) : have == want && std::signbit(have) == std::signbit(want)));
        }
      }
    }
  }
}

TEST_CASE("log_softmax and softmax over long rows equal float64's in float32") {
  Generator g(12);
  for (int64_t n : {1, 255, 256, 257, 8000}) {
    Tensor x = randn({5, n}, kFloat32, &g) * 30.0;
    Tensor ref = log_softmax(x.to(kFloat64), -1);
    CHECK(max_diff(log_softmax(x, -1), ref) <= 2e-6);
    CHECK(max_diff(softmax(x, -1), softmax(x.to(kFloat64), -1)) <= 2e-6);
    // The same along a non-last dim (the strided loops).
    CHECK(max_diff(log_softmax(x.t().contiguous(), 0), ref.t()) <= 2e-6);
  }
}

TEST_CASE("float32 gemm of every small shape (the register loop) equals float64's, any transpose, alpha, beta") {
  Generator g(13);
  const std::vector<int64_t> sizes = {1, 2, 3, 4, 5, 15, 16, 17, 31, 32, 33, 40};
  int64_t tried = 0;
  for (int64_t m : {1, 2, 3, 5})
    for (int64_t n : sizes)
      for (int64_t k : sizes)
        for (int flags = 0; flags < 4; ++flags) {
          const bool ta = flags & 1, tb = flags & 2;
          const double alpha = tried % 3 == 0 ? 1.0 : 0.37, beta = tried % 4 == 0 ? 0.0 : (tried % 4 == 1 ? 1.0 : -0.5);
          // A is m x k (stored k x m when ta), B k x n (stored n x k when tb), C m x n with a wider row stride.
          const int64_t lda = (ta ? m : k) + 1, ldb = (tb ? k : n) + 2, ldc = n + 3;
          Tensor a = randn({ta ? k : m, lda}, kFloat64, &g), b = randn({tb ? n : k, ldb}, kFloat64, &g);
          Tensor c = randn({m, ldc}, kFloat64, &g);
          if (beta == 0.0) c.select(1, 0).fill_(NAN);  // beta 0 ignores C, NaN included (as BLAS)
          std::vector<float> af = a.to(kFloat32).to_vector<float>(), bf = b.to(kFloat32).to_vector<float>(),
                             cf = c.to(kFloat32).to_vector<float>();
          std::vector<double> ad = a.to(kFloat32).to(kFloat64).to_vector<double>(),
                              bd = b.to(kFloat32).to(kFloat64).to_vector<double>(),
                              cd = c.to(kFloat32).to(kFloat64).to_vector<double>();
          kernels::cpu::gemm(ta, tb, m, n, k, static_cast<float>(alpha), af.data(), lda, bf.data(), ldb,
                             static_cast<float>(beta), cf.data(), ldc);
          double worst = 0;
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
              double s = 0;
              for (int64_t p = 0; p < k; ++p)
                s += (ta ? ad[p * lda + i] : ad[i * lda + p]) * (tb ? bd[j * ldb + p] : bd[p * ldb + j]);
              const double want = alpha * s + (beta == 0.0 ? 0.0 : beta * cd[i * ldc + j]);
              worst = std::max(worst, std::fabs(cf[static_cast<size_t>(i * ldc + j)] - want) / (1.0 + std::fabs(want)));
            }
          // Columns past n are never written.
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = n; j < ldc; ++j)
              if (!(cf[static_cast<size_t>(i * ldc + j)] == static_cast<float>(cd[i * ldc + j]))) worst = INFINITY;
          CHECK_MESSAGE(worst <= 1e-5, "m ", m, " n ", n, " k ", k, " ta ", ta, " tb ", tb);
          ++tried;
        }
  CHECK(tried == 4 * 12 * 12 * 4);
}

TEST_CASE("softmax and log_softmax are stable and normalized") {
  Tensor x = tensor({1.0, 2.0, 3.0, 1000.0, 1000.0, 1000.0}, {2, 3}, kFloat64);
  double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  check_values(softmax(x, 1), {std::exp(1.0) / z, std::exp(2.0) / z, std::exp(3.0) / z, 1 / 3.0, 1 / 3.0, 1 / 3.0});
  check_values(log_softmax(x, -1), {1 - std::log(z), 2 - std::log(z), 3 - std::log(z), -std::log(3.0),
                                    -std::log(3.0), -std::log(3.0)});
  check_values(softmax(x, 0).select(1, 0), {0, 1});  // [1, 1000] along dim 0
  // over a middle dim of a 3-D tensor, and with -inf masking
  Tensor y = zeros({2, 3, 2}, kFloat64);
  check_values(sum(softmax(y, 1), {1}), {1, 1, 1, 1});
  Tensor masked = tensor({0.0, 0.0, -INFINITY}, {}, kFloat64);
  check_values(softmax(masked, 0), {0.5, 0.5, 0});
}

TEST_CASE("layer_norm normalizes the trailing dims") {
  Tensor x = tensor({1.0, 2.0, 3.0, 4.0, 2.0, 2.0, 2.0, 2.0}, {2, 4}, kFloat64);
  // row 0: mean 2.5, var 1.25
  double r = 1 / std::sqrt(1.25 + 1e-5);
  check_values(layer_norm(x, {4}), {-1.5 * r, -0.5 * r, 0.5 * r, 1.5 * r, 0, 0, 0, 0}, 1e-9);
  Tensor w = tensor({1.0, 2.0, 1.0, 1.0}, {}, kFloat64), b = tensor({0.0, 0.0, 0.0, 10.0}, {}, kFloat64);
  check_values(layer_norm(x, {4}, w, b), {-1.5 * r, -1.0 * r, 0.5 * r, 1.5 * r + 10, 0, 0, 0, 10}, 1e-9);
  check_values(layer_norm(x.reshape({2, 2, 2}), {2, 2}), {-1.5 * r, -0.5 * r, 0.5 * r, 1.5 * r, 0, 0, 0, 0}, 1e-9);
}

TEST_CASE("matmul: 2-D, batched, broadcast, transposed and 1-D operands") {
  Tensor a = tensor({1.f, 2.f, 3.f, 4.f, 5.f, 6.f}, {2, 3});
  Tensor b = tensor({7.f, 8.f, 9.f, 10.f, 11.f, 12.f}, {3, 2});
  check_values(matmul(a, b), {58, 64, 139, 154});
  check_values(matmul(b.t(), a.t()), {58, 139, 64, 154});  // transposes passed to gemm, no copy
  check_values(matmul(a, a.t()), {14, 32, 32, 77});
  Tensor batch = stack({a, a * 2.0});  // (2, 2, 3)
  Tensor out = matmul(batch, b);       // b broadcast over the batch
  CHECK(out.sizes() == Shape{2, 2, 2});
  check_values(out, {58, 64, 139, 154, 116, 128, 278, 308});
  Tensor bb = stack({b, b}).unsqueeze(0);  // (1, 2, 3, 2) with batch (2, 1)-broadcast
  CHECK(matmul(batch.unsqueeze(1), bb).sizes() == Shape{2, 2, 2, 2});
  check_values(matmul(tensor({1.f, 1.f, 1.f}), b), {27, 30});
  check_values(matmul(a, tensor({1.f, 0.f, 1.f})), {4, 10});
  check_values(matmul(tensor({1.f, 2.f}), tensor({3.f, 4.f})), {11});
  // a slice with a row stride larger than its width, and a fully strided operand that needs a copy
  Tensor wide = arange(0.0, 12.0, 1.0, kFloat64).reshape({3, 4});
  check_values(matmul(wide.slice(1, 0, 2), tensor({1.0, 1.0}, {2, 1}, kFloat64)), {1, 9, 17});
  check_values(matmul(wide.slice(1, 0, 4, 2), tensor({1.0, 1.0}, {2, 1}, kFloat64)), {2, 10, 18});
  check_values(matmul(zeros({2, 0}), zeros({0, 3})), {0, 0, 0, 0, 0, 0});
}

TEST_CASE("indexing: index_select, embedding, gather, cat, stack, split, chunk") {
  Tensor w = arange(0.0, 12.0, 1.0, kFloat32).reshape({4, 3});
  check_values(index_select(w, 0, tensor({2, 0, 2})), {6, 7, 8, 0, 1, 2, 6, 7, 8});
  check_values(index_select(w, 1, tensor({1})), {1, 4, 7, 10});
  Tensor ids = tensor({3, 1, 0, 3}, {2, 2});
  Tensor e = embedding(w, ids);
  CHECK(e.sizes() == Shape{2, 2, 3});
  check_values(e, {9, 10, 11, 3, 4, 5, 0, 1, 2, 9, 10, 11});
  Tensor g = gather(w, 1, tensor({2, 0, 1, 1}, {4, 1}));
  check_values(g, {2, 3, 7, 10});
  Tensor c = cat({w.slice(0, 0, 1), w.slice(0, 3, 4)}, 0);
  check_values(c, {0, 1, 2, 9, 10, 11});
  check_values(cat({w.slice(1, 0, 1), w.slice(1, 2, 3)}, 1), {0, 2, 3, 5, 6, 8, 9, 11});
  Tensor st = stack({tensor({1.f, 2.f}), tensor({3.f, 4.f})}, 1);
  CHECK(st.sizes() == Shape{2, 2});
  check_values(st, {1, 3, 2, 4});
  auto parts = split(arange(5), 2);
  REQUIRE(parts.size() == 3);
  check_values(parts[2], {4});
  CHECK(parts[1].storage() == parts[0].storage());
  auto ch = chunk(w, 2, 0);
  REQUIRE(ch.size() == 2);
  check_values(ch[1], {6, 7, 8, 9, 10, 11});
}

TEST_CASE("dropout zeroes with probability p and rescales the rest") {
  Generator gen(11);
  Tensor x = ones({10000});
  Tensor y = dropout(x, 0.25, true, &gen);
  std::vector<double> v = values(y);
  int64_t kept = 0;
  for (double d : v) {
    CHECK((d == 0.0 || std::fabs(d - 1 / 0.75) < 1e-6));
    kept += d != 0.0;
  }
  CHECK(kept > 7200);
  CHECK(kept < 7800);
  CHECK(values(dropout(x, 0.25, false)) == values(x));  // eval mode: identity
  Generator g1(5), g2(5);
  CHECK(values(dropout(x, 0.5, true, &g1)) == values(dropout(x, 0.5, true, &g2)));
}

TEST_CASE("in-place ops write through and bump the version") {
  Tensor a = ones({2, 2});
  uint64_t v0 = a.version();
  a.add_(tensor({1.f, 2.f}));
  check_values(a, {2, 3, 2, 3});
  a.mul_(2.0).sub_(ones({2, 2}));
  check_values(a, {3, 5, 3, 5});
  a.div_(tensor({1.f, 5.f})).add_(1.0);
  check_values(a, {4, 2, 4, 2});
  a.add_(ones({2, 2}), -2.0);
  check_values(a, {2, 0, 2, 0});
  a.zero_();
  check_values(a, {0, 0, 0, 0});
  CHECK(a.version() > v0);
  Tensor n = zeros({1000}, kFloat64);
  n.normal_(1.0, 0.0);
  check_values(n.slice(0, 0, 2), {1, 1});
  n.uniform_(2.0, 3.0);
  for (double d : values(n)) CHECK((d >= 2.0 && d < 3.0));
}

TEST_CASE("method forms are the functions of the same name, gradients included") {
  manual_seed(31);
  Tensor x = randn({3, 4}, kFloat64).requires_grad_(), y = randn({3, 4}, kFloat64);
  Tensor idx = tensor({2, 0}), gidx = tensor({0, 3, 1, 1, 2, 0}, {3, 2});
  auto same = [](const Tensor& a, const Tensor& b) {
    return a.sizes() == b.sizes() && a.dtype() == b.dtype() && max_diff(a, b) == 0;
  };
  CHECK(same(x.add(y), add(x, y)));
  CHECK(same(x.add(2.5), add(x, 2.5)));
  CHECK(same(x.sub(y), sub(x, y)));
  CHECK(same(x.sub(2.5), sub(x, 2.5)));
  CHECK(same(x.mul(y), mul(x, y)));
  CHECK(same(x.mul(2.5), mul(x, 2.5)));
  CHECK(same(x.div(y), div(x, y)));
  CHECK(same(x.div(2.5), div(x, 2.5)));
  CHECK(same(x.maximum(y), maximum(x, y)));
  CHECK(same(x.minimum(y), minimum(x, y)));
  CHECK(same(x.eq(y), eq(x, y)));
  CHECK(same(x.ne(0.5), ne(x, 0.5)));
  CHECK(same(x.lt(y), lt(x, y)));
  CHECK(same(x.le(0.0), le(x, 0.0)));
  CHECK(same(x.gt(y), gt(x, y)));
  CHECK(same(x.ge(0.0), ge(x, 0.0)));
  CHECK(same(x.gt(0.0).logical_not(), logical_not(gt(x, 0.0))));
  CHECK(same(x.max(), max(x)));
  CHECK(same(x.min(), min(x)));
  CHECK(same(x.max(1).values, max(x, 1).values));
  CHECK(same(x.min(0, true).indices, min(x, 0, true).indices));
  CHECK(same(x.argmax(1), argmax(x, 1)));
  CHECK(same(x.argmin(0, true), argmin(x, 0, true)));
  CHECK(same(x.var({1}), var(x, {1})));
  CHECK(same(x.index_select(0, idx), index_select(x, 0, idx)));
  CHECK(same(x.gather(1, gidx), gather(x, 1, gidx)));
  CHECK(same(x.tril(), tril(x)));
  CHECK(same(x.triu(1), triu(x, 1)));
  CHECK(same(x.cumsum(1), cumsum(x, 1)));
  CHECK(same(x.sort(1, true).values, sort(x, 1, true).values));
  CHECK(same(x.argsort(0), argsort(x, 0)));
  CHECK(same(x.topk(2).indices, topk(x, 2).indices));
  // Differentiable alike: the graph of a method chain equals the functions'.
  x.mul(y).add(1.0).topk(2).values.sum().backward();
  Tensor g1 = x.grad().clone();
  x.zero_grad();
  sum(topk(add(mul(x, y), 1.0), 2).values).backward();
  CHECK(same(g1, x.grad()));
  CHECK(max_diff(g1, zeros({3, 4}, kFloat64)) > 0);
}
