// `tapestry image-attention --checkpoint DIR [--index N] [--out FILE]`: the [CLS] token's
// attention over the patches of one test image, in the last encoder layer (averaged over its
// heads), laid over the image as an SVG; and the model's prediction for it.
#include <cstdio>
#include <memory>

#include "apps/eval/image_plots.h"
#include "apps/tasks/image_classification.h"
#include "tapestry/autograd/functions.h"
#include "tapestry/data/idx.h"
#include "tools/cli.h"

namespace tapestry::tools {

Subcommand add_image_attention(CLI::App& app) {
  struct Flags {
    std::string dir, out = "cls_attention.svg";
    int64_t index = 0;
  };
  auto f = std::make_shared<Flags>();
  auto* cmd = app.add_subcommand("image-attention",
                                 "draw a ViT's [CLS] attention over the patches of a test image (SVG)");
  cmd->add_option("--checkpoint", f->dir, "directory written by `train --task image --out DIR`")->required();
  cmd->add_option("--index", f->index, "which test image (0-based)")->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--out", f->out, "the SVG file to write")->capture_default_str();
  return {cmd, [f] {
    apps::ImageClassifier c = apps::load_image_classifier(f->dir);
    const data::ImageSet test = data::read_mnist(c.data_dir, false);
    TP_CHECK(f->index < test.images.size(0), "image-attention: --index {} is past the {} test images of {}", f->index,
             test.images.size(0), c.data_dir);
    Tensor image = test.images.slice(0, f->index, f->index + 1);
    models::ViT& vit = *c.model;
    const int64_t last = static_cast<int64_t>(vit.encoder->layers->size()) - 1;
    TP_CHECK(last >= 0, "image-attention: the model has no encoder layers");
    Tensor weights;
    auto attn = vit.encoder->layers->at<nn::TransformerEncoderLayer>(static_cast<size_t>(last))->self_attn;
    attn->set_attention_hook([&weights](const Tensor& w) { weights = w; });
    NoGradGuard no_grad;
    Tensor probs = softmax(vit.forward(c.norm.apply(image)), 1);
    attn->set_attention_hook(nullptr);
    // [1, H, N+1, N+1] -> the [CLS] row over the patches, averaged over the heads.
    Tensor cls = weights.select(2, 0).slice(2, 1, weights.size(3)).mean({1}).reshape({-1});
    const int64_t pred = argmax(probs, 1).item<int64_t>(), truth = test.labels.select(0, f->index).item<int64_t>();
    const std::string title = fmt::format("test image {}: {} (true: {}), p = {:.2f}", f->index,
                                          c.names[static_cast<size_t>(pred)], c.names[static_cast<size_t>(truth)],
                                          probs.select(1, pred).item<double>());
    apps::write_attention_overlay_svg(f->out, title, image.reshape({-1}).to_vector<float>(), image.size(2),
                                      image.size(3), cls.to_vector<float>(), vit.config.grid(), vit.config.patch_size,
                                      vit.config.stride());
    std::printf("%s\nwrote %s\n", title.c_str(), f->out.c_str());
    return 0;
  }};
}

}  // namespace tapestry::tools
