// Option tables (see option_table.h).
#include "apps/train/option_table.h"

#include <algorithm>
#include <cctype>

#include "tapestry/ops/cuda.h"
#include "tapestry/ops/dtype.h"
#include "tapestry/ops/error.h"

namespace tapestry::apps {

namespace {

template <class... F> struct Overloaded : F... {
  using F::operator()...;
};
template <class... F> Overloaded(F...) -> Overloaded<F...>;

std::string number_text(double v) {
  std::string s = fmt::format("{}", v);
  return s.find_first_of(".en") == std::string::npos ? s + ".0" : s;  // a TOML float has a point or exponent
}

// What a numeric row takes, as its error says it: "a positive integer", "a number in [0, 1)".
std::string range_text(const OptionRow& r, bool integer) {
  const bool lo = std::isfinite(r.min), hi = std::isfinite(r.max);
  if (integer && lo && !r.min_open && r.min == 1 && !hi) return "a positive integer";
  std::string kind = integer ? "an integer" : "a number";
  if (lo && hi)
    return fmt::format("{} in {}{}, {}{}", kind, r.min_open ? "(" : "[", r.min, r.max, r.max_open ? ")" : "]");
  if (lo) return fmt::format("{} {} {}", kind, r.min_open ? ">" : ">=", r.min);
  if (hi) return fmt::format("{} {} {}", kind, r.max_open ? "<" : "<=", r.max);
  return kind;
}

bool in_range(const OptionRow& r, double v) {
  return std::isfinite(v) && (r.min_open ? v > r.min : v >= r.min) && (r.max_open ? v < r.max : v <= r.max);
}

// Whole-string integer parses (std::stoll alone accepts "12abc").
template <class T> bool parse_integer(const std::string& s, T& out) {
  // Digits after an optional '-' (signed only): std::stoull skips spaces and wraps " -1" around.
  const size_t first = std::is_signed_v<T> && !s.empty() && s[0] == '-' ? 1 : 0;
  if (s.size() == first || !std::isdigit(static_cast<unsigned char>(s[first]))) return false;
  try {
    size_t used = 0;
    out = std::is_unsigned_v<T> ? static_cast<T>(std::stoull(s, &used)) : static_cast<T>(std::stoll(s, &used));
    return used == s.size();
  } catch (const std::exception&) {
    return false;
  }
}

bool parse_real(const std::string& s, double& out) {
  try {
    size_t used = 0;
    out = std::stod(s, &used);
    return used == s.size();
  } catch (const std::exception&) {
    return false;
  }
}

bool parse_bool(const std::string& s, bool& out) {
  if (s == "true" || s == "1") return out = true, true;
  if (s == "false" || s == "0") return out = false, true;
  return false;
}

// The problem with `value` for row `r` ("" when none), and the parsed value in `parsed`.
struct Parsed {
  std::variant<int64_t, uint64_t, double, std::string, bool> value;
  std::string problem;
};

Parsed parse(const OptionRow& r, const std::string& value) {
  Parsed p;
  auto fail = [&](const std::string& what) { p.problem = fmt::format("must be {}, got '{}'", what, value); };
  std::visit(Overloaded{
                 [&](int64_t*) {
                   int64_t v = 0;
                   if (!parse_integer(value, v) || !in_range(r, static_cast<double>(v))) return fail(range_text(r, true));
                   p.value = v;
                 },
                 [&](uint64_t*) {
                   uint64_t v = 0;
                   if (!parse_integer(value, v) || !in_range(r, static_cast<double>(v))) return fail(range_text(r, true));
                   p.value = v;
                 },
                 [&](double*) {
                   double v = 0;
                   if (!parse_real(value, v) || !in_range(r, v)) return fail(range_text(r, false));
                   p.value = v;
                 },
                 [&](std::string*) {
                   if (!r.choices.empty() && std::find(r.choices.begin(), r.choices.end(), value) == r.choices.end())
                     return fail(names_text(r.choices));
                   if (r.validate) p.problem = r.validate(value);
                   p.value = value;
                 },
                 [&](bool*) {
                   if (r.choices.size() == 2) {
                     if (value != r.choices[0] && value != r.choices[1]) return fail(names_text(r.choices));
                     p.value = value == r.choices[1];
                     return;
                   }
                   bool v = false;
                   if (!parse_bool(value, v)) return fail("true or false");
                   p.value = r.clears ? !v : v;
                 },
             },
             r.field);
  return p;
}

}  // namespace

std::string names_text(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) s += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return s;
}

