// `tapestry train --config-file FILE`: a TOML file of `flag = value` lines turned into arguments.
#pragma once
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace tapestry {

// CLI11 2.1 reads config files for the main app only, so train's --config-file is turned into
// `--key value` arguments here (TOML through CLI11's own reader), to be placed before the
// command line's. Keys are train's flag names: with `train` given, an unknown key is an error and
// a flag's value is passed as `--flag=value`. A missing file, a section or a key naming another
// config file throw a tapestry::Error naming the file.
std::vector<std::string> config_file_args(const std::string& path, const CLI::App* train = nullptr);

}  // namespace tapestry
