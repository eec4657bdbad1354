// The registry of training tasks (`tapestry train --task NAME`). A task is one file: it defines
// its options, their table, and its run, and gives them to make_task; one line in
// apps/tasks/registry.cpp lists it (or, for a program's own task, one register_task call).
// tools/train.cpp builds the flags, the help, --print-config and the dispatch from the registry
// and names no task.
#pragma once
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "apps/train/option_table.h"

namespace tapestry::apps {

// One invocation's options of a task, with its table bound to them (the table's rows point into
// the options, which stay where they were made).
class TaskOptions {
 public:
  virtual ~TaskOptions() = default;
  virtual OptionTable& table() = 0;
  virtual void use_quick_recipe() = 0;    // --quick: the quick recipe's defaults (flags still win)
  virtual std::string config_toml() = 0;  // --print-config: the config.toml a run writes
  virtual int run() = 0;                  // trains; the process's exit status
};

struct Task {
  std::string name;     // --task NAME
  std::string summary;  // --task's help: "NAME (SUMMARY)"
  std::string quick;    // --quick's help for this task; empty: it has no quick recipe
  std::function<std::unique_ptr<TaskOptions>()> make;
};

// A task from its parts. Options is the task's options struct: `defaults` makes its defaults,
// `table` binds its rows, `run` trains and returns the exit status (0, 1 when a task's goal was
// not met, 128 + a signal when one stopped it: exit_status).
template <class Options>
struct TaskSpec {
  std::string name, summary, quick;
  std::function<Options()> defaults = [] { return Options{}; };
  std::function<Options()> quick_defaults;           // with `quick`
  std::function<OptionTable(Options&)> table;
  std::function<std::string(const Options&)> toml;   // empty: the table's to_toml()
  std::function<int(const Options&)> run;
};

template <class Options>
Task make_task(TaskSpec<Options> spec) {
  class Bound : public TaskOptions {
   public:
    explicit Bound(const TaskSpec<Options>& s) : spec_(s), options_(s.defaults()), table_(s.table(options_)) {}
    OptionTable& table() override { return table_; }
    void use_quick_recipe() override { options_ = spec_.quick_defaults(); }  // the rows still point at options_
    std::string config_toml() override { return spec_.toml ? spec_.toml(options_) : table_.to_toml(); }
    int run() override { return spec_.run(options_); }

   private:
    TaskSpec<Options> spec_;
    Options options_;
    OptionTable table_;
  };
  Task task{spec.name, spec.summary, spec.quick, nullptr};
  task.make = [spec = std::move(spec)] { return std::unique_ptr<TaskOptions>(new Bound(spec)); };
  return task;
}

// The tasks, in the order the help lists them: the built-in ones (registry.cpp), then those
// register_task added.
const std::deque<Task>& tasks();  // a deque: adding a task moves none
// Adds a task; refuses a name already taken. Usable from a static initializer
// (`static const bool added = (register_task(my_task()), true);`).
void register_task(Task task);

// A run's exit status: 128 + the signal that stopped it, or 0.
inline int exit_status(int interrupted) { return interrupted ? 128 + interrupted : 0; }

}  // namespace tapestry::apps