OptionRow& OptionRow::recipe(std::string key) {
  if (key.empty()) {
    key = flag;
    std::replace(key.begin(), key.end(), '-', '_');
  }
  recipe_key = std::move(key);
  return *this;
}

bool OptionRow::takes_value() const { return !std::holds_alternative<bool*>(field) || choices.size() == 2; }

std::string OptionRow::text() const {
  return std::visit(Overloaded{
                        [](int64_t* v) { return std::to_string(*v); },
                        [](uint64_t* v) { return std::to_string(*v); },
                        [](double* v) { return number_text(*v); },
                        [](std::string* v) { return *v; },
                        [&](bool* v) -> std::string {
                          if (choices.size() == 2) return choices[*v ? 1 : 0];
                          return (*v != clears) ? "true" : "false";
                        },
                    },
                    field);
}

void OptionRow::set(const std::string& value) {
  Parsed p = parse(*this, value);
  TP_CHECK(p.problem.empty(), "train: --{}: {}", flag, p.problem);
  std::visit([&](auto* f) { *f = std::get<std::remove_pointer_t<decltype(f)>>(p.value); }, field);
}

void OptionRow::check_value() const {
  Parsed p = parse(*this, text());
  TP_CHECK(p.problem.empty(), "train: --{}: {}", flag, p.problem);
}

OptionRow& OptionTable::take(const OptionTable& from, const std::string& flag) {
  auto it = std::find_if(from.rows_.begin(), from.rows_.end(), [&](const OptionRow& r) { return r.flag == flag; });
  TP_CHECK(it != from.rows_.end(), "option table {}: no row --{}", from.task_, flag);
  rows_.push_back(*it);
  return rows_.back();
}

void OptionTable::take_all(const OptionTable& from, const std::vector<std::string>& flags) {
  for (const std::string& flag : flags) take(from, flag);
}

OptionRow* OptionTable::find(const std::string& flag) {
  auto it = std::find_if(rows_.begin(), rows_.end(), [&](const OptionRow& r) { return r.flag == flag; });
  return it == rows_.end() ? nullptr : &*it;
}

OptionRow& OptionTable::row(const std::string& flag) {
  OptionRow* r = find(flag);
  TP_CHECK(r != nullptr, "option table {}: no row --{}", task_, flag);
  return *r;
}

void OptionTable::check() const {
  for (const OptionRow& r : rows_) r.check_value();
  for (const auto& c : checks_)
    if (std::string problem = c(); !problem.empty()) throw Error("train: " + problem);
}

std::string OptionTable::to_toml() const {
  std::string t = "# tapestry train: read back with `tapestry train --config-file FILE`; flags override it\n";
  t += fmt::format("task = \"{}\"\n", task_);
  for (const OptionRow& r : rows_) {
    if (!r.saved) continue;
    const bool quoted = std::holds_alternative<std::string*>(r.field) || r.choices.size() == 2;
    const std::string value = r.text();
    // CLI11's TOML reader unescapes nothing and ends a value at '#': such text could not read back.
    TP_CHECK(!quoted || value.find_first_of("\"\\#\n") == std::string::npos,
             "train: --{} '{}' holds a quote, a backslash, '#' or a newline, which config.toml cannot hold", r.flag,
             value);
    t += fmt::format("{} = {}\n", r.flag, quoted ? "\"" + value + "\"" : value);
  }
  return t;
}

std::map<std::string, std::string> OptionTable::recipe() const {
  std::map<std::string, std::string> out;
  for (const OptionRow& r : rows_) {
    if (r.recipe_key.empty()) continue;
    out[r.recipe_key] = std::visit(Overloaded{
                                       [](double* v) { return fmt::format("{}", *v); },
                                       [&](bool* v) { return std::string(*v != r.clears ? "1" : "0"); },
                                       [&](auto*) { return r.text(); },
                                   },
                                   r.field);
  }
  return out;
}

std::string device_problem(const std::string& value) {
  try {
    const Device device = Device::parse(value);
    if (device.is_cpu() || device.is_emulated()) return "";  // emulated: tests (Note [Emulated device])
    if (!cuda::built()) return "'" + value + "': " + cuda::unavailable_reason();
    const int count = cuda::device_count();
    if (count == 0) return "'" + value + "': " + cuda::unavailable_reason();
    if (device.index >= count)
      return fmt::format("'{}': this machine has {} GPU(s) (cuda:0 to cuda:{})", value, count, count - 1);
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

}  // namespace tapestry::apps
