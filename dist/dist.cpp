// The dist module (see dist.h). With TAPESTRY_WITH_MPI (the TAPESTRY_MPI build) the calls go to
// MPI once init() found an mpirun environment; otherwise one rank, and no MPI symbol is used.
#include "tapestry/dist/dist.h"

#include <chrono>
#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <exception>
#include <functional>

#include "tapestry/ops/error.h"
#include "tapestry/ops/factory.h"
#include "tapestry/autograd/grad_mode.h"
#include "tapestry/ops/detail/kernels.h"

#ifdef TAPESTRY_WITH_MPI
#include <mpi.h>
#endif
#ifdef TAPESTRY_WITH_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include "tapestry/ops/cuda.h"
#endif

namespace tapestry::dist {

namespace {

int g_rank = 0, g_world = 1, g_local_rank = 0;
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

[[noreturn]] void unsupported_dtype(DType d, const char* what) {
  throw Error(fmt::format("dist: {}: dtype {} is not supported (float32, float64, int64)", what, d));
}

MPI_Datatype mpi_type(DType d, const char* what) {
  switch (d) {
    case DType::Float32: return MPI_FLOAT;
    case DType::Float64: return MPI_DOUBLE;
    case DType::Int64: return MPI_INT64_T;
    default: unsupported_dtype(d, what);
  }
}
#endif

#ifdef TAPESTRY_WITH_NCCL
// Note [NCCL]: in a CUDA build with NCCL, GPU tensors are reduced by NCCL, enqueued on tapestry's
// stream of their device: ordered after the kernels that wrote them and before those that read
// them, with no host synchronisation. MPI only starts it up: rank 0's ncclUniqueId goes to the
// others with MPI_Bcast (as llm.c does), at the first collective on a GPU tensor, which every rank
// makes at the same point (the Trainer's broadcast of the starting weights).
ncclComm_t g_nccl = nullptr;
int g_nccl_device = -1;

void check_nccl(ncclResult_t rc, const char* call) {
  if (rc == ncclSuccess) return;
  throw Error(fmt::format("dist: {} failed on rank {} of {}: {}", call, g_rank, g_world, ncclGetErrorString(rc)));
}

ncclComm_t nccl_comm(Device device) {
  if (g_nccl) {
    TP_CHECK(g_nccl_device == device.index,
             "dist: this rank's NCCL communicator is on cuda:{}, not {}: keep each rank's tensors on one GPU",
             g_nccl_device, device);
    return g_nccl;
  }
  // NCCL refuses two ranks on one GPU ("Duplicate GPU detected"): say which, on every rank.
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int host_len = 0;
  MPI_Get_processor_name(host, &host_len);
  // A rank's GPU: its host's name, hashed, and the device's index.
  const int mine = static_cast<int>(std::hash<std::string>{}(std::string(host, host_len)) % 1000003) * 64 + device.index;
  std::vector<int> gpus(static_cast<size_t>(g_world));
  check_mpi(MPI_Allgather(&mine, 1, MPI_INT, gpus.data(), 1, MPI_INT, MPI_COMM_WORLD), "MPI_Allgather");
  for (int a = 0; a < g_world; ++a)
    for (int b = a + 1; b < g_world; ++b)
      TP_CHECK(gpus[static_cast<size_t>(a)] != gpus[static_cast<size_t>(b)],
               "dist: ranks {} and {} use the same GPU of one host (cuda:{}), and NCCL needs a GPU per rank: give "
               "`--device cuda` (each rank takes its own), and no more ranks per host than GPUs",
               a, b, gpus[static_cast<size_t>(b)] % 64);
  ncclUniqueId id{};
  if (g_rank == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  check_mpi(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast");
  cuda::detail::set_device(device);
  check_nccl(ncclCommInitRank(&g_nccl, g_world, id, g_rank), "ncclCommInitRank");
  g_nccl_device = device.index;
  return g_nccl;
}

ncclDataType_t nccl_type(DType d, const char* what) {
  switch (d) {
    case DType::Float32: return ncclFloat32;
    case DType::Float64: return ncclFloat64;
    case DType::Int64: return ncclInt64;
    default: unsupported_dtype(d, what);
  }
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::Sum ? ncclSum : op == ReduceOp::Max ? ncclMax : ncclMin; }

cudaStream_t stream_of(const Tensor& t) { return static_cast<cudaStream_t>(cuda::detail::stream(t.device())); }
#endif

// A GPU tensor where no NCCL was built: the collective runs on a host copy, copied back (copy_
// marks t as written).
template <class Collective> void through_host(Tensor& t, Collective collective) {
  Tensor host = kernels::to_device(t, Device::CPU);
  collective(host);
  kernels::copy_(t, host);
}

void check_tensor(const Tensor& t, const char* what) {
  TP_CHECK(t.defined(), "dist: {}: undefined tensor", what);
  TP_CHECK(t.is_contiguous(), "dist: {}: the tensor of shape {} must be contiguous", what, t.sizes());
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
  MPI_Comm host;  // the ranks that share this host's memory, hence its GPUs
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_rank, MPI_INFO_NULL, &host) == MPI_SUCCESS) {
    MPI_Comm_rank(host, &g_local_rank);
    MPI_Comm_free(&host);
  }
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
#ifdef TAPESTRY_WITH_NCCL
    if (g_nccl) ncclCommDestroy(g_nccl);
    g_nccl = nullptr;
#endif
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

bool built_with_nccl() {
#ifdef TAPESTRY_WITH_NCCL
  return true;
#else
  return false;
#endif
}

int rank() { return g_rank; }
int world_size() { return g_world; }
int local_rank() { return g_local_rank; }

void allreduce_(Tensor& t, ReduceOp op) {
  check_tensor(t, "allreduce_");
  if (g_world == 1 || t.numel() == 0) return;
#ifdef TAPESTRY_WITH_NCCL
  if (t.device().is_cuda()) {
    check_nccl(ncclAllReduce(t.raw_data(), t.raw_data(), static_cast<size_t>(t.numel()), nccl_type(t.dtype(), "allreduce_"),
                             nccl_op(op), nccl_comm(t.device()), stream_of(t)),
               "ncclAllReduce");
    t.impl().storage->version++;
    return;
  }
#endif
  if (!t.device().is_cpu()) return through_host(t, [op](Tensor& host) { allreduce_(host, op); });
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
#ifdef TAPESTRY_WITH_NCCL
  if (t.device().is_cuda()) {
    check_nccl(ncclBroadcast(t.raw_data(), t.raw_data(), static_cast<size_t>(t.numel()), nccl_type(t.dtype(), "broadcast_"),
                             root, nccl_comm(t.device()), stream_of(t)),
               "ncclBroadcast");
    t.impl().storage->version++;
    return;
  }
#endif
  if (!t.device().is_cpu()) return through_host(t, [root](Tensor& host) { broadcast_(host, root); });
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

bool GradReducer::overlap_from_environment() {
  const char* v = std::getenv("TAPESTRY_ALLREDUCE_OVERLAP");
  if (!v || std::string(v) == "1") return true;
  TP_CHECK(std::string(v) == "0", "dist: TAPESTRY_ALLREDUCE_OVERLAP must be 0 or 1, got '{}'", v);
  return false;
}

struct GradReducer::Impl {
  struct Bucket {
    std::vector<size_t> params;  // indices into params
    int64_t numel = 0;
    DType dtype = DType::Float32;
    Tensor flat;       // the packed gradients, on the parameters' device
    size_t ready = 0;  // parameters whose gradient the armed backward has finished
#ifdef TAPESTRY_WITH_MPI
    MPI_Request request = MPI_REQUEST_NULL;
#endif
  };
  std::vector<Tensor> params;
  std::vector<Bucket> buckets;
  std::vector<size_t> bucket_of;     // parameter index -> its bucket
  std::vector<char> param_ready;
  std::vector<HookHandle> hooks;
  size_t next_start = 0;  // buckets start in index order, the same on every rank; [0, next_start) have
                          // started and are not yet finished by reduce()
  size_t next_poll = 0;   // the oldest bucket whose all-reduce may still be running
  bool overlap = false, armed = false;
  std::string overlap_note;  // why overlap is off, when it is
  double seconds = 0, hook_seconds = 0;
  int64_t bytes = 0, started_early = 0;
#ifdef TAPESTRY_WITH_MPI
  // The buckets' nonblocking all-reduces get a communicator of their own: MPI matches collectives
  // in call order per communicator, and the Trainer's blocking all-reduce of the step's totals may
  // come between them on one rank and not on another.
  MPI_Comm comm = MPI_COMM_NULL;
#endif

  // f(parameter, its slot in b.flat: a view of the parameter's shape), over the bucket's parameters.
  template <class F> void for_each_slot(Bucket& b, F f) {
    int64_t off = 0;
    for (size_t k : b.params) {
      const Tensor& p = params[k];
      f(p, b.flat.slice(0, off, off + p.numel()).view(p.sizes()));
      off += p.numel();
    }
  }

  void pack(Bucket& b) {
    if (!b.flat.defined()) b.flat = empty({b.numel}, TensorOptions(b.dtype, params[b.params[0]].device()));
    for_each_slot(b, [](const Tensor& p, Tensor slot) {
      if (p.grad().defined()) kernels::copy_(slot, p.grad());
      else kernels::fill_(slot, 0.0);
    });
  }

  void start(Bucket& b) {
    pack(b);
    // GPU buckets never overlap (see the constructor): allreduce_ takes them at once, through NCCL
    // on the stream or a host copy. The request stays MPI_REQUEST_NULL: MPI_Test and MPI_Wait
    // return at once.
    if (!b.flat.device().is_cpu()) return allreduce_(b.flat, ReduceOp::Sum);
#ifdef TAPESTRY_WITH_MPI
    TP_CHECK(b.numel <= INT32_MAX, "dist: GradReducer: a bucket of {} elements is more than one MPI call takes", b.numel);
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, b.flat.raw_data(), static_cast<int>(b.numel),
                             mpi_type(b.dtype, "GradReducer"), MPI_SUM, comm, &b.request),
              "MPI_Iallreduce");
#endif
  }

  // Starts every bucket whose gradients are all final, in order.
  void start_ready() {
    while (next_start < buckets.size() && buckets[next_start].ready == buckets[next_start].params.size()) {
      start(buckets[next_start++]);
      ++started_early;
    }
  }

  // OpenMPI moves a nonblocking collective along only inside MPI calls: test the oldest one.
  void poll() {
#ifdef TAPESTRY_WITH_MPI
    while (next_poll < next_start) {
      int done = 0;
      check_mpi(MPI_Test(&buckets[next_poll].request, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (!done) break;
      ++next_poll;
    }
#endif
  }

  void finish(Bucket& b, double scale) {
#ifdef TAPESTRY_WITH_MPI
    check_mpi(MPI_Wait(&b.request, MPI_STATUS_IGNORE), "MPI_Wait");
#endif
    if (scale != 1.0) b.flat.mul_(scale);
    for_each_slot(b, [](const Tensor& p, const Tensor& slot) {  // unpack
      if (!p.grad().defined()) p.impl().grad = empty(p.sizes(), p.options()).impl_ptr();
      Tensor g = p.grad();
      kernels::copy_(g, slot);
    });
  }

  void on_gradient(size_t k) {
    if (!armed || param_ready[k]) return;
    const auto t0 = std::chrono::steady_clock::now();
    param_ready[k] = 1;
    ++buckets[bucket_of[k]].ready;
    start_ready();
    poll();
    hook_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};

GradReducer::GradReducer(std::vector<Tensor> params, size_t bucket_bytes, size_t first_bucket_bytes, bool overlap)
    : impl_(std::make_unique<Impl>()) {
  TP_CHECK(bucket_bytes > 0 && first_bucket_bytes > 0, "dist: GradReducer: bucket sizes must be positive");
  Impl& m = *impl_;
  m.params = std::move(params);
  m.bucket_of.assign(m.params.size(), 0);
  m.param_ready.assign(m.params.size(), 0);
  // Reverse order: the backward finishes the last layers' gradients first.
  for (size_t k = m.params.size(); k-- > 0;) {
    const Tensor& p = m.params[k];
    const size_t bytes = static_cast<size_t>(p.numel()) * dtype_size(p.dtype());
    const size_t limit = m.buckets.size() <= 1 ? first_bucket_bytes : bucket_bytes;
    const bool fits = !m.buckets.empty() && m.buckets.back().dtype == p.dtype() &&
                      static_cast<size_t>(m.buckets.back().numel) * dtype_size(p.dtype()) + bytes <= limit;
    if (!fits) {
      m.buckets.push_back({});
      m.buckets.back().dtype = p.dtype();
    }
    m.buckets.back().params.push_back(k);
    m.buckets.back().numel += p.numel();
    m.bucket_of[k] = m.buckets.size() - 1;
    m.bytes += static_cast<int64_t>(bytes);
  }
  if (g_world == 1) return;
#ifdef TAPESTRY_WITH_MPI
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &m.comm), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(m.comm, MPI_ERRORS_RETURN);
#endif
#ifdef TAPESTRY_WITH_NCCL
  // NCCL starts up here, where every rank is (a hook on one rank and reduce() on another are not
  // one point: its MPI_Bcast would cross the Trainer's all-reduce).
  for (const Tensor& p : m.params)
    if (p.device().is_cuda()) {
      nccl_comm(p.device());
      break;
    }
#endif
  // Parameters that take no gradient (frozen) never fire a hook: their buckets would hold back
  // every bucket after them. On a GPU the all-reduce runs on the one stream (Note [One stream])
  // after the backward's kernels either way; started from a hook it would only put a wait for the
  // other ranks between them (a stream of its own, with events, is what overlap there needs).
  m.overlap = overlap;
  m.overlap_note = overlap ? "" : "TAPESTRY_ALLREDUCE_OVERLAP=0";
  for (const Tensor& p : m.params) {
    if (!m.overlap) break;
    if (!p.requires_grad() || !p.is_leaf()) m.overlap = false, m.overlap_note = "a parameter takes no gradient";
    else if (!p.device().is_cpu()) m.overlap = false, m.overlap_note = "the parameters are on " + device_name(p.device());
  }
  if (!m.overlap) return;
  Impl* self = &m;
  for (size_t k = 0; k < m.params.size(); ++k)
    m.hooks.push_back(m.params[k].register_post_accumulate_grad_hook([self, k](const Tensor&) { self->on_gradient(k); }));
}

GradReducer::~GradReducer() {
  for (HookHandle& h : impl_->hooks) h.remove();
#ifdef TAPESTRY_WITH_MPI
  int finalized = 0;
  MPI_Finalized(&finalized);
  // Unwinding an error, the other ranks may never start the same buckets: waiting here would hang
  // this rank before main() can end the job (dist::abort). Leave them; the job is ending.
  if (impl_->comm != MPI_COMM_NULL && !finalized && std::uncaught_exceptions() == 0) {
    for (size_t i = 0; i < impl_->next_start; ++i)  // a step abandoned by an exception
      MPI_Wait(&impl_->buckets[i].request, MPI_STATUS_IGNORE);
    MPI_Comm_free(&impl_->comm);
  }
#endif
}

void GradReducer::prepare() {
  Impl& m = *impl_;
  if (g_world == 1 || !m.overlap) return;
  TP_CHECK(m.next_start == 0, "dist: GradReducer: prepare() called after buckets started, without a reduce() between");
  // Fresh counts, whatever a step abandoned before its reduce() left behind.
  std::fill(m.param_ready.begin(), m.param_ready.end(), 0);
  for (auto& b : m.buckets) b.ready = 0;
  m.armed = true;
}

void GradReducer::reduce(double scale) {
  NoGradGuard no_grad;
  Impl& m = *impl_;
  if (g_world == 1) {
    if (scale != 1.0)
      for (Tensor& p : m.params)
        if (p.grad().defined()) {
          Tensor g = p.grad();
          g.mul_(scale);
        }
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  m.armed = false;
  while (m.next_start < m.buckets.size()) m.start(m.buckets[m.next_start++]);
  for (auto& b : m.buckets) m.finish(b, scale);
  m.next_start = m.next_poll = 0;  // prepare() clears the ready counts
  m.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

size_t GradReducer::buckets() const { return impl_->buckets.size(); }
bool GradReducer::overlap() const { return impl_->overlap; }
const std::string& GradReducer::overlap_note() const { return impl_->overlap_note; }
int64_t GradReducer::bytes() const { return impl_->bytes; }
double GradReducer::seconds() const { return impl_->seconds; }
double GradReducer::hook_seconds() const { return impl_->hook_seconds; }
int64_t GradReducer::started_early() const { return impl_->started_early; }

}  // namespace tapestry::dist
