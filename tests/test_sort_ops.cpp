// Sorting, scans and triangles (autograd/ops_sort.cpp, ops/cpu/sort.cpp): forward values on hand
// cases (contiguous, transposed, strided, batched, expanded; every dtype), NaN ordering and ties,
// the error messages, float64 gradchecks on contiguous and non-contiguous inputs, and
// multinomial: reproducible draws, thread-count independence, frequencies, zero weights,
// sampling without replacement and bad probabilities.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "tests/helpers.h"

using namespace tapestry;
using namespace tapestry::testing;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
using Ints = std::vector<int64_t>;

Ints ints(const Tensor& t) { return t.to_vector<int64_t>(); }

// Exact values, NaN matching NaN.
void check_exact(const Tensor& t, const std::vector<double>& expected) {
  std::vector<double> got = values(t);
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element ", i, " of ", to_string(t));
    if (std::isnan(expected[i])) CHECK(std::isnan(got[i]));
    else CHECK(got[i] == expected[i]);
  }
}

}  // namespace

TEST_CASE("tril and triu keep a triangle of the last two dims") {
  Tensor a = arange(1.0, 13.0, 1.0, kFloat64).reshape({3, 4});  // [[1 2 3 4] [5 6 7 8] [9 10 11 12]]
  check_values(tril(a), {1, 0, 0, 0, 5, 6, 0, 0, 9, 10, 11, 0});
  check_values(tril(a, 1), {1, 2, 0, 0, 5, 6, 7, 0, 9, 10, 11, 12});
  check_values(tril(a, -1), {0, 0, 0, 0, 5, 0, 0, 0, 9, 10, 0, 0});
  check_values(triu(a), {1, 2, 3, 4, 0, 6, 7, 8, 0, 0, 11, 12});
  check_values(triu(a, 2), {0, 0, 3, 4, 0, 0, 0, 8, 0, 0, 0, 0});
  check_values(triu(a, -1), {1, 2, 3, 4, 5, 6, 7, 8, 0, 10, 11, 12});
  // Diagonals far outside the matrix, up to the int64 limits.
  check_values(tril(a, 100), values(a));
  check_values(triu(a, 100), std::vector<double>(12, 0.0));
  check_values(tril(a, std::numeric_limits<int64_t>::max()), values(a));
  check_values(triu(a, std::numeric_limits<int64_t>::min()), values(a));
  check_values(tril(a, std::numeric_limits<int64_t>::min()), std::vector<double>(12, 0.0));
  CHECK(tril(a).is_contiguous());

  // Transposed and strided inputs.
  check_values(tril(a.t()), {1, 0, 0, 2, 6, 0, 3, 7, 11, 4, 8, 12});
  check_values(triu(a.slice(1, 0, 4, 2)), {1, 3, 0, 7, 0, 0});  // [[1 3] [5 7] [9 11]]

  // Batched over leading dims, also with a permuted batch layout, and an expanded input.
  Tensor b = arange(0.0, 8.0, 1.0, kFloat64).reshape({2, 2, 2});  // [[0 1] [2 3]], [[4 5] [6 7]]
  check_values(tril(b), {0, 0, 2, 3, 4, 0, 6, 7});
  check_values(triu(b.permute({2, 0, 1})), {0, 2, 0, 6, 1, 3, 0, 7});  // batches [[0 2] [4 6]], [[1 3] [5 7]]
  check_values(tril(tensor({1.0, 2.0, 3.0}, {}, kFloat64).expand({2, 3, 3})), {1, 0, 0, 1, 2, 0, 1, 2, 3, 1, 0, 0, 1, 2, 0, 1, 2, 3});

  // Every dtype: int64 and bool (a causal mask) keep their dtype.
  Tensor m = tril(tensor({1, 2, 3, 4}, {2, 2}));
  CHECK(m.dtype() == kInt64);
  check_values(m, {1, 0, 3, 4});
  Tensor causal = triu(gt(ones({3, 3}), 0.0), 1);
  CHECK(causal.dtype() == kBool);
  check_values(causal, {0, 1, 1, 0, 0, 1, 0, 0, 0});
  Tensor f = triu(tensor({1.f, 2.f, 3.f, 4.f}, {2, 2}));
  CHECK(f.dtype() == kFloat32);
  check_values(f, {1, 2, 0, 4});

  // Empty matrices and batches.
  CHECK(tril(zeros({0, 3})).sizes() == Shape{0, 3});
  CHECK(triu(zeros({2, 0, 4})).sizes() == Shape{2, 0, 4});
  CHECK(tril(zeros({3, 0})).sizes() == Shape{3, 0});
}

