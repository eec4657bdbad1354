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
  bool profile = false;  // per-op times of the train step
  bool peak = false;     // only measure the FMA peak
  bool layouts = false;  // only time x W^T from both weight layouts (see bench.cpp)
  std::string device = "cpu";  // cpu, cuda or cuda:N
  std::string attention = "auto";  // the GPU's attention kernel: auto, gemm or tiled
  std::string precision = "fp32";  // the Trainer's --precision
  bool tf32 = false;               // the Trainer's --tf32: float32 matmuls on a GPU through TF32
  bool checkpoint_activations = false;  // the Trainer's --checkpoint-activations
};

int run_bench(const BenchOptions& options);
// The measured FMA peak (tools/peak.cpp).
double peak_gflops(int threads, const char** isa);

}  // namespace tapestry::tools
