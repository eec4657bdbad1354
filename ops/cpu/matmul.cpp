// CPU matmul (ops/cpu/gemm.h): 2-D and batched (leading dims broadcast). Strided operands are
// passed to the gemm as transposes and leading dimensions; only a layout that no gemm call can
// read (e.g. both strides > 1) is copied first. Under an AutocastGuard (ops/autocast.h) float32
// operands multiply in bfloat16.
#include <memory>

#include "tapestry/ops/autocast.h"
#include "tapestry/ops/cpu/gemm.h"
#include "tapestry/ops/cpu/loops.h"
#include "tapestry/ops/factory.h"
#include "tapestry/ops/detail/backend.h"
#include "tapestry/ops/profile.h"

namespace tapestry::kernels::cpu {

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  TP_PROFILE("matmul");
  const Shape batch = matmul_batch(a_in, b_in);
  const int64_t M = a_in.size(-2), K = a_in.size(-1), N = b_in.size(-1);
  Shape out_shape = batch;
  out_shape.push_back(M);
  out_shape.push_back(N);

  Tensor a = a_in, b = b_in;
  MatLayout la = gemm_layout(M, K, a.stride(-2), a.stride(-1));
  if (!la.ok) {
    a = contiguous(a);
    la = gemm_layout(M, K, a.stride(-2), a.stride(-1));
  }
  MatLayout lb = gemm_layout(K, N, b.stride(-2), b.stride(-1));
  if (!lb.ok) {
    b = contiguous(b);
    lb = gemm_layout(K, N, b.stride(-2), b.stride(-1));
  }
  dispatch_floating(a.dtype(), "matmul", [](auto) {});
  Tensor out = empty(out_shape, a.options());
  if (K == 0) fill_(out, 0.0);
  if (K == 0 || out.numel() == 0) return out;

  // Element offsets of each batch's matrix, with broadcast batch dims read at stride 0.
  const int64_t n_batch = shape_numel(batch), nb = static_cast<int64_t>(batch.size());
  auto batch_offsets = [&](const Tensor& t) {
    std::vector<int64_t> offs(static_cast<size_t>(n_batch));
    int64_t lead = nb - (t.dim() - 2);
    for (int64_t i = 0; i < n_batch; ++i) {
      int64_t rem = i, off = 0;
      for (int64_t d = nb - 1; d >= 0; --d) {
        int64_t idx = rem % batch[d];
        rem /= batch[d];
        int64_t td = d - lead;
        if (td >= 0 && t.size(td) != 1) off += idx * t.stride(td);
      }
      offs[static_cast<size_t>(i)] = off;
    }
    return offs;
  };
  std::vector<int64_t> off_a = batch_offsets(a), off_b = batch_offsets(b);

  const bool bf16 = a.dtype() == DType::Float32 && autocast_precision() == Precision::BFloat16;
  // A weight's bfloat16 mirror, kept for the guard's life (Note [Autocast weight cache]): read at
  // the operand's own offsets, in its layout. Null for an operand rounded at each use.
  std::shared_ptr<Storage> mirror_a, mirror_b;
  if (bf16) {
    auto round_storage = [](const Storage& s) {
      const int64_t n = static_cast<int64_t>(s.nbytes / sizeof(float));
      auto m = std::make_shared<Storage>(static_cast<size_t>(std::max<int64_t>(n, 1)) * 2, s.device);
      round_to_bf16(static_cast<const float*>(s.data), n, static_cast<uint16_t*>(m->data));
      return m;
    };
    mirror_a = autocast_bf16_mirror(a.impl().storage, round_storage);
    mirror_b = autocast_bf16_mirror(b.impl().storage, round_storage);
  }
  auto mirrored = [](const std::shared_ptr<Storage>& m, const Tensor& t, int64_t off) -> const uint16_t* {
    return m ? static_cast<const uint16_t*>(m->data) + t.offset() + off : nullptr;
  };
  dispatch_floating(a.dtype(), "matmul", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pa = a.data_ptr<T>();
    const T* pb = b.data_ptr<T>();
    T* pc = out.data_ptr<T>();
    auto one = [&](int64_t i) {
      const int64_t oa = off_a[static_cast<size_t>(i)], ob = off_b[static_cast<size_t>(i)];
      const T* ai = pa + oa;
      const T* bi = pb + ob;
      if constexpr (std::is_same_v<T, float>) {
        if (bf16)
          return gemm_bf16(la.trans, lb.trans, M, N, K, ai, la.ld, bi, lb.ld, pc + i * M * N, N,
                           mirrored(mirror_a, a, oa), mirrored(mirror_b, b, ob));
      }
      gemm(la.trans, lb.trans, M, N, K, T(1), ai, la.ld, bi, lb.ld, T(0), pc + i * M * N, N);
    };
    // Many small matrices: one gemm per thread (OpenBLAS runs single-threaded inside a parallel
    // region). Few large ones: one at a time, each using all threads.
    if (n_batch > 1 && M * N * K < (1 << 18)) {
      cpu::parallel_for(0, n_batch, 1, [&](int64_t b0, int64_t e0) {
        for (int64_t i = b0; i < e0; ++i) one(i);
      });
    } else {
      for (int64_t i = 0; i < n_batch; ++i) one(i);
    }
  });
  return out;
}

}  // namespace tapestry::kernels::cpu
