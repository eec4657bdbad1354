// Factories, random draws, allclose and the thread setting.
#include "tapestry/ops/factory.h"

#include <cmath>
#include <sstream>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "tapestry/ops/detail/kernels.h"

extern "C" void openblas_set_num_threads(int);

namespace tapestry {

std::string Generator::state() const {
  std::ostringstream os;
  os << engine_;
  return os.str();
}

void Generator::set_state(const std::string& state) {
  std::istringstream is(state);
  is >> engine_;
  TP_CHECK(!is.fail(), "Generator::set_state: not a generator state string");
}

Generator& default_generator() {
  static Generator gen;
  return gen;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

Tensor empty(const Shape& shape, TensorOptions opts) {
  for (int64_t d : shape) TP_CHECK(d >= 0, "empty: negative dimension in shape {}", shape);
  auto storage = std::make_shared<Storage>(shape_numel(shape) * dtype_size(opts.dtype), opts.device);
  Tensor t = make_tensor(std::move(storage), shape, contiguous_strides(shape), 0, opts.dtype);
  if (opts.requires_grad) t.requires_grad_();
  return t;
}

Tensor full(const Shape& shape, double value, TensorOptions opts) {
  bool rg = opts.requires_grad;
  opts.requires_grad = false;
  Tensor t = empty(shape, opts);
  kernels::fill_(t, value);
  t.impl().storage->version = 0;  // a new tensor starts at version 0 whatever filled it
  if (rg) t.requires_grad_();
  return t;
}

Tensor zeros(const Shape& shape, TensorOptions opts) { return full(shape, 0.0, opts); }
Tensor ones(const Shape& shape, TensorOptions opts) { return full(shape, 1.0, opts); }
Tensor scalar_tensor(double value, TensorOptions opts) { return full({}, value, opts); }
Tensor empty_like(const Tensor& t) { return empty(t.sizes(), t.options()); }
Tensor zeros_like(const Tensor& t) { return zeros(t.sizes(), t.options()); }
Tensor ones_like(const Tensor& t) { return ones(t.sizes(), t.options()); }
Tensor full_like(const Tensor& t, double value) { return full(t.sizes(), value, t.options()); }

namespace {
// Tensors whose values are made on the host (ranges, literals, random draws) are made on the
// CPU and then moved: the same seed gives the same numbers on every device.
Tensor finish(Tensor t, const TensorOptions& opts) {
  t = kernels::to_device(t, opts.device);
  t.impl().storage->version = 0;
  if (opts.requires_grad) t.requires_grad_();
  return t;
}
}  // namespace

Tensor arange(double start, double end, double step, TensorOptions opts) {
  TP_CHECK(step != 0, "arange: step must be non-zero");
  TP_CHECK((end - start) / step >= 0, "arange: the range [{}, {}) cannot be walked with step {}", start, end, step);
  int64_t n = static_cast<int64_t>(std::ceil((end - start) / step));
  Tensor t = empty({n}, opts.dtype);
  dispatch_numeric(opts.dtype, "arange", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = t.data_ptr<T>();
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(start + static_cast<double>(i) * step);
  });
  return finish(t, opts);
}

Tensor arange(int64_t end, TensorOptions opts) { return arange(0.0, static_cast<double>(end), 1.0, opts); }

namespace {
template <class S>
Tensor from_values(const S* values, size_t count, const Shape& shape_in, TensorOptions opts) {
  Shape shape = shape_in.empty() ? Shape{static_cast<int64_t>(count)} : shape_in;
  TP_CHECK(shape_numel(shape) == static_cast<int64_t>(count), "tensor: {} values do not fill shape {} ({} elements)",
           count, shape, shape_numel(shape));
  Tensor t = empty(shape, opts.dtype);
  dispatch(opts.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = t.data_ptr<T>();
    for (size_t i = 0; i < count; ++i) p[i] = static_cast<T>(values[i]);
  });
  return finish(t, opts);
}
}  // namespace

