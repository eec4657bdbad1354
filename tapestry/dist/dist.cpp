// The dist module (see dist.h). With TAPESTRY_WITH_MPI (the TAPESTRY_MPI build) the calls go to
// MPI once init() found an mpirun environment; otherwise one rank, and no MPI symbol is used.
#include "tapestry/dist/dist.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "tapestry/ops/error.h"
#include "tapestry/ops/factory.h"
#include "tapestry/autograd/grad_mode.h"
#include "tapestry/ops/kernels.h"

#ifdef TAPESTRY_WITH_MPI
#include <mpi.h>
#endif

namespace tapestry::dist {

namespace {

int g_rank = 0, g_world = 1;
bool g_started = false;  // MPI_Init was called by init()

#ifdef TAPESTRY_WITH_MPI
// mpirun (OpenMPI) and PMI/PMIx launchers (Slurm's srun, MPICH's hydra) set these.
bool launched_by_mpirun() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"})
    if (std::getenv(v)) return true;
  return false;
}

void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(fmt::format("dist: {} failed on rank {} of {}: {}", call, g_rank, g_world, std::string(text, len)));
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::Sum ? MPI_SUM : op == ReduceOp::Max ? MPI_MAX : MPI_MIN; }

MPI_Datatype mpi_type(DType d, const char* what) {
  switch (d) {
    case DType::Float32: return MPI_FLOAT;
    case DType::Float64: return MPI_DOUBLE;
    case DType::Int64: return MPI_INT64_T;
    default: throw Error(fmt::format("dist: {}: dtype {} is not supported (float32, float64, int64)", what, d));
  }
}
#endif

void check_tensor(const Tensor& t, const char* what) {
  TP_CHECK(t.defined(), "dist: {}: undefined tensor", what);
  TP_CHECK(t.is_contiguous(), "dist: {}: the tensor of shape {} must be contiguous", what, t.sizes());
  TP_CHECK(t.device() == Device::CPU, "dist: {}: only cpu tensors are supported", what);
}

}  // namespace

void init(int* argc, char*** argv) {
#ifdef TAPESTRY_WITH_MPI
  if (g_started || !launched_by_mpirun()) return;
  int already = 0;
  MPI_Initialized(&already);
  if (!already) {
    int provided = 0;  // OpenMP threads run kernels only; MPI is called from the main thread
    check_mpi(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    g_started = true;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
#else
  (void)argc, (void)argv;
#endif
}

void finalize() {
#ifdef TAPESTRY_WITH_MPI
  if (!g_started) return;
  int done = 0;
  MPI_Finalized(&done);
  if (!done) {
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
  }
  g_started = false;
#endif
}

void abort(int code) {
#ifdef TAPESTRY_WITH_MPI
  if (g_world > 1) {
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
  }
#endif
  std::exit(code);
}

bool built_with_mpi() {
#ifdef TAPESTRY_WITH_MPI
  return true;
#else
  return false;
#endif
}

int rank() { return g_rank; }
int world_size() { return g_world; }

void allreduce_(Tensor& t, ReduceOp op) {
  check_tensor(t, "allreduce_");
  if (g_world == 1 || t.numel() == 0) return;
#ifdef TAPESTRY_WITH_MPI
  TP_CHECK(t.numel() <= INT32_MAX, "dist: allreduce_: {} elements is more than one MPI call takes", t.numel());
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, t.raw_data(), static_cast<int>(t.numel()), mpi_type(t.dtype(), "allreduce_"),
                          mpi_op(op), MPI_COMM_WORLD),
            "MPI_Allreduce");
  t.impl().storage->version++;
#else
  (void)op;
#endif
}

double allreduce(double value, ReduceOp op) {
  Tensor t = scalar_tensor(value, DType::Float64);
  allreduce_(t, op);
  return t.item<double>();
}

int64_t allreduce(int64_t value, ReduceOp op) {
  Tensor t = tensor(std::vector<int64_t>{value}, Shape{});
  allreduce_(t, op);
  return t.item<int64_t>();
}

