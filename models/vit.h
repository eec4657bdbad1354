// A Vision Transformer (Dosovitskiy et al. 2021): an image cut into patches (nn::unfold;
// non-overlapping by default, overlapping with a patch_stride below patch_size), each flattened and embedded by one Linear, a learned [CLS] token in front,
// learned positions added, the zoo's encoder blocks (nn::TransformerEncoder, pre-norm with a
// final LayerNorm) and a Linear head on the [CLS] output. Parameter names match
// tools/reference/vit_ref.py, which maps them onto torch.nn.TransformerEncoderLayer.
// Shapes: B images, C channels, H x W pixels, N patches, D d_model, K classes.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "tapestry/nn/layers.h"

namespace tapestry::models {

struct ViTConfig {
  int64_t image_size = 28, channels = 1, patch_size = 4, classes = 10;
  int64_t patch_stride = 0;  // 0: patch_size (non-overlapping); less: overlapping patches
  int64_t d_model = 64, layers = 4, heads = 4, d_ff = 128;
  double dropout = 0.0;
  double ln_eps = 1e-5;
  std::string activation = "gelu";

  // "tiny" (patch 7, 2 layers, 2 heads, 32; for tests), "small" (patch 4, 6 layers, 4 heads, 96,
  // d_ff 192) and "fmnist" (8x8 patches every 4 pixels, 4 layers, 4 heads, 64, d_ff 128: the
  // Fashion-MNIST recipe); all 28 x 28, one channel, 10 classes.
  static ViTConfig named(const std::string& name);
  static std::vector<std::string> names();
  int64_t stride() const { return patch_stride > 0 ? patch_stride : patch_size; }
  int64_t grid() const { return (image_size - patch_size) / stride() + 1; }
  int64_t patches() const { return grid() * grid(); }
  void validate() const;  // throws tapestry::Error naming the bad field
};

class ViT : public nn::Module {
 public:
  explicit ViT(const ViTConfig& config);
  // images [B, C, H, W] -> the flattened patches [B, N, C * P * P] (row-major over the grid).
  Tensor patches(const Tensor& images) const;
  // images [B, C, H, W] float -> logits [B, K].
  Tensor forward(const Tensor& images);
  // Mean cross-entropy of the logits against int64 labels [B], with label smoothing (the
  // paper's form: see cross_entropy).
  Tensor loss(const Tensor& images, const Tensor& labels, double label_smoothing = 0.0);

  ViTConfig config;
  std::shared_ptr<nn::Linear> patch_embed, head;
  Tensor cls_token;  // [1, 1, D]
  Tensor pos_embed;  // [1, N + 1, D]: [CLS] first
  std::shared_ptr<nn::Dropout> dropout;  // after the positions are added
  std::shared_ptr<nn::TransformerEncoder> encoder;
};

}  // namespace tapestry::models
