// Data parallelism across processes: the one place that talks to MPI. Built with
// -DTAPESTRY_MPI=ON and started under `mpirun -np N`, every process is one rank of N; otherwise
// (no MPI built, or MPI built but started without mpirun) there is one rank, and every call
// below is a no-op or the identity, so code written against this module runs unchanged on one
// process. No other file calls MPI.
//
// What data-parallel training needs (apps/train/trainer.cpp uses it so):
//   - the same starting weights everywhere: broadcast_ each parameter from rank 0;
//   - each rank's own shard of each global batch (the application's data source cuts it);
//   - the sum of the ranks' gradients: GradReducer, which packs gradients into buckets (PyTorch
//     DDP's reducer and Horovod's tensor fusion) and all-reduces each bucket in place.
// Errors of MPI calls become tapestry::Error naming the call; a rank that dies ends the job
// (mpirun stops the others) instead of leaving them waiting.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tapestry/ops/tensor.h"

namespace tapestry::dist {

// Starts MPI when this build has it and the process was started by mpirun (OpenMPI's or a PMI
// launcher's environment); call it first thing in main. Safe to call more than once.
void init(int* argc, char*** argv);
// Ends MPI (after a barrier) if init started it. Call before returning from main.
void finalize();
// Ends every rank of the job at once (MPI_Abort) with `code`; a single process just exits.
[[noreturn]] void abort(int code);

bool built_with_mpi();  // this library was built with -DTAPESTRY_MPI=ON
int rank();             // 0 .. world_size() - 1
int world_size();       // 1 without MPI
inline bool is_main() { return rank() == 0; }

enum class ReduceOp { Sum, Max, Min };

// In place over the ranks: t becomes the elementwise reduction of every rank's t. t must be a
// contiguous float32, float64 or int64 tensor of the same shape on every rank.
void allreduce_(Tensor& t, ReduceOp op = ReduceOp::Sum);
double allreduce(double value, ReduceOp op = ReduceOp::Sum);
int64_t allreduce(int64_t value, ReduceOp op = ReduceOp::Sum);
// t takes root's values (same shape and dtype on every rank; contiguous).
void broadcast_(Tensor& t, int root = 0);
void broadcast_(std::string& s, int root = 0);
void barrier();

// Sums the gradients of `params` over the ranks. Gradients are packed, in reverse parameter
// order (the order the backward finishes them), into buckets of at most bucket_bytes (the first
// one at most first_bucket_bytes, so that it is ready early); each bucket is one all-reduce.
// A parameter without a gradient on a rank counts as zeros there (and gets one everywhere).
class GradReducer {
 public:
  explicit GradReducer(std::vector<Tensor> params, size_t bucket_bytes = size_t(25) << 20,
                       size_t first_bucket_bytes = size_t(1) << 20);
  // Sum every gradient over the ranks, then multiply by `scale`. A no-op on one rank.
  void reduce(double scale = 1.0);
  size_t buckets() const { return buckets_.size(); }
  double seconds() const { return seconds_; }  // total wall time spent in reduce()
  int64_t bytes() const { return bytes_; }      // gradient bytes all-reduced per call

 private:
  struct Bucket {
    std::vector<size_t> params;  // indices into params_
    int64_t numel = 0;
    DType dtype = DType::Float32;
    Tensor flat;
  };
  std::vector<Tensor> params_;
  std::vector<Bucket> buckets_;
  double seconds_ = 0;
  int64_t bytes_ = 0;
};

}  // namespace tapestry::dist