Tensor tensor(const std::vector<float>& v, const Shape& s, TensorOptions o) { return from_values(v.data(), v.size(), s, o); }
Tensor tensor(const std::vector<double>& v, const Shape& s, TensorOptions o) { return from_values(v.data(), v.size(), s, o); }
Tensor tensor(const std::vector<int64_t>& v, const Shape& s, TensorOptions o) { return from_values(v.data(), v.size(), s, o); }
Tensor tensor(std::initializer_list<float> v, const Shape& s, TensorOptions o) { return from_values(v.begin(), v.size(), s, o); }
Tensor tensor(std::initializer_list<double> v, const Shape& s, TensorOptions o) { return from_values(v.begin(), v.size(), s, o); }
Tensor tensor(std::initializer_list<int64_t> v, const Shape& s, TensorOptions o) { return from_values(v.begin(), v.size(), s, o); }
Tensor tensor(std::initializer_list<int> v, const Shape& s, TensorOptions o) { return from_values(v.begin(), v.size(), s, o); }

Tensor randn(const Shape& shape, TensorOptions opts, Generator* gen) {
  Tensor t = empty(shape, opts.dtype);
  kernels::normal_(t, 0.0, 1.0, (gen ? *gen : default_generator()).engine());
  return finish(t, opts);
}

Tensor rand(const Shape& shape, TensorOptions opts, Generator* gen) {
  Tensor t = empty(shape, opts.dtype);
  kernels::uniform_(t, 0.0, 1.0, (gen ? *gen : default_generator()).engine());
  return finish(t, opts);
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions opts, Generator* gen) {
  TP_CHECK(low < high, "randint: empty range [{}, {})", low, high);
  Tensor t = empty(shape, opts.dtype);
  kernels::randint_(t, low, high, (gen ? *gen : default_generator()).engine());
  opts.requires_grad = false;  // integers carry no gradient
  return finish(t, opts);
}

Tensor randperm(int64_t n, TensorOptions opts, Generator* gen) {
  TP_CHECK(n >= 0, "randperm: n must be non-negative, got {}", n);
  TP_CHECK(opts.dtype != DType::Bool, "randperm: a permutation cannot be bool");
  TP_CHECK(opts.dtype == DType::Int64 || n <= (int64_t{1} << 24) || opts.dtype == DType::Float64,
           "randperm: n = {} is too large for exact {} values", n, opts.dtype);
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  std::mt19937_64& engine = (gen ? *gen : default_generator()).engine();
  // Fisher-Yates, from the back; each swap partner is drawn uniformly from [0, i].
  for (int64_t i = n - 1; i > 0; --i) {
    std::uniform_int_distribution<int64_t> pick(0, i);
    std::swap(order[i], order[pick(engine)]);
  }
  Tensor t = kernels::to_dtype(tensor(order, {n}), opts.dtype);
  opts.requires_grad = opts.requires_grad && opts.dtype != DType::Int64;
  return finish(t, opts);
}

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  Shape s = broadcast_shapes("allclose", a.sizes(), b.sizes());
  // Both broadcast to s by copying (kernels::copy_ broadcasts; no view op, which would record).
  auto broadcast_values = [&s](const Tensor& t) {
    Tensor out = empty(s, TensorOptions(t.dtype(), t.device()));
    kernels::copy_(out, t);
    return out.to_vector<double>();
  };
  std::vector<double> va = broadcast_values(a), vb = broadcast_values(b);
  for (size_t i = 0; i < va.size(); ++i) {
    if (std::isnan(va[i]) || std::isnan(vb[i])) return false;
    if (va[i] == vb[i]) continue;  // equal infinities
    if (std::fabs(va[i] - vb[i]) > atol + rtol * std::fabs(vb[i])) return false;
  }
  return true;
}

void set_num_threads(int n) {
  TP_CHECK(n >= 1, "set_num_threads: expected a positive count, got {}", n);
#ifdef _OPENMP
  omp_set_num_threads(n);
#endif
  openblas_set_num_threads(n);
}

int get_num_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

}  // namespace tapestry
