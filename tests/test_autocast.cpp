// bfloat16 autocast (ops/autocast.h). On every machine: the software rounding against its
// definition (the nearer of the two neighbouring bfloat16 values, ties to the even one), NaN,
// infinities, overflow and subnormals, and the guard's refusal where the CPU cannot run it. Where
// it can (AVX512-BF16 and oneDNN): matmul and linear, forward and backward, equal a float64
// product of the rounded operands, in every operand layout the kernel reads, the backward keeps
// the forward's precision after the guard is gone, float64 is untouched, and a GPT learns.
#include <cmath>
#include <cstring>
#include <limits>

#include "tapestry/models/gpt.h"
#include "tapestry/ops/autocast.h"
#include "tapestry/ops/cuda.h"
#include "tapestry/optim/optimizer.h"
#include "tests/helpers.h"

using namespace tapestry;
using namespace tapestry::testing;

namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The float32 tensor with each value rounded to bfloat16 (the software reference), as float64.
Tensor rounded64(const Tensor& t) {
  std::vector<float> v = t.contiguous().to_vector<float>();
  std::vector<double> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = bf16_to_float(bf16_round(v[i]));
  return tensor(r, t.sizes(), kFloat64);
}

// |a - b| <= tol * (|A| |B|) elementwise: float32 accumulation of K products.
void check_product(const Tensor& got, const Tensor& ref, const Tensor& scale, double tol = 1e-5) {
  REQUIRE(got.sizes() == ref.sizes());
  std::vector<double> g = got.to(DType::Float64).contiguous().to_vector<double>(), r = ref.contiguous().to_vector<double>(),
                      s = scale.contiguous().to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i) CHECK(std::fabs(g[i] - r[i]) <= tol * s[i] + 1e-30);
}

}  // namespace

TEST_CASE("bf16_round: nearest bfloat16, ties to even, NaN kept, overflow to infinity") {
  struct Case {
    uint32_t in;
    uint16_t out;
  };
  const Case cases[] = {
      {0x3f800000u, 0x3f80},  // 1
      {0x3f808000u, 0x3f80},  // halfway, the even neighbour below
      {0x3f818000u, 0x3f82},  // halfway, the even neighbour above
      {0x3f808001u, 0x3f81},  // just above halfway
      {0x3f807fffu, 0x3f80},  // just below halfway
      {0xbfc00000u, 0xbfc0},  // -1.5
      {0x80000000u, 0x8000},  // -0
      {0x7f800000u, 0x7f80},  // inf
      {0xff800000u, 0xff80},  // -inf
      {0x7f7fffffu, 0x7f80},  // FLT_MAX rounds up to inf
      {0x7f7f7fffu, 0x7f7f},  // the largest value that stays finite
      {0x00010000u, 0x0001},  // the smallest subnormal bfloat16
      {0x00008000u, 0x0000},  // halfway to it: even is 0
      {0x00018000u, 0x0002},
  };
  for (const Case& c : cases) {
    CAPTURE(c.in);
    CHECK(bf16_round(from_bits(c.in)) == c.out);
  }
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xffffffffu, 0x7fbfffffu}) {
    CAPTURE(nan);
    CHECK(std::isnan(bf16_to_float(bf16_round(from_bits(nan)))));
  }
  // Every bfloat16 is a float32 and rounds to itself.
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = bf16_to_float(static_cast<uint16_t>(h));
    if (!std::isnan(f)) REQUIRE(bf16_round(f) == h);
  }
  // Random float32 values: the result is the nearer neighbour (the even one on a tie).
  uint64_t state = 88172645463325252ull;
  for (int i = 0; i < 200000; ++i) {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    const float x = from_bits(static_cast<uint32_t>(state));
    if (!std::isfinite(x)) continue;
    uint32_t u;
    std::memcpy(&u, &x, 4);
    const uint16_t down = static_cast<uint16_t>(u >> 16), up = static_cast<uint16_t>(down + 1);
    const double dd = std::fabs(static_cast<double>(x) - bf16_to_float(down));
    // Past the largest bfloat16 the upper neighbour is +-2^128 (IEEE's rule for rounding to infinity).
    const double up_value = std::isfinite(bf16_to_float(up)) ? bf16_to_float(up) : std::copysign(std::ldexp(1.0, 128), x);
    const double du = std::fabs(static_cast<double>(x) - up_value);
    const uint16_t want = dd < du ? down : du < dd ? up : ((down & 1) ? up : down);
    CAPTURE(u);
    REQUIRE(bf16_round(x) == want);
  }
}

