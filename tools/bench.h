// `tapestry bench`: named workloads timed the same way as tools/reference/bench_torch.py.
#pragma once
#include <string>

namespace tapestry::tools {

struct BenchOptions {
  std::string workload = "small";
  int threads = 0;     // 0: all cores
  int steps = 10;      // timed train steps (after warm-up)
  int warmup = 3;
  bool json = false;
  bool profile = false;  // per-op times of one train step
};

int run_bench(const BenchOptions& options);

}  // namespace tapestry::tools
