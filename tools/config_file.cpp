// The config-file reader (see config_file.h).
#include "tools/config_file.h"

#include <CLI/CLI.hpp>
#include <filesystem>

#include "tapestry/ops/error.h"

namespace tapestry {

std::vector<std::string> config_file_args(const std::string& path, const CLI::App* train) {
  TP_CHECK(std::filesystem::is_regular_file(path), "--config-file {}: not a file", path);
  std::vector<CLI::ConfigItem> items;
  try {
    items = CLI::ConfigTOML().from_file(path);
  } catch (const CLI::Error& e) {
    throw Error(fmt::format("--config-file {}: {}", path, e.what()));
  }
  std::vector<std::string> args;
  for (const auto& item : items) {
    if (item.name == "++" || item.name == "--") continue;  // section markers
    TP_CHECK(item.parents.empty(), "--config-file {}: '{}' is in a section; write `key = value` at the top level",
             path, item.fullname());
    TP_CHECK(item.name != "config-file", "--config-file {}: a config file cannot name another", path);
    const CLI::Option* option = train ? train->get_option_no_throw("--" + item.name) : nullptr;
    TP_CHECK(!train || option != nullptr,
             "--config-file {}: unknown option '{}' (the keys are the flag names of `tapestry train --help`)", path,
             item.name);
    for (const auto& value : item.inputs) {
      if (option && option->get_expected_max() == 0) {  // a flag: only the `--flag=value` form carries a value
        args.push_back("--" + item.name + "=" + value);
      } else {  // two arguments, so an empty value stays a value
        args.push_back("--" + item.name);
        args.push_back(value);
      }
    }
  }
  return args;
}


}  // namespace tapestry