TEST_CASE("autocast: the guard nests, restores, and refuses where the CPU cannot multiply bfloat16") {
  CHECK(autocast_precision() == Precision::Float32);
  CHECK((gemm_library() == "onednn" || gemm_library() == "openblas"));
  std::string why;
  if (!bf16_supported(&why)) {
    CHECK_FALSE(why.empty());
    CHECK_THROWS_WITH_AS(AutocastGuard(Precision::BFloat16), doctest::Contains("autocast to bfloat16"), Error);
    CHECK(autocast_precision() == Precision::Float32);
    MESSAGE("bfloat16 autocast not run here: " << why);
    return;
  }
  {
    AutocastGuard bf16;
    CHECK(autocast_precision() == Precision::BFloat16);
    {
      AutocastGuard fp32(Precision::Float32);
      CHECK(autocast_precision() == Precision::Float32);
    }
    CHECK(autocast_precision() == Precision::BFloat16);
  }
  CHECK(autocast_precision() == Precision::Float32);
}

TEST_CASE("autocast on a device: the check names the device, the gemm names say what runs") {
  // A GPU's bfloat16 runs through cuBLAS (compute capability 8.0 or later): without one (or
  // without a CUDA build) the guard and the matmul refuse, naming the device and the reason.
  if (!cuda::is_available()) {
    std::string why;
    CHECK_FALSE(bf16_supported(Device::CUDA, &why));
    CHECK_FALSE(why.empty());
    CHECK_THROWS_WITH_AS(AutocastGuard(Precision::BFloat16, Device::CUDA), doctest::Contains("autocast to bfloat16 on cuda"),
                         Error);
    CHECK(autocast_precision() == Precision::Float32);
  }
  // The emulated device runs the CPU's kernels, so it has the CPU's support, and the same products.
  CHECK(bf16_supported(Device::Emulated) == bf16_supported());
  CHECK(gemm_library(Device::CPU) == gemm_library());
  CHECK(gemm_library(Device::CPU, Precision::BFloat16) == gemm_library() + "+bf16");
  CHECK(gemm_library(Device::CUDA, Precision::BFloat16) == "cublas-bf16");
  cuda::set_allow_tf32(true);
  CHECK(gemm_library(Device::CUDA) == "cublas-tf32");
  CHECK(gemm_library(Device::CPU) == gemm_library());  // TF32 is a GPU switch: the CPU is unchanged
  cuda::set_allow_tf32(false);
  CHECK(gemm_library(Device::CUDA) == "cublas-fp32");
  if (!bf16_supported()) return;
  manual_seed(5);
  Tensor a = randn({5, 7}), b = randn({3, 7, 4});
  Tensor on_cpu, on_device;
  {
    AutocastGuard bf16(Precision::BFloat16, Device::Emulated);
    on_cpu = matmul(a, b);
    on_device = matmul(a.to(Device::Emulated), b.to(Device::Emulated));
  }
  CHECK(on_device.device() == Device::Emulated);
  CHECK(max_diff(on_device.cpu(), on_cpu) == 0.0);
}

