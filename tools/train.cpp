// `tapestry train --task NAME`: the tasks come from the registry (apps/tasks/task.h), and each
// task's flags from its option table (apps/train/option_table.h). A flag is registered once for
// all the tasks that have it; after parsing, the given ones are applied to the chosen task's
// table, which checks them, and a flag the task lacks is refused by name. The help shows each
// task's default. This file names no task.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <set>

#include "apps/tasks/task.h"
#include "tapestry/tapestry.h"
#include "tools/cli.h"
#include "tools/config_file.h"

namespace tapestry::tools {

namespace {

// Each task's options live here for the whole invocation: the tables' rows point into them.
struct TrainFlags {
  TrainFlags() = default;
  TrainFlags(const TrainFlags&) = delete;
  TrainFlags& operator=(const TrainFlags&) = delete;
  std::string config_file, task;
  bool quick = false, print_config = false;
  const CLI::App* train = nullptr;  // the subcommand, for reading the config file's keys again
  std::vector<std::pair<const apps::Task*, std::unique_ptr<apps::TaskOptions>>> tasks;  // in the registry's order
  // What the command line (and config file) gave, by flag: values as text, switches as bools.
  std::map<std::string, CLI::Option*> options;
  std::map<std::string, std::string> values;
  std::map<std::string, bool> switches;

  std::pair<const apps::Task*, apps::TaskOptions*> chosen() const {
    for (const auto& [task, options] : tasks)
      if (task->name == this->task) return {task, options.get()};
    throw Error(fmt::format("train: no task '{}'", this->task));  // CLI11 checked --task against the names
  }
  std::vector<std::string> names(bool with_quick_only = false) const {
    std::vector<std::string> out;
    for (const auto& [task, options] : tasks)
      if (!with_quick_only || !task->quick.empty()) out.push_back(task->name);
    return out;
  }
};

// Every value of the config file goes through the task's table, also one a flag overrides (issue
// 44: `epochs = "many"` passed beside --epochs 1): the command line's values are set after these.
// A key given more than once (a TOML array, `lr = [1, 2]`) is refused: each option takes one value.
void check_config_file(TrainFlags& f, apps::OptionTable& table) {
  const std::vector<std::string> args = config_file_args(f.config_file, f.train);
  std::map<std::string, int> seen;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i].substr(2), value;
    const size_t eq = flag.find('=');
    if (eq != std::string::npos) value = flag.substr(eq + 1), flag = flag.substr(0, eq);  // a switch's --flag=value
    else if (i + 1 < args.size()) value = args[++i];
    TP_CHECK(++seen[flag] == 1, "--config-file {}: '{}' has more than one value; it takes one", f.config_file, flag);
    if (flag == "task" || flag == "quick" || flag == "print-config") continue;  // train's own, checked by CLI11
    apps::OptionRow* row = table.find(flag);
    TP_CHECK(row != nullptr, "--config-file {}: '{}' is not an option of --task {}", f.config_file, flag, f.task);
    try {
      row->set(value);
    } catch (const Error& e) {
      throw Error(fmt::format("--config-file {}: {}", f.config_file, e.what()));
    }
  }
}

int run_train(TrainFlags& f) {
  const auto [task, options] = f.chosen();
  TP_CHECK(!f.quick || !task->quick.empty(), "train: --quick is a recipe of --task {}",
           apps::names_text(f.names(true)));
  // The quick recipe changes the defaults only: flags and a config file still win.
  if (f.quick) options->use_quick_recipe();
  apps::OptionTable& table = options->table();
  if (!f.config_file.empty()) check_config_file(f, table);
  for (const auto& [flag, option] : f.options) {
    if (option->count() == 0) continue;
    apps::OptionRow* row = table.find(flag);
    TP_CHECK(row != nullptr, "train: --{} is not an option of --task {}", flag, f.task);
    row->set(row->takes_value() ? f.values.at(flag) : (f.switches.at(flag) ? "true" : "false"));
  }
  if (f.print_config) {
    std::printf("%s", options->config_toml().c_str());
    return 0;
  }
  return options->run();
}

// "(copy 80, lm 32)": each task's default, or one "(default 0.1)" when they agree.
std::string defaults_text(const std::vector<std::pair<std::string, const apps::OptionRow*>>& rows) {
  std::set<std::string> values;
  for (const auto& [task, row] : rows) values.insert(row->text());
  if (values.size() == 1) return values.begin()->empty() ? "" : " (default " + *values.begin() + ")";
  std::string s;
  for (const auto& [task, row] : rows) s += (s.empty() ? " (" : ", ") + task + " " + (row->text().empty() ? "\"\"" : row->text());
  return s + ")";
}