TEST_CASE("tril and triu need at least 2 dims") {
  CHECK(contains(error_of([] { tril(tensor({1.0, 2.0}, {}, kFloat64)); }), "tril: expected a tensor of at least 2 dims"));
  CHECK(contains(error_of([] { triu(scalar_tensor(1.0)); }), "triu: expected a tensor of at least 2 dims"));
  CHECK(contains(error_of([] { triu(tensor({1.0, 2.0}, {}, kFloat64), 1); }), "got shape [2]"));
}

TEST_CASE("cumsum adds along one dim") {
  Tensor a = tensor({1.0, 2.0, 3.0, 4.0, 5.0, 6.0}, {2, 3}, kFloat64);
  check_values(cumsum(a, 0), {1, 2, 3, 5, 7, 9});
  check_values(cumsum(a, 1), {1, 3, 6, 4, 9, 15});
  check_values(cumsum(a, -1), {1, 3, 6, 4, 9, 15});
  check_values(cumsum(a.t(), 1), {1, 5, 2, 7, 3, 9});                // [[1 4] [2 5] [3 6]]
  check_values(cumsum(a.slice(1, 0, 3, 2), 1), {1, 4, 4, 10});       // [[1 3] [4 6]]
  check_values(cumsum(tensor({1.0, 2.0}, {}, kFloat64).expand({2, 2}), 0), {1, 2, 2, 4});
  Tensor c = arange(0.0, 12.0, 1.0, kFloat64).reshape({2, 3, 2});
  check_values(cumsum(c, 1), {0, 1, 2, 4, 6, 9, 6, 7, 14, 16, 24, 27});

  // 0-d (dim 0 or -1) and empty inputs.
  Tensor s = cumsum(scalar_tensor(2.5, kFloat64), 0);
  CHECK(s.dim() == 0);
  check_values(s, {2.5});
  check_values(cumsum(scalar_tensor(2.5, kFloat64), -1), {2.5});
  CHECK(cumsum(zeros({0, 3}), 0).sizes() == Shape{0, 3});
  CHECK(cumsum(zeros({3, 0}), 0).sizes() == Shape{3, 0});

  // int64 and bool give int64.
  Tensor i = cumsum(tensor({3, -1, 4}), 0);
  CHECK(i.dtype() == kInt64);
  check_values(i, {3, 2, 6});
  Tensor b = cumsum(gt(tensor({1.0, 0.0, 2.0}, {}, kFloat64), 0.5), 0);
  CHECK(b.dtype() == kInt64);
  check_values(b, {1, 1, 2});

  // float32 stays float32 but accumulates in double, as PyTorch's CPU kernel: 1e8 + 1 - 1e8 = 1.
  Tensor f = cumsum(tensor({1e8f, 1.f, -1e8f}), 0);
  CHECK(f.dtype() == kFloat32);
  check_values(f, {1e8, 1e8, 1});

  // NaN and inf propagate from where they appear.
  check_exact(cumsum(tensor({1.0, kNaN, 2.0}, {}, kFloat64), 0), {1, kNaN, kNaN});
  check_exact(cumsum(tensor({1.0, kInf, -kInf}, {}, kFloat64), 0), {1, kInf, kNaN});

  CHECK(contains(error_of([&] { cumsum(a, 2); }), "cumsum: dim 2 out of range"));
  CHECK(contains(error_of([] { cumsum(scalar_tensor(1.0), 1); }), "cumsum: dim 1 out of range"));
}

