// The augmentations of transforms.h: per-image offsets and coin flips drawn first (in image
// order, so results do not depend on the thread count), then the pixels moved in parallel.
#include "tapestry/data/transforms.h"

#include <cmath>
#include <random>
#include <vector>

#include "tapestry/autograd/functions.h"
#include "tapestry/ops/dtype.h"

namespace tapestry::data {

namespace {
void check_images(const char* op, const Tensor& images) {
  TP_CHECK(images.dim() == 4, "{}: images must be [B, C, H, W], got shape {}", op, images.sizes());
  TP_CHECK(images.device().is_cpu(), "{}: images must be on the CPU, got {}", op, images.device());
}
}  // namespace

Tensor random_crop(const Tensor& images, int64_t padding, Generator& gen) {
  check_images("random_crop", images);
  TP_CHECK(padding >= 0, "random_crop: padding must be non-negative, got {}", padding);
  Tensor src = contiguous(images.detach());
  const int64_t B = src.size(0), C = src.size(1), H = src.size(2), W = src.size(3);
  std::vector<int64_t> dy(static_cast<size_t>(B)), dx(static_cast<size_t>(B));
  std::uniform_int_distribution<int64_t> shift(-padding, padding);
  for (int64_t b = 0; b < B; ++b) {
    dy[static_cast<size_t>(b)] = shift(gen.engine());
    dx[static_cast<size_t>(b)] = shift(gen.engine());
  }
  Tensor out = zeros(src.sizes(), src.dtype());
  dispatch_floating(src.dtype(), "random_crop", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* in = src.data_ptr<T>();
    T* o = out.data_ptr<T>();
#pragma omp parallel for if (B * C * H * W > 65536)
    for (int64_t bc = 0; bc < B * C; ++bc) {
      const int64_t b = bc / C, oy = dy[static_cast<size_t>(b)], ox = dx[static_cast<size_t>(b)];
      // Output pixel (y, x) is input pixel (y + oy, x + ox), or padding (0) outside the image.
      for (int64_t y = 0; y < H; ++y) {
        const int64_t sy = y + oy;
        if (sy < 0 || sy >= H) continue;
        for (int64_t x = std::max<int64_t>(0, -ox); x < std::min(W, W - ox); ++x)
          o[(bc * H + y) * W + x] = in[(bc * H + sy) * W + x + ox];
      }
    }
  });
  return out;
}

Tensor random_horizontal_flip(const Tensor& images, Generator& gen, double p) {
  check_images("random_horizontal_flip", images);
  TP_CHECK(p >= 0 && p <= 1, "random_horizontal_flip: p must be in [0, 1], got {}", p);
  Tensor src = contiguous(images.detach());
  const int64_t B = src.size(0), C = src.size(1), H = src.size(2), W = src.size(3);
  std::vector<char> flip(static_cast<size_t>(B));
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  for (int64_t b = 0; b < B; ++b) flip[static_cast<size_t>(b)] = coin(gen.engine()) < p;
  Tensor out = empty(src.sizes(), src.dtype());
  dispatch_floating(src.dtype(), "random_horizontal_flip", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* in = src.data_ptr<T>();
    T* o = out.data_ptr<T>();
#pragma omp parallel for if (B * C * H * W > 65536)
    for (int64_t row = 0; row < B * C * H; ++row) {
      const bool f = flip[static_cast<size_t>(row / (C * H))];
      const T* r = in + row * W;
      T* w = o + row * W;
      for (int64_t x = 0; x < W; ++x) w[x] = f ? r[W - 1 - x] : r[x];
    }
  });
  return out;
}

Tensor normalize(const Tensor& images, const std::vector<double>& mean, const std::vector<double>& std) {
  TP_CHECK(images.dim() == 3 || images.dim() == 4, "normalize: images must be [B, C, H, W] or [C, H, W], got shape {}",
           images.sizes());
  TP_CHECK(is_floating(images.dtype()), "normalize: images must be floating-point, got {} (convert with .to(kFloat32))",
           images.dtype());
  const int64_t C = images.size(images.dim() - 3);
  auto per_channel = [&](const char* what, const std::vector<double>& v) {
    TP_CHECK(v.size() == 1 || static_cast<int64_t>(v.size()) == C,
             "normalize: {} has {} values for images of {} channels (shape {}); give one per channel, or one", what,
             v.size(), C, images.sizes());
    for (double x : v) TP_CHECK(std::isfinite(x), "normalize: {} holds {}, not a finite number", what, x);
    std::vector<double> full = v.size() == 1 ? std::vector<double>(static_cast<size_t>(C), v[0]) : v;
    return tensor(full, {C, 1, 1}, TensorOptions(images.dtype(), images.device()));
  };
  for (double s : std) TP_CHECK(s > 0, "normalize: std holds {}; every std must be above 0", s);
  return div(sub(images, per_channel("mean", mean)), per_channel("std", std));
}

}  // namespace tapestry::data