TEST_CASE("autocast: matmul and linear in bfloat16 equal the product of the rounded operands") {
  if (!bf16_supported()) return;  // the case above checks the refusal
  manual_seed(11);
  auto check_matmul = [](const Tensor& a, const Tensor& b) {
    Tensor got;
    {
      AutocastGuard bf16;
      got = matmul(a, b);
    }
    CHECK(got.dtype() == DType::Float32);
    Tensor ref = matmul(rounded64(a), rounded64(b));
    Tensor scale = matmul(abs(rounded64(a)), abs(rounded64(b)));
    check_product(got, ref, scale);
    return got;
  };
  SUBCASE("plain, and the rounding shows") {
    Tensor a = randn({33, 70}), b = randn({70, 45});
    Tensor got = check_matmul(a, b);
    CHECK(max_diff(got, matmul(a, b)) > 1e-3);  // float32 differs: the operands were rounded
  }
  SUBCASE("transposed, strided, batched with broadcast, 1-D and empty operands") {
    check_matmul(randn({40, 17}).t(), randn({40, 23}));
    check_matmul(randn({17, 40}), randn({23, 40}).t());
    check_matmul(randn({17, 80}).slice(1, 0, 80, 2), randn({40, 9}));  // column stride 2: copied first
    check_matmul(randn({3, 1, 6, 8}), randn({4, 8, 5}));
    check_matmul(randn({8}), randn({8, 5}));
    check_matmul(randn({6, 8}), randn({8}));
    Tensor z = check_matmul(randn({4, 0}), randn({0, 3}));
    check_values(z, std::vector<double>(12, 0.0));
    CHECK(check_matmul(randn({0, 5}), randn({5, 3})).numel() == 0);
  }
  SUBCASE("values near the ends of the range, inf and NaN") {
    Tensor a = tensor(std::vector<float>{3e38f, -3e38f, 1e-38f, 2.5f}, {2, 2});
    Tensor b = tensor(std::vector<float>{0.5f, 1.0f, 1.0f, 0.0f}, {2, 2});
    check_matmul(a, b);
    Tensor c = tensor(std::vector<float>{INFINITY, 1.0f, NAN, 2.0f}, {2, 2});
    Tensor got;
    {
      AutocastGuard bf16;
      got = matmul(c, b);
    }
    std::vector<float> v = got.to_vector<float>();
    CHECK(std::isinf(v[0]));
    CHECK(std::isnan(v[2]));
    CHECK(std::isnan(v[3]));
  }
  SUBCASE("float64 is never cast") {
    Tensor a = randn({9, 12}, DType::Float64), b = randn({12, 5}, DType::Float64);
    Tensor got;
    {
      AutocastGuard bf16;
      got = matmul(a, b);
    }
    CHECK(max_diff(got, matmul(a, b)) == 0);
  }
  SUBCASE("linear: forward and every gradient, backward run after the guard is gone") {
    Tensor x = randn({2, 7, 24}).requires_grad_(true), w = randn({18, 24}).requires_grad_(true),
           b = randn({18}).requires_grad_(true);
    Tensor g = randn({2, 7, 18});
    Tensor y;
    {
      AutocastGuard bf16;
      y = linear(x, w, b);
    }
    (y * g).sum().backward();  // outside the guard: MmBackward keeps bfloat16
    Tensor x2 = rounded64(x).reshape({14, 24}), w2 = rounded64(w), g2 = rounded64(g).reshape({14, 18});
    check_product(y.reshape({14, 18}), add(matmul(x2, w2.t()), b.to(DType::Float64)),
                  add(matmul(abs(x2), abs(w2).t()), abs(b.to(DType::Float64))));
    check_product(x.grad().reshape({14, 24}), matmul(g2, w2), matmul(abs(g2), abs(w2)));
    check_product(w.grad(), matmul(g2.t(), x2), matmul(abs(g2).t(), abs(x2)));
    CHECK(max_diff(b.grad(), g.sum({0, 1})) < 1e-5);  // the bias gradient is a sum: float32
    // The same backward in float32 differs: the gradients above came from rounded operands.
    Tensor xf = x.detach().requires_grad_(true);
    (linear(xf, w.detach(), b.detach()) * g).sum().backward();
    CHECK(max_diff(xf.grad(), x.grad()) > 1e-4);
  }
}

TEST_CASE("autocast: a GPT's bfloat16 loss is close to float32's, and it learns") {
  if (!bf16_supported()) return;
  models::GPTConfig c = models::GPTConfig::named("tiny", 30);
  c.block_size = 16, c.dropout = 0.0;
  manual_seed(7);
  models::GPT model(c);
  Tensor ids = randint(0, 30, {4, 17});
  Tensor x = ids.slice(1, 0, 16).contiguous(), y = ids.slice(1, 1, 17).contiguous();
  const double fp32 = model.loss(x, y).item<double>();
  double first = 0, last = 0;
  optim::AdamWOptions ao;
  ao.lr = 3e-3;
  optim::AdamW opt(model.parameters(), ao);
  for (int step = 0; step < 40; ++step) {
    Tensor loss;
    {
      AutocastGuard bf16;
      loss = model.loss(x, y);
    }
    loss.backward();
    opt.step();
    opt.zero_grad();
    if (step == 0) first = loss.item<double>();
    last = loss.item<double>();
  }
  CHECK(std::fabs(first - fp32) < 0.02 * fp32);
  CHECK(last < 0.5 * first);
}

