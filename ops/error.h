// tapestry::Error and the TP_CHECK macro: every user-facing failure throws an Error whose
// message names the op and the offending shapes or values. Nothing in the library aborts.
#pragma once
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <stdexcept>
#include <string>

namespace tapestry {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace tapestry

// TP_CHECK(cond, "op: fmt {}", args...): throw tapestry::Error with the formatted message.
#define TP_CHECK(cond, ...)                                   \
  do {                                                        \
    if (!(cond)) throw ::tapestry::Error(fmt::format(__VA_ARGS__)); \
  } while (0)
