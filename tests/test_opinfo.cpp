// The OpInfo table (tests/opinfo.h) inside the doctest suite, without PyTorch:
//   (a) every sample runs forward and backward; a tapestry::Error is allowed exactly on the samples
//       where PyTorch raises (and required there), and nothing else may ever be thrown;
//   (b) every differentiable float64 sample with finite values passes gradcheck;
//   (c) random op programs run, and the smooth ones pass gradcheck and gradgradcheck;
//   (d) every such sample passes gradgradcheck too (second derivatives, create_graph).
// The values themselves are compared with PyTorch by tests/opinfo.sh (ctest opinfo_parity).
#include <algorithm>
#include <cmath>
#include <exception>
#include <functional>
#include <utility>

#include "tests/helpers.h"
#include "tests/opinfo.h"

using namespace tapestry;
using namespace tapestry::opinfo;

namespace {

// gradcheck's leaves for the differentiable inputs: the same storage and layout (transposed and
// strided inputs stay non-contiguous), except that an expanded input is copied first, since
// gradcheck perturbs one element of storage at a time and expanded elements share it.
TensorList gradcheck_leaves(const TensorList& inputs, const std::vector<size_t>& pos) {
  TensorList xs;
  for (size_t i : pos) {
    Tensor x = has_expanded_dims(inputs[i]) ? inputs[i].contiguous().detach() : inputs[i].detach();
    x.requires_grad_();
    xs.push_back(x);
  }
  return xs;
}

// One float64 tensor from an op's outputs: the output itself, or the float64 outputs flattened
// and concatenated (split, chunk; max with indices keeps only the values).
Tensor float64_output(const TensorList& outs) {
  TensorList parts;
  for (const Tensor& o : outs)
    if (o.defined() && o.dtype() == kFloat64) parts.push_back(reshape(o, {-1}));
  if (parts.empty()) return Tensor();
  if (outs.size() == 1) return outs[0];
  return cat(parts, 0);
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : t.to_vector<double>()) m = std::max(m, std::fabs(v));
  return m;
}

}  // namespace

TEST_CASE("opinfo: every sample runs - tapestry throws exactly where PyTorch raises") {
  size_t n_samples = 0, n_errors = 0;
  for (const OpInfo& op : op_table()) {
    std::vector<Sample> samples = make_samples(op, 1);
    CHECK_MESSAGE(!samples.empty(), op.name, " has no samples");
    for (size_t k = 0; k < samples.size(); ++k) {
      const Sample& s = samples[k];
      INFO(op.name, " [", s.desc, "]: ", op.expr);
      RunResult r = run_case(op.fn, s.inputs, op.differentiable, 1000 + k);
      CHECK_MESSAGE(!r.foreign, "threw something other than a tapestry::Error: ", r.error);
      if (s.expect_error) {
        CHECK_MESSAGE(r.threw, "PyTorch raises on this sample, but tapestry did not throw");
        ++n_errors;
      } else {
        CHECK_MESSAGE(!r.threw, "unexpected error: ", r.error);
        CHECK_MESSAGE(r.backward_error.empty(), "backward threw: ", r.backward_error);
        CHECK_MESSAGE(r.backward2_error.empty(), "the second-order backward threw: ", r.backward2_error);
      }
      ++n_samples;
    }
  }
  MESSAGE(n_samples, " samples of ", op_table().size(), " ops, ", n_errors, " of them error samples");
}

TEST_CASE("opinfo: op names are unique") {
  std::vector<std::string> names;
  for (const OpInfo& op : op_table()) names.push_back(op.name);
  std::sort(names.begin(), names.end());
  CHECK(std::adjacent_find(names.begin(), names.end()) == names.end());
}

