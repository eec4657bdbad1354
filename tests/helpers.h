// Small helpers shared by the test files.
#pragma once
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "tapestry/tapestry.h"

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
