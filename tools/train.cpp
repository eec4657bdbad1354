// `tapestry train --task copy|multi30k|lm|image|mlm|classify`: each task's flags come from its option table
// (apps/train/option_table.h). A flag is registered once for all the tasks that have it; after
// parsing, the given ones are applied to the chosen task's table, which checks them, and a flag
// the task lacks is refused by name. The help shows each task's default.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <set>

#include "apps/tasks/copy_task.h"
#include "apps/tasks/image_classification.h"
#include "apps/tasks/language_model.h"
#include "apps/tasks/text_classification.h"
#include "apps/tasks/translation.h"
#include "tapestry/tapestry.h"
#include "tools/cli.h"
#include "tools/config_file.h"

namespace tapestry::tools {

namespace {

const std::vector<const char*> kTasks = {"copy", "multi30k", "lm", "image", "mlm", "classify"};

// The tables' rows point into copy, mt, lm, image, mlm and cls: TrainFlags stays where it was made (a shared_ptr).
struct TrainFlags {
  TrainFlags() = default;
  TrainFlags(const TrainFlags&) = delete;
  TrainFlags& operator=(const TrainFlags&) = delete;
  std::string config_file, task = "copy";
  bool quick = false, print_config = false;
  const CLI::App* train = nullptr;  // the subcommand, for reading the config file's keys again
  apps::CopyTaskOptions copy;
  apps::TranslationOptions mt;
  apps::LMOptions lm;
  apps::ImageOptions image;
  apps::TextOptions mlm = apps::default_mlm_options(), cls = apps::default_classify_options();
  std::map<std::string, apps::OptionTable> tables;  // by task, bound to the options above
  // What the command line (and config file) gave, by flag: values as text, switches as bools.
  std::map<std::string, CLI::Option*> options;
  std::map<std::string, std::string> values;
  std::map<std::string, bool> switches;
};

int run_copy(const apps::CopyTaskOptions& o) {
  std::printf("copy task: vocab %lld, length %lld, batch %lld, d_model %lld, %lld+%lld %s-norm layers, %lld heads, "
              "d_ff %lld, Noam warmup %lld\n",
              (long long)o.vocab, (long long)o.seq_len, (long long)o.batch, (long long)o.d_model, (long long)o.layers,
              (long long)o.layers, o.pre_norm ? "pre" : "post", (long long)o.heads, (long long)o.d_ff,
              (long long)o.warmup);
  std::fflush(stdout);
  auto r = apps::train_copy_task(o);
  if (r.solved) {
    std::printf("solved: every held-out sequence copied exactly after %lld steps\n", (long long)r.steps);
    return 0;
  }
  std::printf("not solved after %lld steps: %.1f%% exact copies\n", (long long)r.steps, 100 * r.accuracy);
  return 1;
}

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
  TP_CHECK(!f.quick || f.task == "multi30k", "train: --quick is a recipe of --task multi30k");
  // The quick recipe changes the defaults only: flags and a config file still win.
  if (f.quick) f.mt = apps::quick_translation_options();  // the table's rows still point at f.mt's fields
  apps::OptionTable& table = f.tables.at(f.task);
  if (!f.config_file.empty()) check_config_file(f, table);
  for (const auto& [flag, option] : f.options) {
    if (option->count() == 0) continue;
    apps::OptionRow* row = table.find(flag);
    TP_CHECK(row != nullptr, "train: --{} is not an option of --task {}", flag, f.task);
    row->set(row->takes_value() ? f.values.at(flag) : (f.switches.at(flag) ? "true" : "false"));
  }
  if (f.print_config) {
    std::printf("%s", f.task == "multi30k" ? apps::options_to_toml(f.mt).c_str()
                      : f.task == "lm"     ? apps::options_to_toml(f.lm).c_str()
                                           : table.to_toml().c_str());
    return 0;
  }
  if (f.task == "copy") return run_copy(f.copy);
  const int interrupted = f.task == "lm"      ? apps::train_language_model(f.lm).interrupted
                          : f.task == "image" ? apps::train_image_classifier(f.image).interrupted
                          : f.task == "mlm"   ? apps::train_mlm(f.mlm).interrupted
                          : f.task == "classify" ? apps::train_text_classifier(f.cls).interrupted
                                                 : apps::train_translation(f.mt).interrupted;
  return interrupted ? 128 + interrupted : 0;
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
  // Repeated flags take the last value: a config file's options go first, so the command line wins.
  train->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  train->add_option("--config-file", f->config_file,
                    "read options from a TOML file of `flag = value` lines (a run's config.toml); flags override it");
  train->add_option("--task", f->task,
                    "copy (the Annotated Transformer's copy task), multi30k (German to English), lm (a GPT "
                    "language model on any text), image (a Vision Transformer on MNIST-layout images), mlm (masked-LM "
                    "pre-training of the text encoder on the mail corpus) or classify (ham/spam)")
      ->check(CLI::IsMember(std::vector<std::string>(kTasks.begin(), kTasks.end())))
      ->capture_default_str();
  train->add_flag("--quick", f->quick, "multi30k: the quick recipe, which shows learning in minutes (docs/training.md)");
  train->add_flag("--print-config", f->print_config, "print the options as TOML and exit");
  f->tables.emplace("copy", apps::options_table(f->copy));
  f->tables.emplace("multi30k", apps::options_table(f->mt));
  f->tables.emplace("lm", apps::options_table(f->lm));
  f->tables.emplace("image", apps::options_table(f->image));
  f->tables.emplace("mlm", apps::mlm_options_table(f->mlm));
  f->tables.emplace("classify", apps::classify_options_table(f->cls));

  // Each flag once, in the order the tasks list them, with the tasks that take it.
  std::vector<std::string> order;
  std::map<std::string, std::vector<std::pair<std::string, const apps::OptionRow*>>> by_flag;
  for (const char* task : kTasks)
    for (const apps::OptionRow& row : f->tables.at(task).rows()) {
      if (by_flag[row.flag].empty()) order.push_back(row.flag);
      by_flag[row.flag].emplace_back(task, &row);
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
    if (rows.size() < kTasks.size()) {
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
