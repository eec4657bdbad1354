// libFuzzer target: the `train --config-file` reader, config_file_args (tools/config_file.h),
// which turns a TOML file of `flag = value` lines into command-line arguments.
// The bytes are written to a file and read. Today's reader (tools/config_file.cpp, shared with the command line)
// throws tapestry::Error for everything it refuses: a missing file, an unknown key, a key in a
// section, a nested config-file, and CLI11's own file errors, which it catches (CLI::Error) and
// rethrows as tapestry::Error. So tapestry::Error is the one expected exception; any other
// exception, a crash or a sanitizer report is a bug and is left to libFuzzer.
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "tapestry/ops/error.h"
#include "tools/config_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tapestry_fuzz::ScratchFile file("config", ".toml");
  file.write(data, size);

  using namespace tapestry;  // the header may declare it at global scope or inside namespace tapestry
  std::vector<std::string> args;
  try {
    args = config_file_args(file.path());  // no App: every key is accepted, as `--key value`
  } catch (const tapestry::Error&) {
    return 0;  // refused with a message: the expected outcome for a bad file
  }
  // Every key becomes an argument that starts with "--" (`--key` then a value, or `--flag=value`).
  if (!args.empty() && args[0].rfind("--", 0) != 0)
    tapestry_fuzz::fail("fuzz_config", "the first argument '" + args[0] + "' is not a flag");
  size_t bytes = 0;
  for (const auto& a : args) bytes += a.size();
  volatile size_t sink = bytes;
  (void)sink;
  return 0;
}