TEST_CASE("sort: values with their indices, stable, NaN above inf") {
  Tensor x = tensor({3.0, 1.0, 2.0, 1.0}, {}, kFloat64);
  ValuesIndices r = sort(x);
  check_values(r.values, {1, 1, 2, 3});
  CHECK(ints(r.indices) == Ints{1, 3, 2, 0});
  CHECK(r.indices.dtype() == kInt64);
  ValuesIndices d = sort(x, -1, true);
  check_values(d.values, {3, 2, 1, 1});
  CHECK(ints(d.indices) == Ints{0, 2, 1, 3});  // equal values keep their input order
  CHECK(ints(argsort(x)) == Ints{1, 3, 2, 0});
  CHECK(ints(argsort(x, 0, true)) == Ints{0, 2, 1, 3});
  CHECK(ints(sort(tensor({2.0, 1.0, 2.0, 1.0}, {}, kFloat64), -1, false, /*stable=*/false).indices) == Ints{1, 3, 0, 2});

  // NaN ranks above +inf: last ascending, first descending; NaNs (and signed zeros) tie.
  Tensor y = tensor({1.0, kNaN, kInf, -kInf, 0.0, kNaN}, {}, kFloat64);
  ValuesIndices ya = sort(y);
  check_exact(ya.values, {-kInf, 0, 1, kInf, kNaN, kNaN});
  CHECK(ints(ya.indices) == Ints{3, 4, 0, 2, 1, 5});
  ValuesIndices yd = sort(y, 0, true);
  check_exact(yd.values, {kNaN, kNaN, kInf, 1, 0, -kInf});
  CHECK(ints(yd.indices) == Ints{1, 5, 2, 0, 4, 3});
  CHECK(ints(sort(tensor({0.0, -0.0, 0.0}, {}, kFloat64)).indices) == Ints{0, 1, 2});
  CHECK(ints(sort(tensor({0.0, -0.0, 0.0}, {}, kFloat64), 0, true).indices) == Ints{0, 1, 2});

  // Along dim 0, on transposed and strided inputs, and the middle dim of a 3-D tensor.
  Tensor m = tensor({3.0, 1.0, 2.0, 5.0, 4.0, 0.0}, {2, 3}, kFloat64);  // [[3 1 2] [5 4 0]]
  ValuesIndices m0 = sort(m, 0);
  check_values(m0.values, {3, 1, 0, 5, 4, 2});
  CHECK(ints(m0.indices) == Ints{0, 0, 1, 1, 1, 0});
  ValuesIndices mt = sort(m.t(), 1);  // [[3 5] [1 4] [2 0]]
  check_values(mt.values, {3, 5, 1, 4, 0, 2});
  CHECK(ints(mt.indices) == Ints{0, 1, 0, 1, 1, 0});
  ValuesIndices ms = sort(m.slice(1, 0, 3, 2), 1, true);  // [[3 2] [5 0]]
  check_values(ms.values, {3, 2, 5, 0});
  CHECK(ints(ms.indices) == Ints{0, 1, 0, 1});
  Tensor c = tensor({2.0, 9.0, 1.0, 8.0, 3.0, 7.0, 6.0, 0.0, 5.0, 1.0, 4.0, 2.0}, {2, 3, 2}, kFloat64);
  ValuesIndices c1 = sort(c, 1);  // batch 0 columns [2 1 3], [9 8 7]; batch 1 [6 5 4], [0 1 2]
  check_values(c1.values, {1, 7, 2, 8, 3, 9, 4, 0, 5, 1, 6, 2});
  CHECK(ints(c1.indices) == Ints{1, 2, 0, 1, 2, 0, 2, 0, 1, 1, 0, 2});
  // An expanded input: every element of a row ties.
  CHECK(ints(sort(tensor({4.0, 5.0}, {2, 1}, kFloat64).expand({2, 3}), 1, true).indices) == Ints{0, 1, 2, 0, 1, 2});

  // 0-d: itself, index 0.
  ValuesIndices s0 = sort(scalar_tensor(7.0, kFloat64));
  CHECK(s0.values.dim() == 0);
  CHECK(s0.indices.dim() == 0);
  check_values(s0.values, {7});
  CHECK(s0.indices.item<int64_t>() == 0);
  CHECK(argsort(scalar_tensor(7.0, kFloat64), 0).item<int64_t>() == 0);

  // int64, bool and float32.
  ValuesIndices si = sort(tensor({3, -1, 3, 0}), 0, true);
  CHECK(si.values.dtype() == kInt64);
  CHECK(ints(si.values) == Ints{3, 3, 0, -1});
  CHECK(ints(si.indices) == Ints{0, 2, 3, 1});
  ValuesIndices sb = sort(gt(tensor({1.0, 0.0, 1.0, 0.0}, {}, kFloat64), 0.5));
  CHECK(sb.values.dtype() == kBool);
  CHECK(ints(sb.values) == Ints{0, 0, 1, 1});
  CHECK(ints(sb.indices) == Ints{1, 3, 0, 2});
  ValuesIndices sf = sort(tensor({0.5f, -1.5f, 2.5f}));
  CHECK(sf.values.dtype() == kFloat32);
  check_values(sf.values, {-1.5, 0.5, 2.5});

  // Empty.
  ValuesIndices se = sort(zeros({0, 3}), 0);
  CHECK(se.values.sizes() == Shape{0, 3});
  CHECK(se.indices.sizes() == Shape{0, 3});
  CHECK(se.indices.dtype() == kInt64);
  CHECK(sort(zeros({3, 0})).values.sizes() == Shape{3, 0});

  CHECK(contains(error_of([&] { sort(x, 1); }), "sort: dim 1 out of range"));
  CHECK(contains(error_of([&] { argsort(m, -3); }), "argsort: dim -3 out of range"));
}

