// `tapestry`: parses the command line and runs one subcommand. Bad flags print one clear line
// and exit non-zero; so does any error while a subcommand runs (never an abort).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tapestry/dist/dist.h"
#include "tapestry/tapestry.h"
#include "apps/train/option_table.h"
#include "tools/cli.h"
#include "tools/config_file.h"

using namespace tapestry;

namespace tapestry::tools {

const CLI::Validator& device_flag() {
  static const CLI::Validator v([](std::string& value) { return apps::device_problem(value); }, "DEVICE");
  return v;
}

const CLI::Validator& positive() {
  static const CLI::Validator v(
      [](std::string& value) {
        try {
          size_t used = 0;
          if (std::stoll(value, &used) > 0 && used == value.size()) return std::string();
        } catch (const std::exception&) {
        }
        return "must be a positive integer, got '" + value + "'";
      },
      "POSITIVE");
  return v;
}

CLI::Validator real_flag(double lo, bool lo_strict, double hi) {
  const std::string range =
      std::isinf(hi) ? fmt::format("{} {}", lo_strict ? ">" : ">=", lo) : fmt::format("in [{}, {})", lo, hi);
  return CLI::Validator(
      [=](std::string& value) {
        try {
          size_t used = 0;
          double v = std::stod(value, &used);
          if (used == value.size() && std::isfinite(v) && (lo_strict ? v > lo : v >= lo) && v < hi) return std::string();
        } catch (const std::exception&) {
        }
        return fmt::format("must be a number {}, got '{}'", range, value);
      },
      range);
}

}  // namespace tapestry::tools

namespace {

// One line for an error; under mpirun it names the rank, and the whole job ends with it (the
// other ranks would otherwise wait for this one in their next all-reduce).
int fail(const char* what) {
  if (dist::world_size() > 1) {
    std::fprintf(stderr, "tapestry (rank %d of %d): %s\n", dist::rank(), dist::world_size(), what);
    dist::abort(1);
  }
  std::fprintf(stderr, "tapestry: %s\n", what);
  return 1;
}

// Under mpirun: rank 0 alone prints; the other ranks' standard output goes nowhere (their errors
// still reach stderr).
void start_ranks(int* argc, char*** argv) {
  dist::init(argc, argv);
  if (dist::world_size() > 1 && !dist::is_main() && !std::freopen("/dev/null", "w", stdout))
    std::fprintf(stderr, "tapestry (rank %d): cannot silence standard output\n", dist::rank());
}

int run_main(int argc, char** argv);

// Note [sharing the cores]
// libgomp's threads spin at the end of every parallel region (300,000 turns by default) before
// they sleep. On a quiet machine that saves a wake-up per region; on a busy one a spinning thread
// holds a core that the thread it waits for, or another program, needs: beside a two-job compile
// on 2 cores the Multi30k recipe fell to an eighth of its quiet speed (a twelfth beside two busy
// loops). 30,000 turns kept 46% beside busy loops but only 31-48% beside a real compile; 3,000
// keep 55-59% there, and the quiet training step and decoding within the noise. libgomp reads its
// settings once, when it loads, so the command line starts itself again with a short spin limit
// (GOMP_SPINCOUNT, kSpinTurns) unless the user chose one (OMP_WAIT_POLICY or GOMP_SPINCOUNT).
// docs/benchmarks.md "Sharing the cores" has the measurements behind the value.
constexpr const char* kSpinTurns = "3000";

// Note [huge pages]
// A run's big tensors come from the heap (Note [Allocator], ops/tensor.cpp), which grows as batches
// of new shapes arrive, and each fresh 4 KiB page costs a fault, on a VM a slow one: decoding the
// Multi30k test set took about 19,600 of them. glibc can ask for transparent huge pages on its heap
// (the tunable glibc.malloc.hugetlb=1, glibc 2.35 and later; an older one ignores it), which
// cut that to about 3,600 faults and made greedy decoding at batch 64 7-15% faster and the
// `small` train step 3-9% (alternated pairs; docs/benchmarks.md). glibc reads it as the process
// starts, so it goes in with the restart below, unless the user set GLIBC_TUNABLES.
constexpr const char* kTunables = "glibc.malloc.hugetlb=1";

// The settings above, which their libraries read only as the process starts: set where the user
// chose none, then the command line starts itself again once.
void restart_with_load_time_settings(char** argv) {
  const bool spin = !std::getenv("OMP_WAIT_POLICY") && !std::getenv("GOMP_SPINCOUNT");
  const bool pages = !std::getenv("GLIBC_TUNABLES");
  if (!spin && !pages) return;
  if (spin && setenv("GOMP_SPINCOUNT", kSpinTurns, 1) != 0) return;
  if (pages && setenv("GLIBC_TUNABLES", kTunables, 1) != 0) return;
  execv("/proc/self/exe", argv);  // returns only on failure: then run on with the defaults
  if (spin) unsetenv("GOMP_SPINCOUNT");
  if (pages) unsetenv("GLIBC_TUNABLES");
}

}  // namespace

int main(int argc, char** argv) {
  restart_with_load_time_settings(argv);
  try {
    start_ranks(&argc, &argv);
  } catch (const Error& e) {
    return fail(e.what());
  }
  const int rc = run_main(argc, argv);
  dist::finalize();
  return rc;
}

namespace {

int run_main(int argc, char** argv) {
  CLI::App app{"tapestry: a C++ autograd engine and Transformer model zoo"};
  app.set_version_flag("--version", std::string("tapestry ") + kVersion);
  app.require_subcommand(0, 1);
  const std::vector<tools::Subcommand> commands = {tools::add_train(app), tools::add_bench(app), tools::add_bleu(app),
                                                  tools::add_translate(app), tools::add_attention(app),
                                                  tools::add_generate(app), tools::add_classify(app),
                                                  tools::add_image_attention(app)};

  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    app.parse(std::vector<std::string>(args.rbegin(), args.rend()));  // CLI11 takes the arguments reversed
    // A subcommand's --config-file: its `flag = value` lines go first, so the command line wins.
    for (const auto& [sub, run] : commands) {
      const CLI::Option* file = sub->get_option_no_throw("--config-file");
      if (!*sub || !file || file->count() == 0) continue;
      auto from_file = config_file_args(file->as<std::string>(), sub);
      args.insert(std::find(args.begin(), args.end(), sub->get_name()) + 1, from_file.begin(), from_file.end());
      app.parse(std::vector<std::string>(args.rbegin(), args.rend()));
    }
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    if (rc != 0 && dist::world_size() > 1) dist::abort(rc);
    return rc;
  } catch (const Error& e) {
    return fail(e.what());
  }
  try {
    for (const auto& [sub, run] : commands)
      if (*sub) return run();
    std::printf("%s", app.help().c_str());
    return 0;
  } catch (const Error& e) {
    return fail(e.what());
  } catch (const std::bad_alloc&) {
    return fail("out of memory");
  } catch (const std::exception& e) {  // a library's own exception: still one line, never an abort
    return fail(e.what());
  }
}

}  // namespace
