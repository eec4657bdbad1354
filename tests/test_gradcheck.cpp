// Table-driven gradient checks: every differentiable op, each run on contiguous inputs and
// again on non-contiguous ones (each input laid out transposed or strided in memory), with
// broadcast shapes as rows of their own. Central differences in float64 against one backward
// pass with a random upstream gradient (see autograd/gradcheck.h).
//
// To add an op: add a row {name, input shapes, f, positive-input flags}.
#include "tapestry/ops/detail/kernels.h"
#include "tests/helpers.h"

using namespace tapestry;
using namespace tapestry::testing;

namespace {

struct Row {
  std::string name;
  std::vector<Shape> shapes;
  std::function<Tensor(const TensorList&)> f;
  std::vector<bool> positive = {};  // per input: draw from [0.5, 2.5) (for log, sqrt, division...)
};

// A float64 leaf of `shape`, laid out transposed (or strided, for 1-D) when noncontig is set.
Tensor make_input(const Shape& shape, bool noncontig, bool positive, Generator& gen) {
  Tensor values = positive ? add(mul(rand(shape, kFloat64, &gen), 2.0), 0.5) : randn(shape, kFloat64, &gen);
  Tensor x;
  if (noncontig && shape.size() >= 2) {
    Shape rev(shape.rbegin(), shape.rend());
    std::vector<int64_t> perm;
    for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) perm.push_back(d);
    x = empty(rev, kFloat64).permute(perm);
  } else if (noncontig && shape.size() == 1) {
    x = empty({shape[0], 2}, kFloat64).select(1, 0);
  } else {
    x = empty(shape, kFloat64);
  }
  x.copy_(values);
  return x.detach().requires_grad_();
}

void run_rows(const std::vector<Row>& rows) {
  Generator gen(1234);
  for (const Row& row : rows) {
    for (bool noncontig : {false, true}) {
      TensorList inputs;
      for (size_t i = 0; i < row.shapes.size(); ++i)
        inputs.push_back(make_input(row.shapes[i], noncontig, i < row.positive.size() && row.positive[i], gen));
      INFO("op: ", row.name, noncontig ? " (non-contiguous inputs)" : " (contiguous inputs)");
      try {
        CHECK(gradcheck(row.f, inputs));
      } catch (const Error& e) {
        FAIL_CHECK(e.what());
      }
    }
  }
}

const Tensor& A(const TensorList& x) { return x[0]; }
const Tensor& B(const TensorList& x) { return x[1]; }

}  // namespace

TEST_CASE("gradcheck: elementwise unary ops") {
  run_rows({
      {"neg", {{3, 4}}, [](auto& x) { return neg(A(x)); }},
      {"exp", {{3, 4}}, [](auto& x) { return exp(A(x)); }},
      {"log", {{3, 4}}, [](auto& x) { return log(A(x)); }, {true}},
      {"sqrt", {{3, 4}}, [](auto& x) { return sqrt(A(x)); }, {true}},
      {"rsqrt", {{3, 4}}, [](auto& x) { return rsqrt(A(x)); }, {true}},
      {"pow 3", {{3, 4}}, [](auto& x) { return pow(A(x), 3.0); }},
      {"pow 0.5", {{3, 4}}, [](auto& x) { return pow(A(x), 0.5); }, {true}},
      {"pow -1.5", {{3, 4}}, [](auto& x) { return pow(A(x), -1.5); }, {true}},
      {"pow 0", {{3}}, [](auto& x) { return pow(A(x), 0.0); }},
      {"tanh", {{3, 4}}, [](auto& x) { return tanh(A(x)); }},
      {"relu", {{3, 4}}, [](auto& x) { return relu(A(x)); }},
      {"gelu", {{3, 4}}, [](auto& x) { return gelu(A(x)); }},
      {"sigmoid", {{3, 4}}, [](auto& x) { return sigmoid(A(x)); }},
      {"abs", {{3, 4}}, [](auto& x) { return abs(A(x)); }},
      {"clamp", {{3, 4}}, [](auto& x) { return clamp(A(x), -0.5, 0.5); }},
      {"to float64 (identity)", {{3}}, [](auto& x) { return A(x).to(kFloat64); }},
  });
}