TEST_CASE("topk: the k largest or smallest, lowest index first among equals") {
  Tensor x = tensor({1.0, 5.0, 3.0, 5.0, kNaN, -2.0}, {}, kFloat64);
  ValuesIndices t = topk(x, 3);  // NaN counts as the largest
  check_exact(t.values, {kNaN, 5, 5});
  CHECK(ints(t.indices) == Ints{4, 1, 3});
  ValuesIndices s = topk(x, 2, -1, false);
  check_values(s.values, {-2, 1});
  CHECK(ints(s.indices) == Ints{5, 0});
  CHECK(ints(topk(tensor({2.0, 2.0, 2.0, 2.0}, {}, kFloat64), 2).indices) == Ints{0, 1});
  CHECK(ints(topk(tensor({2.0, 2.0, 2.0, 2.0}, {}, kFloat64), 3, -1, false).indices) == Ints{0, 1, 2});
  CHECK(ints(topk(tensor({3.0, 1.0, 3.0, 3.0}, {}, kFloat64), 2).indices) == Ints{0, 2});

  // sorted = false: the selected elements in input order.
  ValuesIndices u = topk(tensor({1.0, 5.0, 3.0, 9.0, 7.0}, {}, kFloat64), 3, -1, true, false);
  check_values(u.values, {5, 9, 7});
  CHECK(ints(u.indices) == Ints{1, 3, 4});
  ValuesIndices us = topk(tensor({1.0, 5.0, 3.0, 9.0, 7.0}, {}, kFloat64), 2, -1, false, false);
  check_values(us.values, {1, 3});
  CHECK(ints(us.indices) == Ints{0, 2});

  // k = 0 and k = size of the dim.
  CHECK(topk(x, 0).values.sizes() == Shape{0});
  CHECK(topk(x, 0).indices.sizes() == Shape{0});
  ValuesIndices all = topk(tensor({2.0, 1.0, 3.0}, {}, kFloat64), 3);
  check_values(all.values, {3, 2, 1});
  CHECK(ints(all.indices) == Ints{2, 0, 1});

  // Along dim 0 of a transposed matrix; a strided 3-D input; an expanded input.
  Tensor m = tensor({3.0, 1.0, 2.0, 5.0, 4.0, 0.0}, {2, 3}, kFloat64);  // m.t() = [[3 5] [1 4] [2 0]]
  ValuesIndices tm = topk(m.t(), 2, 0);
  check_values(tm.values, {3, 5, 2, 4});
  CHECK(ints(tm.indices) == Ints{0, 0, 2, 1});
  Tensor c = arange(0.0, 24.0, 1.0, kFloat64).reshape({2, 3, 4}).slice(2, 0, 4, 2);  // [2, 3, 2]
  ValuesIndices tc = topk(c, 1, 1, false);  // the first row of each batch
  check_values(tc.values, {0, 2, 12, 14});
  CHECK(ints(tc.indices) == Ints{0, 0, 0, 0});
  ValuesIndices te = topk(tensor({1.0, 3.0, 2.0}, {}, kFloat64).expand({2, 3}), 2);
  check_values(te.values, {3, 2, 3, 2});
  CHECK(ints(te.indices) == Ints{1, 2, 1, 2});

  // int64 and float32 keep their dtype.
  ValuesIndices ti = topk(tensor({4, -1, 7}), 2);
  CHECK(ti.values.dtype() == kInt64);
  CHECK(ints(ti.values) == Ints{7, 4});
  CHECK(ints(ti.indices) == Ints{2, 0});
  CHECK(topk(tensor({1.f, 2.f}), 1).values.dtype() == kFloat32);

  // 0-d: itself, for k = 0 as well (as PyTorch).
  for (int64_t k : {0, 1}) {
    ValuesIndices t0 = topk(scalar_tensor(3.0, kFloat64), k);
    CHECK(t0.values.dim() == 0);
    check_values(t0.values, {3});
    CHECK(t0.indices.item<int64_t>() == 0);
  }
  // Empty rows: only k = 0.
  CHECK(topk(zeros({3, 0}), 0).values.sizes() == Shape{3, 0});
  CHECK(topk(zeros({0, 4}), 2).values.sizes() == Shape{0, 2});

  CHECK(contains(error_of([&] { topk(x, 7); }), "topk: selected index k out of range"));
  CHECK(contains(error_of([&] { topk(x, -1); }), "topk: selected index k out of range"));
  CHECK(contains(error_of([] { topk(scalar_tensor(1.0), 2); }), "topk: selected index k out of range"));
  CHECK(contains(error_of([] { topk(zeros({3, 0}), 1); }), "topk: selected index k out of range"));
  CHECK(contains(error_of([&] { topk(gt(x, 0.0), 1); }), "topk: not supported for bool tensors"));
  CHECK(contains(error_of([&] { topk(x, 1, 1); }), "topk: dim 1 out of range"));
}