void broadcast_(Tensor& t, int root) {
  check_tensor(t, "broadcast_");
  TP_CHECK(root >= 0 && root < g_world, "dist: broadcast_: root {} is not a rank of {}", root, g_world);
  if (g_world == 1 || t.numel() == 0) return;
#ifdef TAPESTRY_WITH_MPI
  TP_CHECK(t.numel() <= INT32_MAX, "dist: broadcast_: {} elements is more than one MPI call takes", t.numel());
  check_mpi(MPI_Bcast(t.raw_data(), static_cast<int>(t.numel()), mpi_type(t.dtype(), "broadcast_"), root,
                      MPI_COMM_WORLD),
            "MPI_Bcast");
  t.impl().storage->version++;
#endif
}

void broadcast_(std::string& s, int root) {
  TP_CHECK(root >= 0 && root < g_world, "dist: broadcast_: root {} is not a rank of {}", root, g_world);
  if (g_world == 1) return;
#ifdef TAPESTRY_WITH_MPI
  int64_t n = static_cast<int64_t>(s.size());
  check_mpi(MPI_Bcast(&n, 1, MPI_INT64_T, root, MPI_COMM_WORLD), "MPI_Bcast");
  s.resize(static_cast<size_t>(n));
  if (n > 0) check_mpi(MPI_Bcast(s.data(), static_cast<int>(n), MPI_CHAR, root, MPI_COMM_WORLD), "MPI_Bcast");
#endif
}

void barrier() {
  if (g_world == 1) return;
#ifdef TAPESTRY_WITH_MPI
  check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
#endif
}

GradReducer::GradReducer(std::vector<Tensor> params, size_t bucket_bytes, size_t first_bucket_bytes)
    : params_(std::move(params)) {
  TP_CHECK(bucket_bytes > 0 && first_bucket_bytes > 0, "dist: GradReducer: bucket sizes must be positive");
  // Reverse order: the backward finishes the last layers' gradients first.
  for (size_t k = params_.size(); k-- > 0;) {
    const Tensor& p = params_[k];
    const size_t bytes = static_cast<size_t>(p.numel()) * dtype_size(p.dtype());
    const size_t limit = buckets_.size() <= 1 ? first_bucket_bytes : bucket_bytes;
    const bool fits = !buckets_.empty() && buckets_.back().dtype == p.dtype() &&
                      static_cast<size_t>(buckets_.back().numel) * dtype_size(p.dtype()) + bytes <= limit;
    if (!fits) {
      buckets_.push_back({});
      buckets_.back().dtype = p.dtype();
    }
    buckets_.back().params.push_back(k);
    buckets_.back().numel += p.numel();
    bytes_ += static_cast<int64_t>(bytes);
  }
}

void GradReducer::reduce(double scale) {
  NoGradGuard no_grad;
  if (g_world == 1) {
    if (scale != 1.0)
      for (Tensor& p : params_)
        if (p.grad().defined()) {
          Tensor g = p.grad();
          g.mul_(scale);
        }
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (Bucket& b : buckets_) {
    if (!b.flat.defined()) b.flat = empty({b.numel}, b.dtype);
    int64_t off = 0;
    for (size_t k : b.params) {  // pack
      const Tensor& p = params_[k];
      Tensor slot = b.flat.slice(0, off, off + p.numel()).view(p.sizes());
      if (p.grad().defined()) kernels::copy_(slot, p.grad());
      else kernels::fill_(slot, 0.0);
      off += p.numel();
    }
    allreduce_(b.flat, ReduceOp::Sum);
    if (scale != 1.0) b.flat.mul_(scale);
    off = 0;
    for (size_t k : b.params) {  // unpack
      const Tensor& p = params_[k];
      Tensor slot = b.flat.slice(0, off, off + p.numel()).view(p.sizes());
      if (!p.grad().defined()) p.impl().grad = empty(p.sizes(), p.dtype()).impl_ptr();
      Tensor g = p.grad();
      kernels::copy_(g, slot);
      off += p.numel();
    }
  }
  seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace tapestry::dist
