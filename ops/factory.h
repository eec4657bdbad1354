// Tensor factories and random numbers. Random draws come from a Generator; the default one is
// seeded by manual_seed(). Draws are sequential, so results never depend on the thread count.
#pragma once
#include <cstdint>
#include <random>

#include "tapestry/ops/tensor.h"

namespace tapestry {

class Generator {
 public:
  explicit Generator(uint64_t seed = 5489u) : engine_(seed) {}
  void manual_seed(uint64_t seed) { engine_.seed(seed); }
  std::mt19937_64& engine() { return engine_; }
  // Exposes the whole state so a training run can checkpoint and resume its randomness.
  std::string state() const;
  void set_state(const std::string& state);

 private:
  std::mt19937_64 engine_;
};

Generator& default_generator();
void manual_seed(uint64_t seed);

Tensor empty(const Shape& shape, TensorOptions opts = {});
Tensor zeros(const Shape& shape, TensorOptions opts = {});
Tensor ones(const Shape& shape, TensorOptions opts = {});
Tensor full(const Shape& shape, double value, TensorOptions opts = {});
Tensor scalar_tensor(double value, TensorOptions opts = {});  // 0-dim
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, double value);
// [start, end) by step, like torch.arange: float32 from floating bounds (or step), int64 from
// integer ones, arange(0, 10) as arange(10).
Tensor arange(double start, double end, double step = 1.0, TensorOptions opts = DType::Float32);
Tensor arange(int64_t end, TensorOptions opts = DType::Int64);
template <class S, class E, class St = int64_t,
          std::enable_if_t<std::is_integral_v<S> && std::is_integral_v<E> && std::is_integral_v<St>, int> = 0>
Tensor arange(S start, E end, St step = 1, TensorOptions opts = DType::Int64) {
  return arange(static_cast<double>(start), static_cast<double>(end), static_cast<double>(step), opts);
}

// From values (copied). The shape defaults to 1-D; its element count must match. As torch.tensor
// (and libtorch's torch::tensor), floating values give float32, the default dtype, whether they
// are written as floats or doubles: tensor({1.0, 2.0}) is float32. Pass kFloat64 to keep doubles.
Tensor tensor(const std::vector<float>& values, const Shape& shape = {}, TensorOptions opts = DType::Float32);
Tensor tensor(const std::vector<double>& values, const Shape& shape = {}, TensorOptions opts = DType::Float32);
Tensor tensor(const std::vector<int64_t>& values, const Shape& shape = {}, TensorOptions opts = DType::Int64);
Tensor tensor(std::initializer_list<float> values, const Shape& shape = {}, TensorOptions opts = DType::Float32);
Tensor tensor(std::initializer_list<double> values, const Shape& shape = {}, TensorOptions opts = DType::Float32);
Tensor tensor(std::initializer_list<int64_t> values, const Shape& shape = {}, TensorOptions opts = DType::Int64);
// Plain integer literals, tensor({2, 0, 1}), give an int64 tensor as in PyTorch.
Tensor tensor(std::initializer_list<int> values, const Shape& shape = {}, TensorOptions opts = DType::Int64);

// Standard normal, uniform [0, 1), integers in [low, high).
Tensor randn(const Shape& shape, TensorOptions opts = {}, Generator* gen = nullptr);
Tensor rand(const Shape& shape, TensorOptions opts = {}, Generator* gen = nullptr);
Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions opts = DType::Int64,
               Generator* gen = nullptr);
// A random permutation of 0 .. n-1 (Fisher-Yates from the generator: the same seed, the same
// order on every device), int64 unless opts say another dtype.
Tensor randperm(int64_t n, TensorOptions opts = DType::Int64, Generator* gen = nullptr);

// Elementwise closeness |a - b| <= atol + rtol * |b| (after broadcasting), like torch.allclose.
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8);

// Threads used by elementwise ops, reductions and OpenBLAS (one OpenMP pool for all).
void set_num_threads(int n);
int get_num_threads();

}  // namespace tapestry