TEST_CASE("topk of a few from long rows (the insertion path) equals a stable sort, ties and NaN rows included") {
  Generator g(14);
  for (int64_t n : {1, 17, 300, 8000})
    for (int64_t k : {1, 2, 8, 16, 17}) {
      if (k > n) continue;
      Tensor x = randint(-20, 21, {6, n}, kFloat64, &g);  // ties everywhere
      std::vector<double> v = x.to_vector<double>();
      v[static_cast<size_t>(n / 2)] = NAN;  // row 0 holds a NaN: the general path
      v[static_cast<size_t>(n + n - 1)] = kInf, v[static_cast<size_t>(2 * n)] = -kInf;
      for (DType dt : {kFloat64, kFloat32, kInt64}) {
        std::vector<double> finite = v;  // int64: NaN and +-inf become 0 and +-1e9
        for (double& e : finite) e = std::isnan(e) ? 0.0 : std::isinf(e) ? std::copysign(1e9, e) : e;
        Tensor t = tensor(dt == kInt64 ? finite : v, {6, n}).to(dt);
        const std::vector<double> tv = t.to(kFloat64).to_vector<double>();
        for (bool largest : {true, false}) {
          ValuesIndices got = topk(t, k, -1, largest);
          const std::vector<int64_t> at = ints(got.indices);
          const std::vector<double> vals = got.values.to(kFloat64).to_vector<double>();
          for (int64_t r = 0; r < 6; ++r) {
            std::vector<int64_t> order(static_cast<size_t>(n));
            for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
            const double* row = tv.data() + r * n;
            auto rank = [&](double u) { return std::isnan(u) ? (largest ? kInf : -kInf) : u; };  // NaN is the largest
            std::stable_sort(order.begin(), order.end(), [&](int64_t p, int64_t q) {
              const bool pn = std::isnan(row[p]), qn = std::isnan(row[q]);
              if (pn != qn) return largest ? pn : qn;
              return largest ? rank(row[p]) > rank(row[q]) : rank(row[p]) < rank(row[q]);
            });
            for (int64_t i = 0; i < k; ++i) {
              CHECK_MESSAGE(at[static_cast<size_t>(r * k + i)] == order[static_cast<size_t>(i)], "n ", n, " k ", k, " row ", r);
              const double want = row[order[static_cast<size_t>(i)]], have = vals[static_cast<size_t>(r * k + i)];
              CHECK((std::isnan(want) ? std::isnan(have) : have == want));
            }
          }
        }
      }
    }
}

