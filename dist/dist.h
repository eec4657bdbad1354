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
#include <memory>
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

bool built_with_mpi();   // this library was built with -DTAPESTRY_MPI=ON
bool built_with_nccl();  // ... and with -DTAPESTRY_CUDA=ON and NCCL found: GPU tensors go through NCCL
int rank();              // 0 .. world_size() - 1
int world_size();        // 1 without MPI
int local_rank();        // the rank among this host's ranks (0 without MPI): which GPU to take
inline bool is_main() { return rank() == 0; }

enum class ReduceOp { Sum, Max, Min };

// In place over the ranks: t becomes the elementwise reduction of every rank's t. t must be a
// contiguous float32, float64 or int64 tensor of the same shape on every rank. A GPU tensor goes
// through NCCL where built (on tapestry's stream, no host synchronisation; every rank's GPU
// tensors on one device), through a host copy and MPI otherwise.
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
//
// Overlap (PyTorch DDP's reducer): call prepare() before the backward that completes the step's
// gradients (the last micro-batch's). A post-accumulate-grad hook on every parameter then starts
// each bucket's all-reduce (nonblocking, on a communicator of its own) as soon as the backward has
// finished its last gradient, while the backward goes on with the layers below; reduce() starts
// the rest and waits for all. Buckets start in the same order on every rank, whatever order the
// gradients come in. Without prepare(), reduce() does all of it after the backward. On by
// default; TAPESTRY_ALLREDUCE_OVERLAP=0 in the environment turns it off (for measuring it), and it
// is off where a parameter takes no gradient or the parameters are on a GPU (overlap_note says).
// The constructor is a collective: every rank makes its GradReducer at the same point.
class GradReducer {
 public:
  // PyTorch DDP's bucket_cap_mb, and a small first bucket so that its all-reduce starts early.
  static constexpr size_t kBucketBytes = size_t(25) << 20, kFirstBucketBytes = size_t(1) << 20;

  explicit GradReducer(std::vector<Tensor> params, size_t bucket_bytes = kBucketBytes,
                       size_t first_bucket_bytes = kFirstBucketBytes, bool overlap = overlap_from_environment());
  ~GradReducer();  // removes its hooks
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Arms the hooks for the next backward (no-op on one rank or without overlap).
  void prepare();
  // Sum every gradient over the ranks, then multiply by `scale`. A no-op on one rank (bar the scale).
  void reduce(double scale = 1.0);

  size_t buckets() const;
  bool overlap() const;
  const std::string& overlap_note() const;  // why overlap is off ("" when on)
  int64_t bytes() const;           // gradient bytes all-reduced per call
  double seconds() const;          // wall time spent in reduce(): communication the backward did not hide
  double hook_seconds() const;     // wall time the hooks took inside the backward (packing, starting, polling)
  int64_t started_early() const;   // buckets started from inside a backward, over all calls

  // TAPESTRY_ALLREDUCE_OVERLAP: unset or 1 -> true, 0 -> false; anything else is an Error.
  static bool overlap_from_environment();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tapestry::dist
