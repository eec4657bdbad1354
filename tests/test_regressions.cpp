// Regression tests for the op defects of issue 9, one reproducer per case as the issue states
// it (found by differential testing against PyTorch 1.13 and by hostile inputs). Each comment
// says what went wrong before the fix.
#include <cmath>
#include <unistd.h>

#include <fstream>
#include <limits>

#include "tapestry/autograd/gradcheck.h"
#include "tapestry/nn/safetensors.h"
#include "tests/helpers.h"

using namespace tapestry;
using namespace tapestry::testing;

namespace {
const double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::numeric_limits<double>::quiet_NaN();
}  // namespace

TEST_CASE("regression: reductions over dim 0 / -1 of a 0-d tensor") {
  // mean/var over {0} of a 0-d tensor read past an empty shape (segfault).
  Tensor x0 = scalar_tensor(2.0, kFloat64);
  Tensor m = mean(x0, {0});
  CHECK(m.dim() == 0);
  CHECK(m.item<double>() == 2.0);
  CHECK(mean(x0, {-1}, true).dim() == 0);
  CHECK(std::isnan(var(x0, {0}, 0).item<double>()) == false);
  CHECK(var(x0, {0}, 0).item<double>() == 0.0);
  CHECK(std::isnan(var(x0, {0}, 1).item<double>()));  // 0 / max(0, 1 - 1), as torch.var
  CHECK(!error_of([&] { sum(x0, {1}); }).empty());     // only 0 and -1 name the element
  // size(0) of a 0-d tensor read past an empty vector too: now an error, as in PyTorch.
  CHECK(error_of([] { scalar_tensor(1.0).size(0); }).find("0-d tensor has no dimensions") != std::string::npos);
  CHECK(error_of([] { scalar_tensor(1.0).stride(-1); }).find("0-d tensor has no dimensions") != std::string::npos);
}

TEST_CASE("regression: sum over dim 0 of a 0-d tensor has gradient 1") {
  // The forward ran, then backward threw "expand: cannot expand shape [1] to []".
  Tensor x0 = scalar_tensor(3.0, kFloat64).requires_grad_();
  sum(x0, {0}).backward();
  check_values(x0.grad(), {1.0});
  CHECK(gradcheck([](const TensorList& in) { return sum(in[0], {0}); }, {scalar_tensor(0.5, kFloat64).requires_grad_()}));
  CHECK(gradcheck([](const TensorList& in) { return mean(in[0], {-1}, true); },
                  {scalar_tensor(0.5, kFloat64).requires_grad_()}));
}

TEST_CASE("regression: index_select on a 0-d tensor") {
  // Several indices wrote past the one-element output (heap overflow). PyTorch 1.13 returns the
  // 0-d value for [0, 0]; newer PyTorch raises, and so does tapestry.
  Tensor x0 = scalar_tensor(5.0, kFloat64);
  CHECK(error_of([&] { index_select(x0, 0, tensor({0, 0})); }).find("a 0-d tensor takes exactly one index, got 2") !=
        std::string::npos);
  Tensor y = index_select(x0, 0, tensor({0}));
  CHECK(y.dim() == 0);
  CHECK(y.item<double>() == 5.0);
  CHECK(gradcheck([](const TensorList& in) { return index_select(in[0], 0, tensor({0})); },
                  {scalar_tensor(0.5, kFloat64).requires_grad_()}));
}