TEST_CASE("sort, topk and cumsum do not depend on the thread count") {
  Generator gen(11);
  Tensor big = randn({256, 300}, kFloat64, &gen);
  // Many ties: the values 0, 1 and 2.
  Tensor rounded = add(gt(big, 0.5).to(kFloat64), gt(big, -0.5).to(kFloat64));
  auto run = [&] {
    return std::vector<Ints>{ints(sort(big, 1).indices),
                             ints(sort(big, 0, true).indices),
                             ints(sort(rounded, 1).indices),
                             ints(topk(big, 7, 1).indices),
                             ints(topk(rounded, 50, 0, false).indices),
                             ints(topk(big, 9, 1, true, false).indices)};
  };
  auto sums = [&] { return std::vector<std::vector<double>>{values(cumsum(big, 0)), values(cumsum(big, 1))}; };
  int before = get_num_threads();
  set_num_threads(1);
  auto one = run();
  auto one_sums = sums();
  set_num_threads(2);
  auto two = run();
  auto two_sums = sums();
  set_num_threads(before);
  CHECK(one == two);
  CHECK(one_sums == two_sums);

  // Every row of the big sort is ordered, and stable on the rounded values.
  Tensor v = sort(rounded, 1).values, idx = sort(rounded, 1).indices;
  std::vector<double> vv = values(v);
  Ints ii = ints(idx);
  bool ordered = true;
  for (int64_t r = 0; r < 256; ++r)
    for (int64_t j = 1; j < 300; ++j) {
      const size_t k = static_cast<size_t>(r * 300 + j);
      ordered = ordered && (vv[k - 1] < vv[k] || (vv[k - 1] == vv[k] && ii[k - 1] < ii[k]));
    }
  CHECK(ordered);
}

TEST_CASE("backward of sort, topk, cumsum and tril by hand") {
  Tensor x = tensor({3.0, 1.0, 2.0}, {}, kFloat64).requires_grad_();
  sum(mul(sort(x).values, tensor({1.0, 10.0, 100.0}, {}, kFloat64))).backward();  // sorted: x[1], x[2], x[0]
  check_values(x.grad(), {100, 1, 10});

  Tensor y = tensor({3.0, 1.0, 2.0}, {}, kFloat64).requires_grad_();
  sum(mul(topk(y, 2, -1, false).values, tensor({1.0, 10.0}, {}, kFloat64))).backward();  // y[1], y[2]
  check_values(y.grad(), {0, 1, 10});

  Tensor z = tensor({1.0, 3.0, 2.0}, {}, kFloat64).requires_grad_();
  sum(topk(z.expand({2, 3}), 1).values).backward();  // both rows pick z[1]
  check_values(z.grad(), {0, 2, 0});

  Tensor w = tensor({1.0, 2.0, 3.0}, {}, kFloat64).requires_grad_();
  sum(mul(cumsum(w, 0), tensor({1.0, 10.0, 100.0}, {}, kFloat64))).backward();
  check_values(w.grad(), {111, 110, 100});

  Tensor m = ones({2, 3}, kFloat64).requires_grad_();
  sum(mul(tril(m), arange(1.0, 7.0, 1.0, kFloat64).reshape({2, 3}))).backward();
  check_values(m.grad(), {1, 0, 0, 4, 5, 0});

  CHECK(sort(x).values.grad_fn_name() == "SortBackward");
  CHECK(topk(x, 1).values.grad_fn_name() == "TopkBackward");
  CHECK(cumsum(x, 0).grad_fn_name() == "CumsumBackward");
  CHECK(triu(m).grad_fn_name() == "TriuBackward");
  CHECK(!sort(x).indices.requires_grad());
  CHECK(!argsort(x).requires_grad());
}

// Each op's own gradcheck is an OpInfo row (tests/opinfo.cpp); here a composite of two of them.
TEST_CASE("gradcheck: cumsum of a descending sort, contiguous and non-contiguous") {
  Generator gen(2024);
  Tensor v = randn({3, 4}, kFloat64, &gen);
  auto f = [](const TensorList& x) { return cumsum(sort(x[0], -1, true).values, -1); };
  for (const Tensor& input : {v, transposed(v)}) {
    INFO("strides ", input.strides());
    try {
      CHECK(gradcheck(f, {input.detach().requires_grad_()}));
    } catch (const Error& e) {
      FAIL_CHECK(e.what());
    }
  }
}