TEST_CASE("gradcheck: elementwise binary ops, same shape and broadcast") {
  std::vector<Row> rows;
  std::vector<std::pair<Shape, Shape>> shapes = {
      {{3, 4}, {3, 4}}, {{3, 4}, {4}}, {{3, 1}, {1, 4}}, {{2, 3, 4}, {}}, {{4}, {2, 3, 4}}};
  for (auto& [sa, sb] : shapes) {
    std::string tag = fmt::format(" {} {}", sa, sb);
    rows.push_back({"add" + tag, {sa, sb}, [](auto& x) { return A(x) + B(x); }});
    rows.push_back({"sub" + tag, {sa, sb}, [](auto& x) { return A(x) - B(x); }});
    rows.push_back({"mul" + tag, {sa, sb}, [](auto& x) { return A(x) * B(x); }});
    rows.push_back({"div" + tag, {sa, sb}, [](auto& x) { return A(x) / B(x); }, {false, true}});
    rows.push_back({"maximum" + tag, {sa, sb}, [](auto& x) { return maximum(A(x), B(x)); }});
    rows.push_back({"minimum" + tag, {sa, sb}, [](auto& x) { return minimum(A(x), B(x)); }});
  }
  rows.push_back({"mul self", {{3, 4}}, [](auto& x) { return A(x) * A(x); }});
  rows.push_back({"scalar add", {{3, 4}}, [](auto& x) { return A(x) + 2.0; }});
  rows.push_back({"scalar rsub", {{3, 4}}, [](auto& x) { return 2.0 - A(x); }});
  rows.push_back({"scalar mul", {{3, 4}}, [](auto& x) { return A(x) * -3.0; }});
  rows.push_back({"scalar div", {{3, 4}}, [](auto& x) { return A(x) / 4.0; }});
  rows.push_back({"scalar rdiv", {{3, 4}}, [](auto& x) { return 2.0 / A(x); }, {true}});
  run_rows(rows);
}

TEST_CASE("gradcheck: where and masked_fill") {
  Tensor mask = tensor({1.0, 0.0, 0.0, 1.0}).to(kFloat64);
  Tensor m = gt(mask, 0.5);  // [T, F, F, T]
  Tensor causal = gt(arange(4).unsqueeze(0), arange(4).unsqueeze(1));
  run_rows({
      {"where", {{3, 4}, {3, 4}}, [m](auto& x) { return where(m, A(x), B(x)); }},
      {"where broadcast", {{4}, {3, 1}}, [m](auto& x) { return where(m, A(x), B(x)); }},
      {"where scalar", {{3, 4}}, [m](auto& x) { return where(m, A(x), 0.5); }},
      {"masked_fill", {{2, 4, 4}}, [causal](auto& x) { return masked_fill(A(x), causal, -3.0); }},
  });
}

