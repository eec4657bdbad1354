// The machine's peak fp32 FLOP/s, measured: each thread runs 12 independent chains of fused
// multiply-adds on the widest vectors this build targets (AVX-512, AVX2 or SSE), enough chains
// to hide the FMA latency on two FMA ports. `tapestry bench --peak` prints it.
#include <immintrin.h>
#include <omp.h>

#include <chrono>
#include <cstdint>
#include <cstring>

namespace tapestry::tools {

namespace {
template <class V, class Fma>
double chains(int64_t iters, V a, V b, V init, Fma fma, int lanes, float* sink) {
  V acc[12];
  for (auto& v : acc) v = init;
  for (int64_t i = 0; i < iters; ++i)
    for (auto& v : acc) v = fma(v, a, b);
  V total = acc[0];
  for (int k = 1; k < 12; ++k) total = fma(total, a, acc[k]);
  float out[16];
  std::memcpy(out, &total, sizeof(V));
  *sink = out[0];
  return 2.0 * 12 * lanes * static_cast<double>(iters);  // flops
}
}  // namespace

// Returns GFLOP/s over `threads` threads; `isa` names the vector width used.
double peak_gflops(int threads, const char** isa) {
  const int64_t iters = 50'000'000;
  double flops = 0;
  float sink = 0;
  auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : flops)
  {
    float s = 0;
#if defined(__AVX512F__)
    flops += chains<__m512>(iters, _mm512_set1_ps(0.999999f), _mm512_set1_ps(1e-7f), _mm512_set1_ps(1.0f),
                            [](__m512 x, __m512 y, __m512 z) { return _mm512_fmadd_ps(x, y, z); }, 16, &s);
#elif defined(__FMA__)
    flops += chains<__m256>(iters, _mm256_set1_ps(0.999999f), _mm256_set1_ps(1e-7f), _mm256_set1_ps(1.0f),
                            [](__m256 x, __m256 y, __m256 z) { return _mm256_fmadd_ps(x, y, z); }, 8, &s);
#else
    flops += chains<__m128>(iters, _mm_set1_ps(0.999999f), _mm_set1_ps(1e-7f), _mm_set1_ps(1.0f),
                            [](__m128 x, __m128 y, __m128 z) { return _mm_add_ps(_mm_mul_ps(x, y), z); }, 4, &s);
#endif
#pragma omp atomic
    sink += s;
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
#if defined(__AVX512F__)
  *isa = "AVX-512 FMA";
#elif defined(__FMA__)
  *isa = "AVX2 FMA";
#else
  *isa = "SSE mul+add";
#endif
  if (sink == 12345.0f) *isa = "?";  // keeps the chains alive
  return flops / secs / 1e9;
}

}  // namespace tapestry::tools