TEST_CASE("autocast: a weight's bfloat16 copy is made once per guard and follows writes (Note [Autocast weight cache])") {
  if (!bf16_supported()) return;
  manual_seed(13);
  Tensor w = randn({12, 16}).requires_grad_(true), b = randn({12}).requires_grad_(true);
  Tensor x0 = randn({5, 16}).requires_grad_(true);
  Tensor g = randn({5, 12});
  // The same products from a copy of the weight that is not marked (it needs no gradient), so it
  // is rounded at each use: the reference for every cached result below.
  auto plain_linear = [&](const Tensor& x, const Tensor& weight) {
    AutocastGuard bf16;
    return linear(x, weight.detach().clone(), b.detach());
  };

  SUBCASE("forward and backward in one guard: one copy, and the backward reuses it") {
    Tensor y;
    {
      AutocastGuard bf16;
      Tensor x = x0 * 2.0;  // an activation: rounded at each use, never kept
      y = linear(x, w, b);
      (y * g).sum().backward();
      CHECK(autocast_cache_counts().copies == 1);
      CHECK(autocast_cache_counts().reuses == 1);  // d x = g W reads W's kept copy in its other layout
    }
    CHECK(max_diff(y, plain_linear(x0.detach() * 2.0, w)) == 0);
    Tensor x1 = (x0.detach() * 2.0).requires_grad_(true);
    {
      AutocastGuard bf16;
      (linear(x1, w.detach(), b.detach()) * g).sum().backward();
    }
    CHECK(max_diff(x0.grad(), x1.grad() * 2.0) == 0);
  }
  SUBCASE("every further use, tied or not, reads the same copy; a new guard starts afresh") {
    Tensor x = x0.detach();
    AutocastGuard bf16;
    Tensor y1 = linear(x, w, b), y2 = linear(x, w, b);
    Tensor tied = matmul(x, w.t());  // the transpose view: the same storage, the same copy
    CHECK(autocast_cache_counts().copies == 1);
    CHECK(autocast_cache_counts().reuses == 2);
    CHECK(max_diff(y1, y2) == 0);
    CHECK(max_diff(add(tied, b), plain_linear(x, w)) < 1e-5);
    {
      AutocastGuard inner;  // nested: the outer guard's cache
      linear(x, w, b);
    }
    CHECK(autocast_cache_counts().reuses == 3);
  }
  SUBCASE("a write to the weight inside the guard makes a new copy") {
    Tensor x = x0.detach();
    AutocastGuard bf16;
    Tensor y1 = linear(x, w, b);
    {
      NoGradGuard no_grad;
      w.mul_(2.0);  // an optimizer step inside the guard: the version moves
    }
    Tensor y2 = linear(x, w, b);
    CHECK(autocast_cache_counts().copies == 2);
    CHECK(max_diff(y2, plain_linear(x, w)) == 0);
    CHECK(max_diff(y2, y1) > 0.1);
  }
  SUBCASE("a weight that died is not mistaken for a new storage at its address") {
    AutocastGuard bf16;
    {
      Tensor dying = randn({12, 16}).requires_grad_(true);
      linear(x0.detach(), dying, b.detach());
    }
    for (int i = 0; i < 4; ++i) {  // the allocator likely hands the same block out again
      Tensor fresh = randn({12, 16});
      CHECK(max_diff(linear(x0.detach(), fresh, b.detach()), plain_linear(x0.detach(), fresh)) == 0);
    }
    CHECK(autocast_cache_counts().copies == 1);
  }
  SUBCASE("the emulated device keeps its own copy, with the CPU's values") {
    Tensor we = w.detach().to(Device::Emulated).requires_grad_(true);
    Tensor y;
    {
      AutocastGuard bf16(Precision::BFloat16, Device::Emulated);
      y = linear(x0.detach().to(Device::Emulated), we, b.detach().to(Device::Emulated));
      linear(x0.detach().to(Device::Emulated), we, b.detach().to(Device::Emulated));
      CHECK(autocast_cache_counts().copies == 1);
      CHECK(autocast_cache_counts().reuses == 1);
    }
    CHECK(max_diff(y.cpu(), plain_linear(x0.detach(), w)) == 0);
  }
  SUBCASE("a GPT step: each weight copied once, and read again by its backward") {
    models::GPTConfig c = models::GPTConfig::named("tiny", 30);
    c.block_size = 8, c.dropout = 0.0;
    models::GPT model(c);
    Tensor ids = randint(0, 30, {2, 9});
    AutocastGuard bf16;
    model.loss(ids.slice(1, 0, 8).contiguous(), ids.slice(1, 1, 9).contiguous()).backward();
    const AutocastCacheCounts n = autocast_cache_counts();
    CHECK(n.copies > 0);
    CHECK(n.copies <= static_cast<int64_t>(model.parameters().size()));
    CHECK(n.reuses >= n.copies);
  }
}