TEST_CASE("multinomial: the same seed gives the same draws, whatever the thread count") {
  Tensor p = tensor({0.1, 0.0, 0.5, 0.4, 0.0, 1.0}, {2, 3}, kFloat64);
  Generator g1(7), g2(7), g3(8);
  Tensor a = multinomial(p, 50, true, &g1);
  CHECK(a.sizes() == Shape{2, 50});
  CHECK(a.dtype() == kInt64);
  CHECK(ints(a) == ints(multinomial(p, 50, true, &g2)));
  CHECK(ints(a) != ints(multinomial(p, 50, true, &g3)));
  CHECK(ints(multinomial(p, 50, true, &g1)) != ints(a));  // the generator moved on

  manual_seed(5);
  Ints c = ints(multinomial(p, 10, true));
  manual_seed(5);
  CHECK(ints(multinomial(p, 10, true)) == c);

  Generator gen(3);
  Tensor big = add(rand({64, 1000}, kFloat64, &gen), 0.01);
  int before = get_num_threads();
  set_num_threads(1);
  Generator h1(3);
  Ints one = ints(multinomial(big, 20, false, &h1));
  Ints one_r = ints(multinomial(big, 20, true, &h1));
  set_num_threads(2);
  Generator h2(3);
  Ints two = ints(multinomial(big, 20, false, &h2));
  Ints two_r = ints(multinomial(big, 20, true, &h2));
  set_num_threads(before);
  CHECK(one == two);
  CHECK(one_r == two_r);
}

TEST_CASE("multinomial: frequencies follow the weights - zero weights are never drawn") {
  Generator g(123);
  const int64_t n = 20000;
  auto frequencies = [&](const Tensor& drawn, size_t categories) {
    std::vector<double> freq(categories, 0.0);
    for (int64_t v : ints(drawn)) {
      REQUIRE(v >= 0);
      REQUIRE(v < static_cast<int64_t>(categories));
      freq[static_cast<size_t>(v)] += 1.0 / static_cast<double>(drawn.numel());
    }
    return freq;
  };
  // Unnormalized float64 weights, sum 10.
  std::vector<double> f = frequencies(multinomial(tensor({1.0, 0.0, 3.0, 6.0}, {}, kFloat64), n, true, &g), 4);
  CHECK(f[1] == 0.0);
  CHECK(std::abs(f[0] - 0.1) < 0.015);
  CHECK(std::abs(f[2] - 0.3) < 0.015);
  CHECK(std::abs(f[3] - 0.6) < 0.015);
  // float32 weights; a 2-D batch of one row.
  std::vector<double> f32 = frequencies(multinomial(tensor({0.2f, 0.8f}, {1, 2}), n, true, &g), 2);
  CHECK(std::abs(f32[1] - 0.8) < 0.015);
  // Without replacement, the first draw follows the weights too (an expanded batch of rows).
  Tensor rows = tensor({1.0, 0.0, 3.0, 6.0}, {}, kFloat64).expand({n, 4});
  Tensor firsts = multinomial(rows, 1, false, &g);
  CHECK(firsts.sizes() == Shape{n, 1});
  std::vector<double> ff = frequencies(firsts, 4);
  CHECK(ff[1] == 0.0);
  CHECK(std::abs(ff[0] - 0.1) < 0.015);
  CHECK(std::abs(ff[3] - 0.6) < 0.015);
  // Two draws from {1, 3} without replacement: the first is category 1 with probability 0.75,
  // and the second is always the other one.
  Ints pairs = ints(multinomial(tensor({1.0, 3.0}, {}, kFloat64).expand({n, 2}), 2, false, &g));
  double first_is_1 = 0;
  bool distinct = true;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t p0 = pairs[static_cast<size_t>(2 * r)], p1 = pairs[static_cast<size_t>(2 * r + 1)];
    distinct = distinct && p0 != p1;
    first_is_1 += p0 == 1 ? 1.0 / static_cast<double>(n) : 0.0;
  }
  CHECK(distinct);
  CHECK(std::abs(first_is_1 - 0.75) < 0.015);
  // Each row draws from its own weights.
  Ints per_row = ints(multinomial(tensor({1.0, 0.0, 0.0, 0.0, 0.0, 2.0}, {2, 3}, kFloat64), 100, true, &g));
  for (size_t i = 0; i < per_row.size(); ++i) CHECK(per_row[i] == (i < 100 ? 0 : 2));
  // Weights whose sum overflows are still drawn from.
  std::vector<double> huge = frequencies(multinomial(tensor({1e308, 1e308, 0.0}, {}, kFloat64), n, true, &g), 3);
  CHECK(huge[2] == 0.0);
  CHECK(std::abs(huge[0] - 0.5) < 0.015);
}