TEST_CASE("gradcheck: reductions and normalizations") {
  run_rows({
      {"sum all", {{3, 4}}, [](auto& x) { return sum(A(x)); }},
      {"sum dim keepdim", {{3, 4}}, [](auto& x) { return sum(A(x), {1}, true); }},
      {"sum two dims", {{2, 3, 4}}, [](auto& x) { return sum(A(x), {0, 2}); }},
      {"mean", {{2, 3, 4}}, [](auto& x) { return mean(A(x), {-1}); }},
      {"mean all", {{3, 4}}, [](auto& x) { return mean(A(x)); }},
      {"var", {{3, 5}}, [](auto& x) { return var(A(x), {1}); }},
      {"var all population", {{3, 5}}, [](auto& x) { return var(A(x), {}, 0); }},
      {"max all", {{3, 4}}, [](auto& x) { return max(A(x)); }},
      {"min all", {{3, 4}}, [](auto& x) { return min(A(x)); }},
      {"max dim", {{3, 4}}, [](auto& x) { return max(A(x), 1).values; }},
      {"min dim keepdim", {{3, 4}}, [](auto& x) { return min(A(x), 0, true).values; }},
      {"softmax last", {{3, 5}}, [](auto& x) { return softmax(A(x), -1); }},
      {"softmax middle", {{2, 3, 4}}, [](auto& x) { return softmax(A(x), 1); }},
      {"log_softmax", {{3, 5}}, [](auto& x) { return log_softmax(A(x), 1); }},
      {"log_softmax first", {{3, 5}}, [](auto& x) { return log_softmax(A(x), 0); }},
      {"layer_norm affine", {{2, 3, 5}, {5}, {5}}, [](auto& x) { return layer_norm(x[0], {5}, x[1], x[2]); }},
      {"layer_norm plain", {{4, 6}}, [](auto& x) { return layer_norm(A(x), {6}); }},
      {"layer_norm two dims", {{2, 3, 4}, {3, 4}, {3, 4}}, [](auto& x) { return layer_norm(x[0], {3, 4}, x[1], x[2]); }},
  });
}

TEST_CASE("gradcheck: matmul") {
  run_rows({
      {"matmul 2-D", {{3, 4}, {4, 5}}, [](auto& x) { return matmul(A(x), B(x)); }},
      {"matmul batched", {{2, 3, 4}, {2, 4, 5}}, [](auto& x) { return matmul(A(x), B(x)); }},
      {"matmul broadcast rhs", {{2, 3, 4}, {4, 5}}, [](auto& x) { return matmul(A(x), B(x)); }},
      {"matmul broadcast batch", {{2, 1, 3, 4}, {3, 4, 2}}, [](auto& x) { return matmul(A(x), B(x)); }},
      {"matmul a @ b^T", {{3, 4}, {5, 4}}, [](auto& x) { return matmul(A(x), B(x).t()); }},
      {"matmul vector-matrix", {{4}, {4, 5}}, [](auto& x) { return matmul(A(x), B(x)); }},
      {"matmul matrix-vector", {{3, 4}, {4}}, [](auto& x) { return matmul(A(x), B(x)); }},
      {"matmul dot", {{4}, {4}}, [](auto& x) { return matmul(A(x), B(x)); }},
      {"linear", {{2, 3, 4}, {5, 4}, {5}}, [](auto& x) { return linear(x[0], x[1], x[2]); }},
      {"linear no bias", {{3, 4}, {5, 4}}, [](auto& x) { return linear(A(x), B(x)); }},
      {"linear 1-D input", {{4}, {5, 4}, {5}}, [](auto& x) { return linear(x[0], x[1], x[2]); }},
  });
}

TEST_CASE("gradcheck: views and copies") {
  run_rows({
      {"reshape", {{3, 4}}, [](auto& x) { return A(x).reshape({2, 6}); }},
      {"view -1", {{3, 4}}, [](auto& x) { return A(x).contiguous().view({-1}); }},
      {"transpose", {{2, 3, 4}}, [](auto& x) { return A(x).transpose(0, 2); }},
      {"permute", {{2, 3, 4}}, [](auto& x) { return A(x).permute({1, 2, 0}); }},
      {"slice step", {{5, 4}}, [](auto& x) { return A(x).slice(0, 1, 5, 2); }},
      {"select", {{3, 4}}, [](auto& x) { return A(x).select(1, -1); }},
      {"narrow", {{3, 4}}, [](auto& x) { return A(x).narrow(1, 1, 2); }},
      {"expand", {{3, 1}}, [](auto& x) { return A(x).expand({2, 3, 4}); }},
      {"squeeze/unsqueeze", {{3, 1}}, [](auto& x) { return A(x).squeeze(1).unsqueeze(0); }},
      {"flatten", {{2, 3, 4}}, [](auto& x) { return A(x).flatten(1); }},
      {"contiguous", {{3, 4}}, [](auto& x) { return A(x).t().contiguous(); }},
      {"clone", {{3, 4}}, [](auto& x) { return A(x).clone(); }},
  });
}

