// Bad input: every mistake throws a tapestry::Error whose message names the op and the
// shapes or values involved. The messages are part of the API; these tests pin them down.
#include "tapestry/ops/cuda.h"
#include "tapestry/ops/detail/kernels.h"
#include "tests/helpers.h"

using namespace tapestry;
using namespace tapestry::testing;

namespace {
void check_error(const std::string& msg, const std::string& expected) {
  INFO("message: ", msg);
  CHECK(msg.find(expected) != std::string::npos);
}
}  // namespace

TEST_CASE("shape mismatches name the op and both shapes") {
  check_error(error_of([] { add(ones({2, 3}), ones({4})); }),
              "add: shapes [2, 3] and [4] cannot be broadcast (dim 1: 3 vs 4)");
  check_error(error_of([] { mul(ones({2, 3}), ones({3, 2})); }), "mul: shapes [2, 3] and [3, 2] cannot be broadcast");
  check_error(error_of([] { matmul(ones({4, 8}), ones({16, 2})); }),
              "matmul: shapes [4, 8] and [16, 2] cannot be multiplied (inner dims 8 != 16)");
  check_error(error_of([] { matmul(ones({2, 3, 4}), ones({5, 4, 2})); }),
              "matmul: shapes [2] and [5] cannot be broadcast");
  check_error(error_of([] { ones({2, 3}).view({4}); }), "view: shape [4] is invalid for an input of shape [2, 3]");
  check_error(error_of([] { ones({2, 3}).reshape({-1, -1}); }), "reshape: only one dim can be -1");
  check_error(error_of([] { ones({2, 3}).expand({4, 3, 2}); }),
              "expand: cannot expand shape [2, 3] to [4, 3, 2]: dim 0 has size 2");
  check_error(error_of([] { cat({ones({2, 3}), ones({2, 4})}, 0); }),
              "cat: tensor 1 has shape [2, 4] but tensor 0 has shape [2, 3]; they must match except in dim 0");
  check_error(error_of([] { stack({ones({2}), ones({3})}); }), "stack: tensor 1 has shape [3] but tensor 0 has shape [2]");
  check_error(error_of([] { layer_norm(ones({2, 3}), {4}); }),
              "layer_norm: normalized_shape [4] does not match the trailing dims of the input [2, 3]");
  check_error(error_of([] { layer_norm(ones({2, 3}), {3}, ones({4})); }), "layer_norm: weight float32 [4] must be");
  check_error(error_of([] { ones({2, 2}).copy_(ones({3})); }),
              "copy_: shapes [2, 2] and [3] cannot be broadcast");
  check_error(error_of([] { ones({2, 2}).masked_fill(gt(ones({3, 2, 2}), 0.0), 1.0); }),
              "masked_fill: mask of shape [3, 2, 2] does not broadcast to the input shape [2, 2]");
  check_error(error_of([] { tensor({1.f, 2.f, 3.f}, {2, 2}); }), "tensor: 3 values do not fill shape [2, 2]");
  check_error(error_of([] { ones({2}).item<float>(); }), "item: expected a tensor with one element, got shape [2]");
  check_error(error_of([] { ones({3}).permute({0, 0}); }), "permute: 2 dims given for a tensor of shape [3]");
  check_error(error_of([] { gather(ones({2, 3}), 1, tensor({0})); }),
              "gather: index of shape [1] must have as many dims as the input [2, 3]");
}

TEST_CASE("wrong dtypes name the op and the dtypes") {
  check_error(error_of([] { add(ones({2}), ones({2}, kFloat64)); }),
              "add: dtype mismatch: float32 [2] and float64 [2] (convert one with .to())");
  check_error(error_of([] { matmul(ones({2, 2}), ones({2, 2}, kFloat64)); }), "matmul: dtype mismatch");
  check_error(error_of([] { matmul(arange(4).reshape({2, 2}), arange(4).reshape({2, 2})); }),
              "matmul: expected a floating-point tensor (float32 or float64), got int64");
  check_error(error_of([] { exp(arange(3)); }), "exp: expected a floating-point tensor (float32 or float64), got int64");
  check_error(error_of([] { div(arange(3), arange(3)); }), "div: not supported for int64 tensors");
  check_error(error_of([] { where(ones({2}), ones({2}), ones({2})); }),
              "where: condition must be a bool mask, got float32 [2]");
  check_error(error_of([] { embedding(ones({4, 3}), ones({2})); }), "embedding: ids must be int64, got float32 [2]");
  check_error(error_of([] { ones({2}).data_ptr<double>(); }), "data_ptr: tensor is float32, asked for float64");
  check_error(error_of([] { add(gt(ones({2}), 0.0), gt(ones({2}), 0.0)); }), "add: not supported for bool tensors");
  check_error(error_of([] { softmax(arange(3), 0); }), "softmax: expected a floating-point tensor");
}