TEST_CASE("multinomial without replacement: distinct categories with nonzero weight") {
  Generator g(9);
  Tensor w = tensor({0.5, 0.0, 2.0, 1.0, 0.0, 0.25, 3.0}, {}, kFloat64);  // 5 nonzero weights
  bool ok = true;
  for (int trial = 0; trial < 200; ++trial) {
    Ints d = ints(multinomial(w, 5, false, &g));
    std::set<int64_t> seen(d.begin(), d.end());
    ok = ok && seen.size() == 5 && seen.count(1) == 0 && seen.count(4) == 0;
  }
  CHECK(ok);
  // A whole permutation of 1000 categories, and of each row of a batch.
  Tensor u = add(rand({1000}, kFloat64, &g), 0.001);
  Ints perm = ints(multinomial(u, 1000, false, &g));
  CHECK(std::set<int64_t>(perm.begin(), perm.end()).size() == 1000);
  Ints batch = ints(multinomial(add(rand({4, 50}, kFloat32, &g), 0.01f), 50, false, &g));
  for (size_t r = 0; r < 4; ++r)
    CHECK(std::set<int64_t>(batch.begin() + 50 * r, batch.begin() + 50 * (r + 1)).size() == 50);
  // A tiny weight beside large ones is still drawn when it must be.
  Ints tiny = ints(multinomial(tensor({1e-300, 1e300, 0.0}, {}, kFloat64), 2, false, &g));
  CHECK(std::set<int64_t>(tiny.begin(), tiny.end()) == std::set<int64_t>{0, 1});
  // An empty batch draws nothing.
  CHECK(multinomial(zeros({0, 3}, kFloat64), 2, false, &g).sizes() == Shape{0, 2});
  CHECK(multinomial(tensor({1.0, 1.0}, {}, kFloat64), 5, true, &g).sizes() == Shape{5});
}

TEST_CASE("multinomial refuses bad probabilities") {
  Generator g(1);
  auto msg = [&g](const Tensor& p, int64_t n, bool replacement) {
    return error_of([&] { multinomial(p, n, replacement, &g); });
  };
  CHECK(contains(msg(tensor({0.5, -0.1}, {}, kFloat64), 1, true), "multinomial: probabilities must be finite and non-negative"));
  CHECK(contains(msg(tensor({0.5, kInf}, {}, kFloat64), 1, true), "must be finite and non-negative, got inf"));
  CHECK(contains(msg(tensor({kNaN, 0.5}, {}, kFloat64), 1, false), "must be finite and non-negative, got nan"));
  CHECK(contains(msg(tensor({0.0, 0.0}, {}, kFloat64), 1, true), "multinomial: row 0 of probabilities [2] has no positive weight"));
  CHECK(contains(msg(tensor({1.0, 1.0, 0.0, 0.0}, {2, 2}, kFloat64), 1, true), "row 1 of probabilities [2, 2]"));
  CHECK(contains(msg(tensor({0.5, 0.0, 0.5}, {}, kFloat64), 3, false), "which has only 2 categories with nonzero probability"));
  CHECK(contains(msg(tensor({0.5, 0.5}, {}, kFloat64), 3, false), "cannot draw 3 samples without replacement from 2 categories"));
  CHECK(contains(msg(tensor({0.5, 0.5}, {}, kFloat64), 0, true), "multinomial: num_samples must be positive, got 0"));
  CHECK(contains(msg(tensor({0.5, 0.5}, {}, kFloat64), -2, false), "num_samples must be positive"));
  CHECK(contains(msg(scalar_tensor(1.0, kFloat64), 1, true), "must be 1-D [V] or 2-D [B, V], got shape []"));
  CHECK(contains(msg(ones({2, 2, 2}, kFloat64), 1, true), "must be 1-D [V] or 2-D [B, V]"));
  CHECK(contains(msg(tensor({1, 2}), 1, true), "multinomial: probabilities must be float32 or float64, got int64"));
  CHECK(contains(msg(zeros({2, 0}, kFloat64), 1, true), "has no positive weight"));
  // A bad row refuses the whole call before any draw: the generator has not moved.
  Generator fresh(1), used(1);
  error_of([&] { multinomial(tensor({1.0, 1.0, -1.0, 1.0}, {2, 2}, kFloat64), 1, true, &used); });
  CHECK(fresh.engine()() == used.engine()());
}
