// CPU gemms: float32 through oneDNN (when built with it) or OpenBLAS, float64 through OpenBLAS,
// autocast's bfloat16 through oneDNN's matmul primitive.
//
// Why oneDNN for float32: OpenBLAS 0.3.21 (Debian 12) picks its kernels by CPU model number and
// falls back to its SSE3 ("Prescott") kernels on a model it does not know. On the Xeon model 207
// (Emerald Rapids) our 2-core machines now run on, that made sgemm 61 GFLOP/s where its AVX-512
// kernels (OPENBLAS_CORETYPE=SkylakeX) reach 260-290 and oneDNN, which reads the CPU's feature
// flags, 290-330 (docs/benchmarks.md, "Which gemm"). TAPESTRY_GEMM=openblas|onednn overrides the
// choice for A/B runs.
//
// Note [oneDNN and signals]: oneDNN 2.6's JIT sgemm kernels point rsp into a heap buffer while they
// run (oneDNN issue #4845, fixed in 3.11), so a signal handler that runs on the interrupted
// thread's stack writes into the heap: SIGTERM during training aborted 3 runs in 30 with
// "corrupted double-linked list". Every thread that runs those kernels gets an alternate signal
// stack here, and the training's handlers (apps/train/run_dir.cpp) ask for it with SA_ONSTACK.
#include "tapestry/ops/cpu/gemm.h"
#include "tapestry/ops/cpu/lanes.h"

#include <cblas.h>
#include <signal.h>

#include <atomic>
#include <mutex>

#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "tapestry/ops/autocast.h"
#include "tapestry/ops/cpu/loops.h"
#include "tapestry/ops/error.h"

#ifdef TAPESTRY_WITH_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace tapestry::kernels::cpu {

