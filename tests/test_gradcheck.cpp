// Gradient checks that a row of the op table cannot express. Every op's own gradcheck is in
// the OpInfo table (tests/opinfo.cpp): test_opinfo.cpp runs gradcheck on each of its float64
// samples (contiguous, transposed, strided, expanded, broadcast). Here: dropout (random: its mask
// is fixed by a seeded generator), a composite (masked attention), and gradcheck itself failing
// loudly on a wrong backward.
#include "tapestry/ops/detail/kernels.h"
#include "tests/helpers.h"

using namespace tapestry;
using namespace tapestry::testing;

namespace {

// gradcheck of f on float64 leaves of `shapes`, contiguous and then transposed.
void check_both_layouts(const std::string& name, const std::vector<Shape>& shapes,
                        const std::function<Tensor(const TensorList&)>& f) {
  Generator gen(1234);
  for (bool noncontig : {false, true}) {
    TensorList inputs;
    for (const Shape& shape : shapes) {
      Tensor v = randn(shape, kFloat64, &gen);
      inputs.push_back((noncontig ? transposed(v) : v).detach().requires_grad_());
    }
    INFO("op: ", name, noncontig ? " (non-contiguous inputs)" : " (contiguous inputs)");
    try {
      CHECK(gradcheck(f, inputs));
    } catch (const Error& e) {
      FAIL_CHECK(e.what());
    }
  }
}

}  // namespace

TEST_CASE("gradcheck: dropout, its mask fixed by a seeded generator") {
  check_both_layouts("dropout", {{4, 5}}, [](const TensorList& x) {
    Generator g(99);  // the same mask on every call
    return dropout(x[0], 0.3, true, &g);
  });
}

TEST_CASE("gradcheck: a composite (masked attention)") {
  Tensor causal = gt(arange(3).unsqueeze(0), arange(3).unsqueeze(1));
  check_both_layouts("attention", {{2, 3, 4}, {2, 3, 4}, {2, 3, 4}}, [causal](const TensorList& x) {
    Tensor scores = matmul(x[0], x[1].transpose(-1, -2)) / 2.0;
    return matmul(softmax(masked_fill(scores, causal, -1e9), -1), x[2]);
  });
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
