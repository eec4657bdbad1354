// Small helpers shared by the test files (with tests/layouts.h, which needs no doctest).
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "tapestry/tapestry.h"
#include "tests/layouts.h"

namespace tapestry::testing {

// Values of t as doubles, row-major.
inline std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

inline void check_values(const Tensor& t, const std::vector<double>& expected, double tol = 1e-6) {
  std::vector<double> got = values(t);
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element ", i, " of ", to_string(t));
    CHECK(got[i] == doctest::Approx(expected[i]).epsilon(tol));
  }
}

// The largest |a - b| / (1 + |b|); infinity on a NaN or a shape mismatch.
inline double max_diff(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes()) return std::numeric_limits<double>::infinity();
  std::vector<double> x = values(a), y = values(b);
  double d = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double e = std::fabs(x[i] - y[i]) / (1.0 + std::fabs(y[i]));
    if (std::isnan(e)) return std::numeric_limits<double>::infinity();
    d = std::max(d, e);
  }
  return d;
}

// Takes `steps` AdamW steps (lr 3e-3) on the loss `loss_of` computes over `params`; returns the
// first and the last loss (the small-data "loss falls" tests).
template <class F> std::pair<double, double> first_and_last_loss(const std::vector<Tensor>& params, F&& loss_of, int steps) {
  optim::AdamWOptions ao;
  ao.lr = 3e-3;
  optim::AdamW opt(params, ao);
  double first = 0, last = 0;
  for (int step = 0; step < steps; ++step) {
    Tensor loss = loss_of();
    if (step == 0) first = loss.item<double>();
    last = loss.item<double>();
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  return {first, last};
}

// Whether `text` holds `part` (error messages are checked by their telling part).
inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Runs f and returns the message of the tapestry::Error it throws ("" if none).
template <class F> std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace tapestry::testing