TEST_CASE("regression: in-place ops with an operand that requires grad are recorded") {
  // y.add_(z) left y without history and z.grad() unset, silently.
  Tensor z = tensor({1.0, 2.0, 3.0}, {}, kFloat64).requires_grad_();
  Tensor y = zeros({3}, kFloat64);
  y.add_(z);
  CHECK(y.requires_grad());
  CHECK(!y.is_leaf());
  sum(mul(y, y)).backward();
  check_values(z.grad(), {2, 4, 6});

  Tensor a = tensor({1.0, 2.0}, {}, kFloat64).requires_grad_();
  Tensor t = tensor({10.0, 20.0}, {}, kFloat64);
  t.sub_(a);  // t = t - a
  t.mul_(a);  // t = (t - a) * a
  t.div_(tensor({2.0, 4.0}, {}, kFloat64));
  sum(t).backward();
  // d/da ((c - a) a / k) = (c - 2a) / k
  check_values(a.grad(), {(10 - 2.0) / 2, (20 - 4.0) / 4});

  Tensor s = tensor({1.0, 2.0}, {}, kFloat64).requires_grad_();
  Tensor dst = zeros({2}, kFloat64);
  dst.copy_(s);
  sum(mul(dst, 3.0)).backward();
  check_values(s.grad(), {3, 3});

  // On a non-leaf that requires grad, the old history is kept (and cut where overwritten).
  Tensor w = tensor({1.0, 2.0}, {}, kFloat64).requires_grad_();
  Tensor h = mul(w, 2.0);
  h.add_(1.0);
  h.mul_(w);  // h = (2w + 1) w
  sum(h).backward();
  check_values(w.grad(), {4 * 1.0 + 1, 4 * 2.0 + 1});
  Tensor v = tensor({1.0, 2.0}, {}, kFloat64).requires_grad_();
  Tensor hv = mul(v, 2.0);
  hv.fill_(7.0);
  sum(mul(hv, v)).backward();
  check_values(v.grad(), {7, 7});  // the filled values carry no gradient back to v

  // gradcheck through each in-place form
  for (int op = 0; op < 5; ++op) {
    INFO("op ", op);
    CHECK(gradcheck(
        [op](const TensorList& in) {
          Tensor base = mul(in[0], 1.5);  // a non-leaf target
          switch (op) {
            case 0: base.add_(in[1], 0.5); break;
            case 1: base.sub_(in[1]); break;
            case 2: base.mul_(in[1]); break;
            case 3: base.div_(add(in[1], 3.0)); break;
            default: base.copy_(in[1]); break;
          }
          return base;
        },
        {tensor({0.3, -0.7, 1.1}, {}, kFloat64).requires_grad_(), tensor({0.2, 0.4, -0.9}, {}, kFloat64).requires_grad_()}));
  }
}

TEST_CASE("regression: in-place autograd refuses what it cannot follow") {
  Tensor leaf = tensor({1.0}, {}, kFloat64).requires_grad_();
  CHECK(error_of([&] { leaf.add_(1.0); }).find("leaf tensor") != std::string::npos);
  Tensor base = zeros({2, 2}, kFloat64);
  Tensor view = base.select(0, 0);
  Tensor z = tensor({1.0, 2.0}, {}, kFloat64).requires_grad_();
  CHECK(error_of([&] { view.add_(z); }).find("shares its storage with another tensor") != std::string::npos);
  {
    NoGradGuard g;  // no recording: a plain write
    view.add_(z);
  }
  check_values(base, {1, 2, 0, 0});
  Tensor small = zeros({1}, kFloat64);
  CHECK(error_of([&] { small.add_(z); }).find("cannot be written in place") != std::string::npos);
}

TEST_CASE("regression: label-smoothed cross_entropy gradient when q does not sum to 1") {
  // Backward assumed sum(q) = 1; with V = 2 and ignore_index a class (or V = 1) it is 1 - eps.
  CHECK(gradcheck(
      [](const TensorList& in) { return cross_entropy(in[0], tensor({1}), 0.1, 0); },
      {tensor({0.3, -0.2}, {1, 2}, kFloat64).requires_grad_()}));
  CHECK(gradcheck([](const TensorList& in) { return cross_entropy(in[0], tensor({0, 0}), 0.2); },
                  {tensor({0.3, -0.2}, {2, 1}, kFloat64).requires_grad_()}));
  CHECK(gradcheck([](const TensorList& in) { return cross_entropy(in[0], tensor({2, 0, 1}), 0.1, 1); },
                  {tensor({0.3, -0.2, 0.5, 1.0, -1.0, 0.1, 0.2, 0.0, 0.7}, {3, 3}, kFloat64).requires_grad_()}));
}

