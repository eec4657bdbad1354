// The `tapestry` command line: main.cpp parses and dispatches; each subcommand lives in its own
// file (train.cpp, bench.cpp, bleu.cpp, translate.cpp, attention.cpp) as one add_* function that
// registers its flags on the app and returns what runs it once the flags are parsed.
#pragma once
#include <CLI/CLI.hpp>
#include <cmath>
#include <functional>

namespace tapestry::tools {

// A registered subcommand and what runs it once parsed (returning the process's exit status).
struct Subcommand {
  CLI::App* app;
  std::function<int()> run;
};

Subcommand add_train(CLI::App& app);
Subcommand add_bench(CLI::App& app);
Subcommand add_bleu(CLI::App& app);
Subcommand add_translate(CLI::App& app);
Subcommand add_attention(CLI::App& app);
Subcommand add_generate(CLI::App& app);
Subcommand add_classify(CLI::App& app);
Subcommand add_image_attention(CLI::App& app);

// A positive integer flag (CLI11's PositiveNumber prints the whole range of a double).
const CLI::Validator& positive();
// A real-valued flag: finite, above lo (or at it unless lo_strict), below hi. CLI11's range
// checks let "nan" through (every comparison with NaN is false).
CLI::Validator real_flag(double lo, bool lo_strict, double hi = INFINITY);
// A --device flag: cpu, cuda or cuda:N, and a GPU only where this build has the CUDA backend and
// the machine has that GPU (otherwise one line saying which is missing).
const CLI::Validator& device_flag();

}  // namespace tapestry::tools
