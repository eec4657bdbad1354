// CPU gemms: float32 through oneDNN (when built with it) or OpenBLAS, float64 through OpenBLAS,
// autocast's bfloat16 through oneDNN's matmul primitive.
//
// Why oneDNN for float32: OpenBLAS 0.3.21 (Debian 12) picks its kernels by CPU model number and
// falls back to its SSE3 ("Prescott") kernels on a model it does not know. On the Xeon model 207
// (Emerald Rapids) our 2-core machines now run on, that made sgemm 61 GFLOP/s where its AVX-512
// kernels (OPENBLAS_CORETYPE=SkylakeX) reach 260-290 and oneDNN, which reads the CPU's feature
// flags, 290-330 (docs/benchmarks.md, "Which gemm"). TAPESTRY_GEMM=openblas|onednn overrides the
// choice for A/B runs.
#include "tapestry/ops/cpu/gemm.h"

#include <cblas.h>

#include <cstdlib>
#include <cstring>
#include <map>
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

}  // namespace

const char* gemm_library() { return use_onednn() ? "onednn" : "openblas"; }

void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
#ifdef TAPESTRY_WITH_ONEDNN
  if (use_onednn()) {
    if (m == 0 || n == 0) return;
    if (k == 0) {  // C = beta C (oneDNN refuses k = 0 where BLAS accepts it)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0 ? 0.0f : beta * c[i * ldc + j];
      return;
    }
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

// One primitive per shape and B layout, per thread (oneDNN's own cache would also serve, but its
// key is built from the descriptors on every call).
dnnl::matmul& bf16_matmul(int64_t m, int64_t n, int64_t k, bool tb, int64_t ldc) {
  thread_local std::map<std::tuple<int64_t, int64_t, int64_t, bool, int64_t>, dnnl::matmul> cache;
  auto key = std::make_tuple(m, n, k, tb, ldc);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  memory::desc src({m, k}, memory::data_type::bf16, memory::dims{k, 1});
  memory::desc wei({k, n}, memory::data_type::bf16, tb ? memory::dims{1, k} : memory::dims{n, 1});
  memory::desc dst({m, n}, memory::data_type::f32, memory::dims{ldc, 1});
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, wei, dst), cpu_engine());
  return cache.emplace(key, dnnl::matmul(pd)).first->second;
}

// rows x cols of x (row stride ld, read transposed when `trans`) into a packed bfloat16 buffer.
void to_bf16(const float* x, int64_t ld, bool trans, int64_t rows, int64_t cols, uint16_t* out) {
  parallel_for(0, rows, std::max<int64_t>(1, kGrainSize / std::max<int64_t>(cols, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t j = 0; j < cols; ++j) out[r * cols + j] = bf16_round(trans ? x[j * ld + r] : x[r * ld + j]);
  });
}

}  // namespace
#endif

void gemm_bf16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
               int64_t ldb, float* c, int64_t ldc) {
  std::string why;
  TP_CHECK(bf16_hardware(&why), "matmul in bfloat16: {}", why);
#ifdef TAPESTRY_WITH_ONEDNN
  thread_local std::vector<uint16_t> a16, b16;
  a16.resize(static_cast<size_t>(m * k));
  b16.resize(static_cast<size_t>(k * n));
  to_bf16(a, lda, ta, m, k, a16.data());                  // A as [m, k]
  if (tb) to_bf16(b, ldb, false, n, k, b16.data());       // B stored [n, k]: kept so
  else to_bf16(b, ldb, false, k, n, b16.data());          // B stored [k, n]
  dnnl::matmul& mm = bf16_matmul(m, n, k, tb, ldc);
  memory::desc src({m, k}, memory::data_type::bf16, memory::dims{k, 1});
  memory::desc wei({k, n}, memory::data_type::bf16, tb ? memory::dims{1, k} : memory::dims{n, 1});
  memory::desc dst({m, n}, memory::data_type::f32, memory::dims{ldc, 1});
  thread_local dnnl::stream stream(cpu_engine());
  memory src_m(src, cpu_engine(), a16.data()), wei_m(wei, cpu_engine(), b16.data()), dst_m(dst, cpu_engine(), c);
  mm.execute(stream, {{DNNL_ARG_SRC, src_m}, {DNNL_ARG_WEIGHTS, wei_m}, {DNNL_ARG_DST, dst_m}});
  stream.wait();
#else
  (void)ta, (void)tb, (void)m, (void)n, (void)k, (void)a, (void)lda, (void)b, (void)ldb, (void)c, (void)ldc;
#endif
}

}  // namespace tapestry::kernels::cpu