TEST_CASE("regression: cross_entropy with -inf logits") {
  // [[0, -inf, 1]], target 0 gave NaN: 0 * (-inf) in the smoothing term. torch gives 1.3133.
  Tensor logits = tensor({0.0, -kInf, 1.0}, {1, 3}, kFloat64);
  CHECK(cross_entropy(logits, tensor({0})).item<double>() == doctest::Approx(1.3132616875));
  Tensor lf = tensor({0.0f, -std::numeric_limits<float>::infinity(), 1.0f}, {1, 3});
  CHECK(cross_entropy(lf, tensor({0})).item<double>() == doctest::Approx(1.3132616875).epsilon(1e-6));
  // The masked class is the padding class: q is 0 there, so it contributes nothing.
  Tensor pad_masked = tensor({0.0, -kInf, 1.0, 0.5}, {1, 4}, kFloat64);
  double loss = cross_entropy(pad_masked, tensor({0}), 0.1, 1).item<double>();
  CHECK(std::isfinite(loss));
  // With smoothing mass on a -inf class the loss is +inf, as in PyTorch.
  CHECK(cross_entropy(logits, tensor({0}), 0.1).item<double>() == kInf);
  // The gradient through a masked logit is finite and 0 at the masked class.
  Tensor lg = tensor({0.0, -kInf, 1.0}, {1, 3}, kFloat64).requires_grad_();
  cross_entropy(lg, tensor({2})).backward();
  std::vector<double> g = values(lg.grad());
  CHECK(g[1] == 0.0);
  CHECK(std::isfinite(g[0]));
}

TEST_CASE("regression: embedding padding_idx out of range is refused in forward") {
  Tensor w = ones({3, 2}, kFloat64);
  CHECK(error_of([&] { embedding(w, tensor({0, 1}), 3); }).find("embedding: padding_idx 3 is out of range") !=
        std::string::npos);
  CHECK(error_of([&] { embedding(w, tensor({0, 1}), -4); }).find("padding_idx -4 is out of range for 3 rows") !=
        std::string::npos);
  CHECK(embedding(w, tensor({0, 1}), 2).sizes() == Shape{2, 2});
}

TEST_CASE("regression: padding_idx as PyTorch's: unset is none, a negative one counts from the end") {
  // nn.Embedding(4, 2, padding_idx=-1): the last row starts at zero and gets no gradient.
  nn::Embedding last(4, 2, -1);
  REQUIRE(last.padding_idx.has_value());
  CHECK(*last.padding_idx == 3);
  check_values(last.weight.select(0, 3), {0.0, 0.0});
  sum(last.forward(tensor({3, 0, 3}))).backward();
  check_values(last.weight.grad().select(0, 3), {0.0, 0.0});
  check_values(last.weight.grad().select(0, 0), {1.0, 1.0});
  // None: every row learns, row 3 included.
  nn::Embedding none(4, 2);
  CHECK_FALSE(none.padding_idx.has_value());
  sum(none.forward(tensor({3}))).backward();
  check_values(none.weight.grad().select(0, 3), {1.0, 1.0});
  // The functional form: -2 of 3 rows is row 1.
  Tensor w = ones({3, 2}, kFloat64).requires_grad_();
  sum(embedding(w, tensor({1, 2}), -2)).backward();
  check_values(w.grad(), {0, 0, 0, 0, 1, 1});
  CHECK(error_of([] { nn::Embedding(4, 2, 4); }).find("Embedding: padding_idx 4 is out of range for 4 rows") !=
        std::string::npos);
}

TEST_CASE("regression: shape_numel refuses overflowing shapes") {
  CHECK(error_of([] { shape_numel({int64_t(1) << 62, 4}); }).find("more than 2^63 elements") != std::string::npos);
  CHECK(error_of([] { shape_numel({-1, 4}); }).find("negative size") != std::string::npos);
  CHECK(shape_numel({int64_t(1) << 62, int64_t(1) << 62, 0}) == 0);
  CHECK(error_of([] { empty({int64_t(1) << 40, int64_t(1) << 40}); }).find("2^63") != std::string::npos);
}

TEST_CASE("regression: float32 exp on NaN and inf") {
  // vexp converted NaN to int (UB) and gave a finite value for +inf.
  Tensor x = tensor({std::nanf(""), std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(), 0.0f});
  Tensor s = softmax(x, 0);
  for (double v : values(s)) CHECK(std::isnan(v));  // torch: all NaN when a NaN is in the row
  Tensor y = softmax(tensor({0.0f, -std::numeric_limits<float>::infinity()}), 0);
  check_values(y, {1, 0});
}

