// autograd::functional against torch.autograd.functional (issue 45): vjp, jvp, jacobian,
// hessian, hvp and vhp of two small float64 functions, written to a dump that
// tools/reference/second_order_ref.py recomputes with PyTorch (ctest second_order_parity).
//   functional_dump OUT.safetensors
#include <cstdio>
#include <string>

#include "tapestry/autograd/functional.h"
#include "tapestry/autograd/functions.h"
#include "tapestry/nn/module.h"
#include "tapestry/nn/safetensors.h"

using namespace tapestry;
namespace fn = tapestry::autograd::functional;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: functional_dump OUT.safetensors\n");
    return 2;
  }
  try {
    Generator g(21);
    // scalar(x [3, 2], y [2]) = sum(tanh(x y) * softplus(x)[:, 0]) + sum(y^3)
    auto scalar = [](const TensorList& in) {
      const Tensor xy = matmul(in[0], in[1]);
      return add(sum(mul(tanh(xy), select(softplus(in[0]), 1, 0))), sum(pow(in[1], 3.0)));
    };
    // vector(x [3, 2], y [2]) = sigmoid(x y) * exp(x[:, 1])
    auto vector = [](const TensorList& in) { return mul(sigmoid(matmul(in[0], in[1])), exp(select(in[0], 1, 1))); };
    Tensor x = randn({3, 2}, kFloat64, &g), y = randn({2}, kFloat64, &g);
    Tensor vx = randn({3, 2}, kFloat64, &g), vy = randn({2}, kFloat64, &g), vout = randn({3}, kFloat64, &g);

    nn::NamedTensors dump{{"in.x", x}, {"in.y", y}, {"in.vx", vx}, {"in.vy", vy}, {"in.vout", vout}};
    auto put = [&dump](const std::string& name, const Tensor& t) { dump.emplace_back(name, t.detach().contiguous()); };
    auto [out1, vjp] = fn::vjp(vector, {x, y}, vout);
    put("vjp.out", out1), put("vjp.x", vjp[0]), put("vjp.y", vjp[1]);
    auto [out2, jvp] = fn::jvp(vector, {x, y}, {vx, vy});
    put("jvp.out", out2), put("jvp.jv", jvp);
    TensorList jac = fn::jacobian(vector, {x, y});
    put("jacobian.x", jac[0]), put("jacobian.y", jac[1]);
    std::vector<TensorList> hes = fn::hessian(scalar, {x, y});
    put("hessian.xx", hes[0][0]), put("hessian.xy", hes[0][1]), put("hessian.yx", hes[1][0]), put("hessian.yy", hes[1][1]);
    auto [out3, hvp] = fn::hvp(scalar, {x, y}, {vx, vy});
    put("hvp.out", out3), put("hvp.x", hvp[0]), put("hvp.y", hvp[1]);
    auto [out4, vhp] = fn::vhp(scalar, {x, y}, {vx, vy});
    put("vhp.out", out4), put("vhp.x", vhp[0]), put("vhp.y", vhp[1]);
    nn::save_safetensors(argv[1], dump, {{"example", "functional"}});
    std::printf("functional_dump: wrote %s\n", argv[1]);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "functional_dump: %s\n", e.what());
    return 1;
  }
}
