// The Vision Transformer of vit.h. Initialisation follows timm's: truncated normal (std 0.02)
// for the positions and every Linear weight, zero biases, LayerNorm at (1, 0), and a [CLS]
// token of N(0, 1e-6).
#include "tapestry/models/vit.h"

#include "tapestry/autograd/functions.h"
#include "tapestry/nn/init.h"

namespace tapestry::models {

ViTConfig ViTConfig::named(const std::string& name) {
  ViTConfig c;
  if (name == "tiny") {
    c.patch_size = 7, c.layers = 2, c.heads = 2, c.d_model = 32, c.d_ff = 64;
  } else if (name == "fmnist") {  // overlapping 8x8 patches every 4 pixels: 6x6 of them
    c.patch_size = 8, c.patch_stride = 4, c.layers = 4, c.heads = 4, c.d_model = 64, c.d_ff = 128;
  } else if (name == "small") {
    c.patch_size = 4, c.layers = 6, c.heads = 4, c.d_model = 96, c.d_ff = 192;
  } else {
    TP_CHECK(false, "ViTConfig: unknown config '{}' (expected one of tiny, fmnist, small)", name);
  }
  return c;
}

std::vector<std::string> ViTConfig::names() { return {"tiny", "fmnist", "small"}; }

void ViTConfig::validate() const {
  TP_CHECK(image_size > 0 && channels > 0 && classes > 0, "ViTConfig: image_size {}, channels {} and classes {} must be positive",
           image_size, channels, classes);
  TP_CHECK(patch_size > 0 && patch_size <= image_size && patch_stride >= 0,
           "ViTConfig: patch_size {} must be in [1, image_size {}] and patch_stride {} >= 0", patch_size, image_size,
           patch_stride);
  TP_CHECK((image_size - patch_size) % stride() == 0, "ViTConfig: patches of {} every {} pixels do not tile image_size {}",
           patch_size, stride(), image_size);
  TP_CHECK(d_model > 0 && heads > 0 && d_model % heads == 0, "ViTConfig: heads {} must divide d_model {}", heads,
           d_model);
  TP_CHECK(layers >= 0 && d_ff > 0, "ViTConfig: layers {} must be >= 0 and d_ff {} positive", layers, d_ff);
  TP_CHECK(dropout >= 0 && dropout < 1, "ViTConfig: dropout {} must be in [0, 1)", dropout);
  nn::check_activation("ViTConfig", activation);
}

ViT::ViT(const ViTConfig& c) : config(c) {
  c.validate();
  const int64_t patch_dim = c.channels * c.patch_size * c.patch_size;
  patch_embed = register_module("patch_embed", std::make_shared<nn::Linear>(patch_dim, c.d_model));
  register_parameter("cls_token", cls_token, zeros({1, 1, c.d_model}));
  register_parameter("pos_embed", pos_embed, zeros({1, c.patches() + 1, c.d_model}));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(c.dropout));
  nn::TransformerEncoderLayerOptions layer(c.d_model, c.heads);
  layer.batch_first = true;
  layer.dim_feedforward = c.d_ff;
  layer.dropout = c.dropout;
  layer.activation = c.activation;
  layer.layer_norm_eps = c.ln_eps;
  layer.norm_first = true;
  encoder = register_module("encoder", std::make_shared<nn::TransformerEncoder>(layer, c.layers, true));
  head = register_module("head", std::make_shared<nn::Linear>(c.d_model, c.classes));

  NoGradGuard no_grad;
  apply([](nn::Module& m) {
    if (auto* linear = dynamic_cast<nn::Linear*>(&m)) {
      nn::init::trunc_normal_(linear->weight, 0.0, 0.02);
      if (linear->bias.defined()) nn::init::zeros_(linear->bias);
    }
  });
  nn::init::trunc_normal_(pos_embed, 0.0, 0.02);
  nn::init::normal_(cls_token, 0.0, 1e-6);
}

Tensor ViT::patches(const Tensor& images) const {
  TP_CHECK(images.dim() == 4 && images.size(1) == config.channels && images.size(2) == config.image_size &&
               images.size(3) == config.image_size,
           "ViT: images must be [B, {}, {}, {}], got shape {}", config.channels, config.image_size, config.image_size,
           images.sizes());
  const int64_t p = config.patch_size, st = config.stride();
  return nn::unfold(images, {p, p}, {st, st}).transpose(1, 2);
}

Tensor ViT::forward(const Tensor& images) {
  Tensor x = patch_embed->forward(patches(images));  // [B, N, D]
  const int64_t B = x.size(0);
  Tensor cls = cls_token.expand({B, 1, config.d_model});
  x = dropout->forward(cat({cls, x}, 1) + pos_embed);
  Tensor y = encoder->forward(x);
  return head->forward(y.select(1, 0));
}

Tensor ViT::loss(const Tensor& images, const Tensor& labels, double label_smoothing) {
  return cross_entropy(forward(images), labels, label_smoothing);
}

}  // namespace tapestry::models