TEST_CASE("regression: PyTorch semantics for relu(NaN), narrow, chunk, var, linear") {
  // relu(NaN) gave 0; torch gives NaN.
  CHECK(std::isnan(relu(tensor({kNaN})).item<double>()));
  // narrow with a negative start threw; torch counts it from the end.
  check_values(arange(5).narrow(0, -2, 2), {3, 4});
  CHECK(!error_of([] { arange(5).narrow(0, -6, 1); }).empty());
  // chunk of an empty dim gave 1 part; torch gives `chunks` empty parts.
  TensorList parts = chunk(zeros({0, 2}), 3);
  CHECK(parts.size() == 3);
  for (const Tensor& p : parts) CHECK(p.sizes() == Shape{0, 2});
  CHECK(chunk(zeros({5, 2}), 3).size() == 3);
  // var of an empty tensor gave -0; torch gives NaN (0 / max(0, 0 - 1)).
  CHECK(std::isnan(var(zeros({0}, kFloat64)).item<double>()));
  CHECK(std::isnan(mean(zeros({0}, kFloat64)).item<double>()));
  // linear with in_features 0 threw; torch gives the bias.
  Tensor b = tensor({1.0, 2.0}, {}, kFloat64);
  Tensor y = linear(zeros({3, 0}, kFloat64), zeros({2, 0}, kFloat64), b);
  check_values(y, {1, 2, 1, 2, 1, 2});
  Tensor bg = tensor({1.0, 2.0}, {}, kFloat64).requires_grad_();
  Tensor wg = zeros({2, 0}, kFloat64).requires_grad_();
  sum(linear(zeros({3, 0}, kFloat64), wg, bg)).backward();
  check_values(bg.grad(), {3, 3});
  CHECK(wg.grad().sizes() == Shape{2, 0});
}

// ---- checkpoint files (nn/safetensors): what a damaged or crafted file does

namespace {
std::string temp_file(const std::string& name) { return "/tmp/tapestry_regress_" + std::to_string(::getpid()) + "_" + name; }

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}
// A safetensors file with this exact header text and `data_bytes` zero bytes of data.
std::string raw_safetensors(const std::string& header, size_t data_bytes, int64_t length_delta = 0) {
  std::string b;
  uint64_t n = header.size() + length_delta;
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return b + header + std::string(data_bytes, '\0');
}
std::string load_error(const std::string& path) {
  return error_of([&] { nn::load_safetensors(path); });
}
}  // namespace

TEST_CASE("regression: safetensors loader rejects damaged and crafted files") {
  std::string path = temp_file("bad.safetensors");
  // Duplicate tensor name: the last one won silently.
  write_all(path, raw_safetensors(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8));
  CHECK(load_error(path).find("the name 'x' appears twice") != std::string::npos);
  // A [2^62+1, 4] tensor backed by 16 bytes: the element count overflowed to a small number.
  write_all(path, raw_safetensors(R"({"x":{"dtype":"F32","shape":[4611686018427387905,4],"data_offsets":[0,16]}})", 16));
  CHECK(load_error(path).find("invalid shape") != std::string::npos);
  // Gaps and overlaps in the data section.
  write_all(path, raw_safetensors(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8));
  CHECK(load_error(path).find("leaves a gap") != std::string::npos);
  write_all(path, raw_safetensors(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8));
  CHECK(load_error(path).find("overlaps") != std::string::npos);
  write_all(path, raw_safetensors(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8));
  CHECK(load_error(path).find("cover 4 of the 8 data bytes") != std::string::npos);
  // A directory where the file should be gave an uncaught std::ios_failure.
  CHECK(load_error("/tmp").find("is not a regular file") != std::string::npos);
  // Fractional shapes and offsets were truncated ([200.9, 64.2] loaded as [200, 64]; issue 44).
  write_all(path, raw_safetensors(R"({"x":{"dtype":"F32","shape":[1.9],"data_offsets":[0,4]}})", 4));
  CHECK(load_error(path).find("shape [1.9]: not whole numbers") != std::string::npos);
  write_all(path, raw_safetensors(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4.5]}})", 4));
  CHECK(load_error(path).find("not whole numbers") != std::string::npos);
  write_all(path, raw_safetensors(R"({"x":{"dtype":"F32","shape":7,"data_offsets":[0,4]}})", 4));
  CHECK(load_error(path).find("not a list") != std::string::npos);
  std::remove(path.c_str());
}