// What the help shows a flag takes: INT, NUMBER, TEXT or its choices ({stop,skip}).
std::string value_kind(const apps::OptionRow& row) {
  if (!row.choices.empty()) {
    std::string s;
    for (const std::string& c : row.choices) s += (s.empty() ? "{" : ",") + c;
    return s + "}";
  }
  if (std::holds_alternative<double*>(row.field)) return "NUMBER";
  if (std::holds_alternative<std::string*>(row.field)) return "TEXT";
  return "INT";
}

}  // namespace

Subcommand add_train(CLI::App& app) {
  auto f = std::make_shared<TrainFlags>();
  auto* train = app.add_subcommand("train", "train a model");
  f->train = train;
  for (const apps::Task& task : apps::tasks()) f->tasks.emplace_back(&task, task.make());
  const std::vector<std::string> names = f->names();
  f->task = names.front();
  // Repeated flags take the last value: a config file's options go first, so the command line wins.
  train->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  train->add_option("--config-file", f->config_file,
                    "read options from a TOML file of `flag = value` lines (a run's config.toml); flags override it");
  std::string task_help, quick_help;  // "copy (...), multi30k (...) or classify (...)"; "multi30k: ..."
  for (size_t i = 0; i < f->tasks.size(); ++i) {
    const apps::Task& task = *f->tasks[i].first;
    task_help += (i == 0 ? "" : i + 1 == f->tasks.size() ? " or " : ", ") + task.name + " (" + task.summary + ")";
    if (!task.quick.empty()) quick_help += (quick_help.empty() ? "" : "; ") + task.name + ": " + task.quick;
  }
  train->add_option("--task", f->task, task_help)->check(CLI::IsMember(names))->capture_default_str();
  if (!quick_help.empty()) train->add_flag("--quick", f->quick, quick_help);
  train->add_flag("--print-config", f->print_config, "print the options as TOML and exit");

  // Each flag once, in the order the tasks list them, with the tasks that take it.
  std::vector<std::string> order;
  std::map<std::string, std::vector<std::pair<std::string, const apps::OptionRow*>>> by_flag;
  for (const auto& [task, options] : f->tasks)
    for (const apps::OptionRow& row : options->table().rows()) {
      if (by_flag[row.flag].empty()) order.push_back(row.flag);
      by_flag[row.flag].emplace_back(task->name, &row);
    }
  std::map<std::string, CLI::Option_group*> groups;  // by the tasks that take a flag, when not all
  for (const std::string& flag : order) {
    const auto& rows = by_flag.at(flag);
    // The help once, or per task where it differs: "copy, multi30k: Noam warmup steps; lm: ...".
    std::string tasks;
    std::vector<std::pair<std::string, std::string>> helps;  // (tasks, help), in order
    for (const auto& [task, row] : rows) {
      tasks += (tasks.empty() ? "" : ", ") + task;
      auto same = std::find_if(helps.begin(), helps.end(), [&](const auto& h) { return h.second == row->help; });
      if (same == helps.end()) helps.emplace_back(task, row->help);
      else same->first += ", " + task;
    }
    std::string help = helps.size() == 1 ? helps[0].second : "";
    for (size_t i = 0; helps.size() > 1 && i < helps.size(); ++i)
      help += (i ? "; " : "") + helps[i].first + ": " + helps[i].second;
    CLI::App* where = train;
    if (rows.size() < f->tasks.size()) {
      auto& group = groups[tasks];
      if (!group) group = train->add_option_group("only " + tasks);
      where = group;
    }
    const apps::OptionRow& first = *rows.front().second;
    for (const auto& [task, row] : rows)  // one CLI option serves them all: it is a value or a switch for each
      TP_CHECK(row->takes_value() == first.takes_value(), "train: --{} takes a value in one task, not in {}", flag, task);
    const bool same_kind = std::all_of(rows.begin(), rows.end(), [&](const auto& r) { return value_kind(*r.second) == value_kind(first); });
    if (!same_kind)  // "model size (multi30k {tiny,...}, lm {tiny,mini,...})"
      for (size_t i = 0; i < rows.size(); ++i)
        help += (i ? ", " : " (") + rows[i].first + " " + value_kind(*rows[i].second) + (i + 1 == rows.size() ? ")" : "");
    if (first.takes_value()) {
      f->options[flag] = where->add_option("--" + flag, f->values[flag], help + defaults_text(rows))
                             ->type_name(same_kind ? value_kind(first) : "TEXT");
    } else {
      f->options[flag] = where->add_flag("--" + flag, f->switches[flag], help);
    }
  }
  return {train, [f] { return run_train(*f); }};
}

}  // namespace tapestry::tools