TEST_CASE("gradcheck: indexing, joining and dropout") {
  Tensor idx = tensor({2, 0, 2, 1});
  Tensor ids = tensor({1, 3, 1, 0, 3, 3}, {2, 3});
  Tensor gidx = tensor({0, 2, 2, 1, 0, 0}, {3, 2});
  run_rows({
      {"index_select dim 0", {{3, 4}}, [idx](auto& x) { return index_select(A(x), 0, idx); }},
      {"index_select dim 1", {{2, 3}}, [idx](auto& x) { return index_select(A(x), 1, idx); }},
      {"embedding", {{4, 3}}, [ids](auto& x) { return embedding(A(x), ids); }},
      {"gather", {{3, 4}}, [gidx](auto& x) { return gather(A(x), 1, gidx); }},
      {"cat dim 0", {{2, 3}, {1, 3}}, [](auto& x) { return cat({A(x), B(x)}, 0); }},
      {"cat dim 1", {{2, 3}, {2, 2}}, [](auto& x) { return cat({A(x), B(x)}, -1); }},
      {"stack", {{2, 3}, {2, 3}}, [](auto& x) { return stack({A(x), B(x)}, 1); }},
      {"split", {{5, 2}}, [](auto& x) {
         auto p = split(A(x), 2);
         return p[0].sum() * 2.0 + p[1].sum() * 3.0 + p[2].sum();
       }},
      {"chunk", {{2, 6}}, [](auto& x) { return chunk(A(x), 3, 1)[1] * 5.0; }},
      {"dropout", {{4, 5}}, [](auto& x) {
         Generator g(99);  // the same mask on every call
         return dropout(A(x), 0.3, true, &g);
       }},
  });
}

TEST_CASE("gradcheck: a composite (masked attention)") {
  Tensor causal = gt(arange(3).unsqueeze(0), arange(3).unsqueeze(1));
  run_rows({{"attention", {{2, 3, 4}, {2, 3, 4}, {2, 3, 4}}, [causal](auto& x) {
               Tensor scores = matmul(x[0], x[1].transpose(-1, -2)) / 2.0;
               return matmul(softmax(masked_fill(scores, causal, -1e9), -1), x[2]);
             }}});
}

TEST_CASE("gradcheck fails loudly on a wrong backward") {
  // d(x^2)/dx is 2x; this backward forgets the 2.
  auto bad_square = [](const TensorList& x) {
    Tensor out;
    {
      NoGradGuard g;
      out = x[0] * x[0];
    }
    Tensor saved = x[0].detach();
    return record("BadSquareBackward", out, {x[0]}, [saved](const Tensor& g) { return TensorList{g * saved}; });
  };
  Generator gen(1);
  Tensor x = randn({3}, kFloat64, &gen).requires_grad_();
  std::string msg = error_of([&] { gradcheck(bad_square, {x}); });
  CHECK(msg.find("gradcheck: input 0 (shape [3]) element [") != std::string::npos);
  CHECK(msg.find("analytic gradient") != std::string::npos);
  // A backward that routes the gradient to the wrong element fails too.
  auto bad_flip = [](const TensorList& x) {
    Tensor out;
    {
      NoGradGuard g;
      out = x[0] * 2.0;
    }
    return record("BadFlipBackward", out, {x[0]}, [](const Tensor& g) {
      return TensorList{index_select(g, 0, tensor({2, 1, 0})) * 2.0};
    });
  };
  CHECK_FALSE(error_of([&] { gradcheck(bad_flip, {x}); }).empty());
  // And it refuses inputs it cannot check.
  CHECK(error_of([&] { gradcheck(bad_square, {randn({2}).requires_grad_()}); }).find("need float64") !=
        std::string::npos);
}