namespace {

// Every differentiable float64 sample with finite values, as (f of its differentiable inputs,
// gradcheck's leaves), to `check`; returns (checked, skipped).
std::pair<size_t, size_t> for_each_differentiable_sample(
    const std::function<void(const std::function<Tensor(const TensorList&)>&, const TensorList&)>& check) {
  size_t checked = 0, skipped = 0;
  for (const OpInfo& op : op_table()) {
    std::vector<Sample> samples = make_samples(op, 2);
    for (const Sample& s : samples) {
      // Skipped: error samples (nothing to differentiate), and samples marked no_gradcheck: at
      // kinks and ties (relu/abs at 0, clamp at its bounds, max/maximum at equal elements) the
      // analytic gradient is PyTorch's convention, not a derivative; zero-variance rows make the
      // finite differences ill-conditioned; padding_idx rows get no gradient by definition.
      if (s.expect_error || !s.no_gradcheck.empty()) {
        ++skipped;
        continue;
      }
      // Finite differences need float64 leaves: float32 samples and ops without differentiable
      // inputs are skipped; so is any sample with an inf or NaN input (differences of inf are
      // meaningless).
      std::vector<size_t> pos;
      bool usable = true;
      for (size_t i = 0; i < s.inputs.size(); ++i) {
        const Tensor& x = s.inputs[i];
        usable = usable && all_finite(x);
        if (!op.is_differentiable(i) || !is_floating(x.dtype())) continue;
        usable = usable && x.dtype() == kFloat64;
        pos.push_back(i);
      }
      if (!usable || pos.empty()) {
        ++skipped;
        continue;
      }
      TensorList fixed = s.inputs;
      const OpFn& fn = op.fn;
      auto f = [&fixed, &pos, &fn](const TensorList& xs) {
        TensorList in = fixed;
        for (size_t k = 0; k < pos.size(); ++k) in[pos[k]] = xs[k];
        return float64_output(fn(in));
      };
      // The outputs must be float64 and finite as well (var of one element is NaN, a mean over an
      // empty dim is NaN: nothing to difference there).
      // A forward that throws is reported by the first test case; skipped here.
      Tensor probe;
      try {
        NoGradGuard no_grad;
        probe = f(gradcheck_leaves(s.inputs, pos));
      } catch (const std::exception&) {
        ++skipped;
        continue;
      }
      if (!probe.defined() || probe.dtype() != kFloat64 || !all_finite(probe)) {
        ++skipped;
        continue;
      }
      INFO(op.name, " [", s.desc, "]: ", op.expr);
      try {
        check(f, gradcheck_leaves(s.inputs, pos));
      } catch (const std::exception& e) {
        FAIL_CHECK(e.what());
      }
      ++checked;
    }
  }
  return {checked, skipped};
}

}  // namespace

TEST_CASE("opinfo: gradcheck on every differentiable float64 sample with finite values") {
  auto [checked, skipped] = for_each_differentiable_sample(
      [](const auto& f, const TensorList& leaves) { CHECK(gradcheck(f, leaves)); });
  MESSAGE(checked, " samples gradchecked, ", skipped, " skipped");
  CHECK(checked > 200);
}

TEST_CASE("opinfo: gradgradcheck on every differentiable float64 sample with finite values") {
  // Second derivatives through a backward that records (create_graph), for every op of the table.
  auto [checked, skipped] = for_each_differentiable_sample(
      [](const auto& f, const TensorList& leaves) { CHECK(gradgradcheck(f, leaves)); });
  MESSAGE(checked, " samples gradgradchecked, ", skipped, " skipped");
  CHECK(checked > 200);
}

TEST_CASE("opinfo: random op programs run, and the smooth ones pass gradcheck and gradgradcheck") {
  std::mt19937_64 rng(7);
  size_t checked = 0;
  for (int i = 0; i < 100; ++i) {
    Program p = random_program(rng);
    INFO("program ", i, ": ", p.desc, ": ", p.expr);
    RunResult r = run_case(p.fn, p.inputs, std::vector<bool>(p.inputs.size(), true), static_cast<uint64_t>(i));
    CHECK_MESSAGE(!r.threw, r.error);
    CHECK_MESSAGE(r.backward_error.empty(), r.backward_error);
    if (r.threw || !p.smooth) continue;  // relu, abs, clamp, max, maximum, minimum: kinks and ties
    const Tensor& out = r.outputs.at(0);
    // Long chains of exp and pow can overflow or grow steep enough that central differences
    // lose their accuracy; those programs are compared with PyTorch only (opinfo_parity).
    if (!all_finite(out) || max_abs(out) > 1e3) continue;
    std::vector<size_t> pos(p.inputs.size());
    for (size_t k = 0; k < pos.size(); ++k) pos[k] = k;
    GradcheckOptions opt;
    opt.atol = 1e-4;
    try {
      CHECK(gradcheck([&p](const TensorList& xs) { return p.fn(xs).at(0); }, gradcheck_leaves(p.inputs, pos), opt));
      CHECK(gradgradcheck([&p](const TensorList& xs) { return p.fn(xs).at(0); }, gradcheck_leaves(p.inputs, pos), opt));
    } catch (const std::exception& e) {
      FAIL_CHECK(e.what());
    }
    ++checked;
  }
  MESSAGE(checked, " random programs gradchecked");
}