namespace {

bool use_onednn() {
  static const bool on = [] {
    const char* env = std::getenv("TAPESTRY_GEMM");
    std::string want = env ? env : "";
#ifdef TAPESTRY_WITH_ONEDNN
    if (want.empty() || want == "onednn") return true;
#else
    if (want.empty()) return false;
    TP_CHECK(want != "onednn", "TAPESTRY_GEMM=onednn: this build has no oneDNN (install libdnnl-dev and rebuild)");
#endif
    TP_CHECK(want == "openblas", "TAPESTRY_GEMM={}: expected onednn or openblas", want);
    return false;
  }();
  return on;
}

#ifdef TAPESTRY_WITH_ONEDNN
// Note [oneDNN and signals]: an alternate signal stack for this thread, once. The stacks are kept
// for the life of the process (a thread's signal stack must outlive its last signal).
void signal_stack_for_this_thread() {
  thread_local bool done = false;
  if (done) return;
  static std::mutex mutex;
  static std::vector<std::unique_ptr<char[]>> stacks;
  const size_t size = std::max<size_t>(SIGSTKSZ, 64 * 1024);
  std::lock_guard<std::mutex> lock(mutex);
  stacks.push_back(std::make_unique<char[]>(size));
  stack_t ss{};
  ss.ss_sp = stacks.back().get();
  ss.ss_size = size;
  ::sigaltstack(&ss, nullptr);
  done = true;
}

// ... for the calling thread and every OpenMP thread oneDNN may run its kernels on.
void signal_stacks() {
  signal_stack_for_this_thread();
#ifdef _OPENMP
  static std::atomic<int> covered{1};
  const int threads = omp_get_max_threads();
  if (threads > covered.load() && !omp_in_parallel()) {
#pragma omp parallel num_threads(threads)
    signal_stack_for_this_thread();
    covered = threads;
  }
#endif
}
#endif

// Products this small (a decoding step's attention: one query row against a few dozen keys of 32
// or 64 dims, a thousand such per step) cost less in a plain loop than in a library's dispatch.
constexpr int64_t kSmallGemm = 8192;  // multiply-adds

void small_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  auto store = [&](float* cij, float v) { *cij = alpha * v + (beta == 0.0f ? 0.0f : beta * *cij); };  // beta 0 ignores C, as BLAS
  std::vector<float> row;  // op(A)'s row i, contiguous (a transposed A is strided)
  for (int64_t i = 0; i < m; ++i) {
    const float* ai = a + i * lda;
    if (ta) {
      row.resize(static_cast<size_t>(k));
      for (int64_t p = 0; p < k; ++p) row[static_cast<size_t>(p)] = a[p * lda + i];
      ai = row.data();
    }
    float* ci = c + i * ldc;
    if (tb) {  // B stored n x k: c_ij = (row i of op(A)) . (row j of B), four rows of B at a time
      int64_t j = 0;
      for (; j + 4 <= n; j += 4) {
        const float *b0 = b + j * ldb, *b1 = b0 + ldb, *b2 = b1 + ldb, *b3 = b2 + ldb;
        F16 s0 = {}, s1 = {}, s2 = {}, s3 = {};
        int64_t p = 0;
        for (; p + 16 <= k; p += 16) {
          const F16 x = load16(ai + p);
          s0 += x * load16(b0 + p), s1 += x * load16(b1 + p), s2 += x * load16(b2 + p), s3 += x * load16(b3 + p);
        }
        float r0 = lanes_sum(s0), r1 = lanes_sum(s1), r2 = lanes_sum(s2), r3 = lanes_sum(s3);
        for (; p < k; ++p) r0 += ai[p] * b0[p], r1 += ai[p] * b1[p], r2 += ai[p] * b2[p], r3 += ai[p] * b3[p];
        store(ci + j, r0), store(ci + j + 1, r1), store(ci + j + 2, r2), store(ci + j + 3, r3);
      }
      for (; j < n; ++j) store(ci + j, dot16(ai, b + j * ldb, k));
    } else {  // B stored k x n: C's row i, 32 columns at a time held in registers over all of k
      int64_t j = 0;
      for (; j + 32 <= n; j += 32) {
        // Even and odd p in separate accumulators: four independent multiply-add chains.
        F16 acc0 = {}, acc1 = {}, odd0 = {}, odd1 = {};
        int64_t p = 0;
        for (; p + 2 <= k; p += 2) {
          const float* bp = b + p * ldb + j;
          acc0 += ai[p] * load16(bp), acc1 += ai[p] * load16(bp + 16);
          odd0 += ai[p + 1] * load16(bp + ldb), odd1 += ai[p + 1] * load16(bp + ldb + 16);
        }
        if (p < k) acc0 += ai[p] * load16(b + p * ldb + j), acc1 += ai[p] * load16(b + p * ldb + j + 16);
        acc0 += odd0, acc1 += odd1;
        for (int l = 0; l < 16; ++l) store(ci + j + l, acc0[l]), store(ci + j + 16 + l, acc1[l]);
      }
      for (; j + 16 <= n; j += 16) {
        F16 acc0 = {};
        for (int64_t p = 0; p < k; ++p) acc0 += ai[p] * load16(b + p * ldb + j);
        for (int l = 0; l < 16; ++l) store(ci + j + l, acc0[l]);
      }
      for (; j < n; ++j) {
        float r = 0;
        for (int64_t p = 0; p < k; ++p) r += ai[p] * b[p * ldb + j];
        store(ci + j, r);
      }
    }
  }
}

}  // namespace

const char* gemm_library() { return use_onednn() ? "onednn" : "openblas"; }

void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m * n * k <= kSmallGemm) return small_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#ifdef TAPESTRY_WITH_ONEDNN
  if (use_onednn()) {
    if (m == 0 || n == 0) return;
    if (k == 0) {  // C = beta C (oneDNN refuses k = 0 where BLAS accepts it)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0 ? 0.0f : beta * c[i * ldc + j];
      return;
    }
    signal_stacks();
    dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    TP_CHECK(st == dnnl_success, "matmul: oneDNN sgemm failed (status {}) for m={} n={} k={}", static_cast<int>(st),
             m, n, k);
    return;
  }
#endif
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb),
              beta, c, static_cast<int>(ldc));
}

void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
          const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb),
              beta, c, static_cast<int>(ldc));
}

bool bf16_hardware(std::string* why) {
  auto no = [why](const char* reason) {
    if (why) *why = reason;
    return false;
  };
#if defined(__x86_64__) || defined(__i386__)
  if (!__builtin_cpu_supports("avx512bf16")) return no("this CPU has no AVX512-BF16 (bfloat16 dot products)");
#else
  return no("bfloat16 matmuls need an x86-64 CPU with AVX512-BF16");
#endif
#ifdef TAPESTRY_WITH_ONEDNN
  // oneDNN may be capped below its bf16 kernels (DNNL_MAX_CPU_ISA); its ISA values are bit sets.
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
  if ((isa & bf16) != bf16) return no("oneDNN is limited below its AVX512-BF16 kernels (DNNL_MAX_CPU_ISA)");
  return true;
#else
  return no("this build has no oneDNN (install libdnnl-dev and rebuild)");
#endif
}

