// One table per task: each option once, with its flag, the field it sets, its help, the values
// it takes and its role. `tapestry train` binds its flags from the tables (tools/train.cpp), a run
// writes its config.toml from its task's table and reads it back through the same flags, and
// resume compares the rows marked as recipe. Adding an option to a task is a field and a row.
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace tapestry::apps {

struct OptionRow {
  using Field = std::variant<int64_t*, uint64_t*, double*, std::string*, bool*>;
  std::string flag;  // without the dashes: "max-tokens"
  Field field;
  std::string help;

  // The values it takes. Numbers: within [min, max] (an end open when *_open). Text: one of
  // `choices` when given, and what `validate` accepts (it returns the problem, or ""). A bool
  // with two choices takes a value (`--norm pre`: choices {off, on}); without, it is a switch
  // (`--resume`) that sets the field, or clears it when `clears` (`--no-progress`).
  double min = -INFINITY, max = INFINITY;
  bool min_open = false, max_open = false;
  std::vector<std::string> choices;
  std::function<std::string(const std::string&)> validate;
  bool clears = false;

  // Its role. saved: written to config.toml (false for what concerns one invocation: --resume,
  // --step-log). recipe_key: resume refuses a checkpoint that recorded another value under it.
  bool saved = true;
  std::string recipe_key;

  // Builders, for one-line rows.
  OptionRow& positive() { return min = 1, min_open = false, *this; }   // integers >= 1, reals > 0 with above(0)
  OptionRow& at_least(double lo) { return min = lo, min_open = false, *this; }
  OptionRow& above(double lo) { return min = lo, min_open = true, *this; }
  OptionRow& below(double hi) { return max = hi, max_open = true, *this; }
  OptionRow& one_of(std::vector<std::string> names) { return choices = std::move(names), *this; }
  OptionRow& check(std::function<std::string(const std::string&)> f) { return validate = std::move(f), *this; }
  OptionRow& this_run_only() { return saved = false, *this; }
  OptionRow& recipe(std::string key = "");  // key: the flag with '_' for '-' unless given

  bool takes_value() const;  // false for a switch
  // The field's value as text: numbers as written to TOML ("0.1", "1.0"), text as is, a bool as
  // its choice name or true/false.
  std::string text() const;
  // Sets the field from the command line's or config file's text, checked; throws a
  // tapestry::Error "train: --flag: must be ..., got '...'".
  void set(const std::string& value);
  // Throws as set() does when the field's current value is not one the row takes.
  void check_value() const;
};

// A table is bound to the options it was built from (its rows hold pointers to their fields):
// build it from the options it is to read or set, and use it while they live.
class OptionTable {
 public:
  explicit OptionTable(std::string task) : task_(std::move(task)) {}
  const std::string& task() const { return task_; }

  template <class T> OptionRow& add(std::string flag, T& field, std::string help) {
    OptionRow& row = rows_.emplace_back();
    row.flag = std::move(flag), row.field = &field, row.help = std::move(help);
    return row;
  }
  // A row of `from` (a task taking one of the Trainer's), or those named, in that order.
  OptionRow& take(const OptionTable& from, const std::string& flag);
  void take_all(const OptionTable& from, const std::vector<std::string>& flags);
  // A check across rows (--min-lr against --lr): returns the problem, or "". check() runs it
  // after the rows' own.
  void add_check(std::function<std::string()> check) { checks_.push_back(std::move(check)); }

  const std::vector<OptionRow>& rows() const { return rows_; }
  OptionRow* find(const std::string& flag);  // null when the task has no such option
  OptionRow& row(const std::string& flag);   // throws when absent

  // Every field's value is one its row takes (what a library caller set is checked as a flag is),
  // then the checks across rows; throws a tapestry::Error naming the flag.
  void check() const;
  // The saved rows as `flag = value` lines, after `task = "..."`, readable by --config-file.
  // Throws when a text value cannot be written as TOML (CLI11's reader unescapes nothing).
  std::string to_toml() const;
  // The recipe rows' values by recipe key (bools as "1"/"0").
  std::map<std::string, std::string> recipe() const;

 private:
  std::string task_;
  std::vector<OptionRow> rows_;
  std::vector<std::function<std::string()>> checks_;
};

// The problem with a device name ("" when it is usable here): cpu, emulated (the test device),
// cuda or cuda:N where this build has the CUDA backend and the machine that GPU.
std::string device_problem(const std::string& device);

// "a, b or c": the choices as an option's error lists them.
std::string names_text(const std::vector<std::string>& names);

}  // namespace tapestry::apps