TEST_CASE("out-of-range indices and dims name the op and the value") {
  check_error(error_of([] { ones({2, 3}).transpose(0, 2); }),
              "transpose: dim 2 out of range for a tensor of 2 dims (expected [-2, 1])");
  check_error(error_of([] { sum(ones({2, 3}), {-3}); }), "sum: dim -3 out of range for a tensor of 2 dims");
  check_error(error_of([] { softmax(ones({2, 3}), 2); }), "softmax: dim 2 out of range");
  check_error(error_of([] { ones({2, 3}).select(1, 3); }),
              "select: index 3 is out of range for dim 1 of size 3 (tensor shape [2, 3])");
  check_error(error_of([] { ones({2, 3}).unsqueeze(3); }), "unsqueeze: dim 3 out of range");
  check_error(error_of([] { ones({2, 3}).narrow(1, 2, 2); }), "narrow: start 2 + length 2 exceeds dim 1 of size 3");
  check_error(error_of([] { embedding(ones({4, 3}), tensor({1, 4})); }),
              "embedding: index 4 is out of range for dim 0 of size 4 (tensor shape [4, 3])");
  check_error(error_of([] { index_select(ones({4, 3}), 1, tensor({-1})); }),
              "index_select: index -1 is out of range for dim 1 of size 3");
  check_error(error_of([] { gather(ones({2, 3}), 1, tensor({0, 5}, {2, 1})); }),
              "gather: index 5 is out of range for dim 1 of size 3");
  check_error(error_of([] { max(ones({2, 3}), 2); }), "max: dim 2 out of range");
  check_error(error_of([] { max(zeros({0})); }), "max: cannot reduce an empty dimension");
  check_error(error_of([] { ones({2}).slice(0, 0, 2, 0); }), "slice: step must be positive, got 0");
  check_error(error_of([] { split(ones({4}), 0); }), "split: split_size must be positive (0 only for an empty dim), got 0 for dim 0 of size 4");
  check_error(error_of([] { dropout(ones({2}), 1.5); }), "dropout: probability must be in [0, 1], got 1.5");
  check_error(error_of([] { arange(0.0, 5.0, -1.0); }), "arange: the range [0, 5) cannot be walked with step -1");
  check_error(error_of([] { empty({2, -1}); }), "empty: negative dimension in shape [2, -1]");
  check_error(error_of([] { clamp(ones({2}), 1.0, 0.0); }), "clamp: min 1 is greater than max 0");
  check_error(error_of([] { randint(3, 3, {2}); }), "randint: empty range [3, 3)");
  check_error(error_of([] { set_num_threads(0); }), "set_num_threads: expected a positive count, got 0");
}

TEST_CASE("devices: names, parsing, options and moves to the device a tensor is on") {
  CHECK(Device::parse("cpu") == Device::CPU);
  CHECK(Device::parse("cuda") == Device::CUDA);
  CHECK(Device::parse("cuda:3") == Device(DeviceType::CUDA, 3));
  CHECK(Device(DeviceType::CPU, 5) == Device::CPU);  // the CPU has one index
  CHECK(device_name(Device(DeviceType::CUDA, 1)) == "cuda:1");
  CHECK(fmt::format("{}", Device::CPU) == "cpu");
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "CPU", ""})
    check_error(error_of([&] { Device::parse(bad); }), fmt::format("device: '{}' is not a device", bad));
  Tensor a = ones({2, 3}, kFloat64);
  CHECK(a.options().dtype == kFloat64);
  CHECK(a.options().device == Device::CPU);
  CHECK(a.to(Device::CPU).impl_ptr() == a.impl_ptr());  // already there: the same tensor
  CHECK(zeros_like(a).device() == Device::CPU);
  CHECK(zeros({2}, TensorOptions(kInt64, Device::CPU)).dtype() == kInt64);
  CHECK(kernels::common_device("op", {&a}) == Device::CPU);
  Tensor undefined;
  CHECK(kernels::common_device("op", {&undefined, &a}) == Device::CPU);
}

TEST_CASE("undefined tensors and the cuda seam fail clearly") {
  Tensor undefined;
  check_error(error_of([&] { undefined.sizes(); }), "Tensor: operation on an undefined tensor");
  if (!cuda::built()) {
    check_error(error_of([&] { zeros({2}, Device::CUDA); }), "Storage: device cuda:0 is not built in");
    check_error(error_of([&] { ones({2}).to(Device::CUDA); }), "Storage: device cuda:0 is not built in");
    check_error(error_of([&] { cuda::synchronize(); }), "synchronize: device cuda:0 is not built in");
    CHECK(cuda::device_count() == 0);
    CHECK(!cuda::is_available());
    CHECK(cuda::unavailable_reason().find("-DTAPESTRY_CUDA=ON") != std::string::npos);
  }
  check_error(error_of([] { ones({3}).expand({2, 3}).add_(1.0); }),
              "add_: the destination of shape [2, 3] (strides [0, 1]) is an expanded view");
}