#ifdef TAPESTRY_WITH_ONEDNN
namespace {

using dnnl::memory;

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// A matrix's descriptor: rows x cols bfloat16 in its storage order with leading dimension ld (read
// transposed when `trans`, i.e. stored cols x rows).
memory::desc bf16_desc(int64_t rows, int64_t cols, bool trans, int64_t ld) {
  return memory::desc({rows, cols}, memory::data_type::bf16, trans ? memory::dims{1, ld} : memory::dims{ld, 1});
}

// One primitive per shape and layout, per thread (oneDNN's own cache would also serve, but its key
// is built from the descriptors on every call).
dnnl::matmul& bf16_matmul(int64_t m, int64_t n, int64_t k, bool ta, int64_t lda, bool tb, int64_t ldb, int64_t ldc) {
  thread_local std::map<std::tuple<int64_t, int64_t, int64_t, bool, int64_t, bool, int64_t, int64_t>, dnnl::matmul>
      cache;
  auto key = std::make_tuple(m, n, k, ta, lda, tb, ldb, ldc);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  memory::desc dst({m, n}, memory::data_type::f32, memory::dims{ldc, 1});
  dnnl::matmul::primitive_desc pd(
      dnnl::matmul::desc(bf16_desc(m, k, ta, lda), bf16_desc(k, n, tb, ldb), dst), cpu_engine());
  return cache.emplace(key, dnnl::matmul(pd)).first->second;
}

// The rows x cols float32 matrix x (row stride ld), packed into bfloat16 in the same order.
void to_bf16(const float* x, int64_t ld, int64_t rows, int64_t cols, uint16_t* out) {
  parallel_for(0, rows, std::max<int64_t>(1, kGrainSize / std::max<int64_t>(cols, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t j = 0; j < cols; ++j) out[r * cols + j] = bf16_round(x[r * ld + j]);
  });
}

}  // namespace
#endif

void round_to_bf16(const float* x, int64_t n, uint16_t* out) {
  parallel_for(0, n, kGrainSize, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) out[i] = bf16_round(x[i]);
  });
}

void gemm_bf16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
               int64_t ldb, float* c, int64_t ldc, const uint16_t* a16_given, const uint16_t* b16_given) {
  std::string why;
  TP_CHECK(bf16_hardware(&why), "matmul in bfloat16: {}", why);
#ifdef TAPESTRY_WITH_ONEDNN
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
    return;
  }
  signal_stacks();
  // Packed in storage order; oneDNN reads the transposes from the descriptors' strides.
  thread_local std::vector<uint16_t> a16, b16;
  const uint16_t* pa = a16_given;
  const uint16_t* pb = b16_given;
  if (!pa) {
    a16.resize(static_cast<size_t>(m * k));
    if (ta) to_bf16(a, lda, k, m, a16.data());
    else to_bf16(a, lda, m, k, a16.data());
    pa = a16.data(), lda = ta ? m : k;
  }
  if (!pb) {
    b16.resize(static_cast<size_t>(k * n));
    if (tb) to_bf16(b, ldb, n, k, b16.data());
    else to_bf16(b, ldb, k, n, b16.data());
    pb = b16.data(), ldb = tb ? k : n;
  }
  dnnl::matmul& mm = bf16_matmul(m, n, k, ta, lda, tb, ldb, ldc);
  memory::desc dst({m, n}, memory::data_type::f32, memory::dims{ldc, 1});
  thread_local dnnl::stream stream(cpu_engine());
  // oneDNN's memory objects take non-const handles; it only reads the operands.
  memory src_m(bf16_desc(m, k, ta, lda), cpu_engine(), const_cast<uint16_t*>(pa)),
      wei_m(bf16_desc(k, n, tb, ldb), cpu_engine(), const_cast<uint16_t*>(pb)), dst_m(dst, cpu_engine(), c);
  mm.execute(stream, {{DNNL_ARG_SRC, src_m}, {DNNL_ARG_WEIGHTS, wei_m}, {DNNL_ARG_DST, dst_m}});
  stream.wait();
#else
  (void)ta, (void)tb, (void)m, (void)n, (void)k, (void)a, (void)lda, (void)b, (void)ldb, (void)c, (void)ldc;
  (void)a16_given, (void)b16_given;
#endif
}

}  // namespace tapestry::kernels::cpu