TEST_CASE("regression: safetensors header length off by one and flipped data bytes are caught") {
  std::string path = temp_file("w.safetensors");
  nn::save_safetensors(path, {{"w", tensor({1.0f, 2.0f, 3.0f, 4.0f})}, {"b", tensor({0.5f})}}, {{"step", "3"}});
  auto ok = nn::load_safetensors(path);
  CHECK(ok.metadata.at("step") == "3");
  CHECK(ok.metadata.count(nn::kChecksumKey) == 0);
  std::string good = read_all(path);
  for (int delta : {-1, 1}) {
    std::string b = good;
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(b[i])) << (8 * i);
    n += delta;
    for (int i = 0; i < 8; ++i) b[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    write_all(path, b);
    INFO("header length off by ", delta);
    CHECK(!load_error(path).empty());
  }
  for (size_t k = 1; k <= 4; ++k) {  // flip one bit in the data section: the checksum catches it
    std::string b = good;
    b[b.size() - k] ^= 0x10;
    write_all(path, b);
    CHECK(load_error(path).find("checksum mismatch") != std::string::npos);
  }
  std::remove(path.c_str());
}

// ---- found by tests/fuzz/fuzz_views (each was a sanitizer report or a wrong answer)

TEST_CASE("regression: empty views with expanded or huge sizes") {
  const int64_t big = std::numeric_limits<int64_t>::max();
  // An empty expanded view is contiguous and writable (nothing to lay out or write), as PyTorch.
  Tensor e = scalar_tensor(1.0, kFloat64).unsqueeze(0).expand({2, 1, 0});
  CHECK(e.is_contiguous());
  CHECK(e.contiguous().sizes() == Shape{2, 1, 0});
  {
    NoGradGuard g;
    e.add_(1000.0);
  }
  // Sizes whose product overflows beside a 0: numel is 0, strides and offsets never overflow.
  Tensor h = zeros({1, 2, 0}, kFloat64).unsqueeze(0).expand({4, big, big, 2, 0});
  CHECK(h.numel() == 0);
  CHECK(h.clone().numel() == 0);
  CHECK(h.unsqueeze(1).dim() == 6);
  CHECK(h.flatten().sizes() == Shape{0});
  CHECK(h.view({big, big, -1}).sizes() == Shape{big, big, 0});
  // Summing the empty dim away would leave [big, big, 2] elements: an error, not an overflow.
  CHECK(error_of([&] { h.sum({0, 4}); }).find("more than 2^63 elements") != std::string::npos);
  CHECK(h.sum({1}).numel() == 0);
  CHECK(sum(h).item<double>() == 0.0);
  CHECK(h.select(1, 5).numel() == 0);
  CHECK(h.slice(1, 3, big, big / 2).numel() == 0);
}

TEST_CASE("regression: expand and slice arguments at the extremes") {
  CHECK(error_of([] { ones({1, 3}).expand({-2, 3}); }).find("expand: invalid size -2") != std::string::npos);
  Tensor x = arange(10);
  Tensor s = x.slice(0, 1, 10, std::numeric_limits<int64_t>::max());  // ceil without overflow: one element
  check_values(s, {1});
  Tensor xs = arange(10.0, 20.0, 1.0, kFloat64).requires_grad_();
  sum(xs.slice(0, 2, 10, std::numeric_limits<int64_t>::max())).backward();
  check_values(xs.grad(), {0, 0, 1, 0, 0, 0, 0, 0, 0, 0});
  CHECK(error_of([] { arange(5).narrow(0, 2, std::numeric_limits<int64_t>::max()); }).find("narrow:") != std::string::npos);
}

TEST_CASE("regression: a BOOL tensor with bytes other than 0 and 1 is refused (found by fuzz_safetensors)") {
  std::string path = temp_file("bool.safetensors");
  std::string file = raw_safetensors(R"({"m":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", 0) + std::string("\x01\x72", 2);
  write_all(path, file);
  CHECK(load_error(path).find("BOOL tensor 'm' holds the byte 114 at element 1") != std::string::npos);
  std::remove(path.c_str());
}
