// Writes a small ViT's weights, a batch of images and labels, and tapestry's logits, loss, every
// parameter gradient and the parameters after one AdamW step (decay on matrices only, as the
// image task) to a safetensors file, for `tools/reference/vit_ref.py check` to verify against
// the same model built from torch.nn.TransformerEncoderLayer.
//   vit_parity_dump OUT.safetensors
// Keys: the state_dict's names, batch.images [3, 2, 8, 8], batch.labels [3], out.logits,
// out.loss, grad.<param>, adamw.<param>. Metadata: the config, AdamW's settings, the decay group.
#include <cstdio>
#include <map>
#include <string>

#include "tapestry/autograd/grad_mode.h"
#include "tapestry/models/vit.h"
#include "tapestry/nn/safetensors.h"
#include "tapestry/optim/optimizer.h"
#include "tests/hvp_dump.h"

using namespace tapestry;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: vit_parity_dump OUT.safetensors\n");
    return 2;
  }
  try {
    manual_seed(21);
    models::ViTConfig c;
    // Two channels and a 3x3 grid of overlapping 4x4 patches: a wrong channel or patch order shows.
    c.image_size = 8, c.channels = 2, c.patch_size = 4, c.patch_stride = 2, c.classes = 5;
    c.d_model = 16, c.layers = 2, c.heads = 4, c.d_ff = 24, c.dropout = 0.0;
    const double lr = 1e-3, weight_decay = 0.05;
    models::ViT model(c);
    {
      NoGradGuard no_grad;  // the init's 0.02 weights hide swapped parts: make every one matter
      for (auto& [name, p] : model.named_parameters()) p.add_(randn(p.sizes()).mul_(0.2));
    }
    Tensor images = randn({3, 2, 8, 8}), labels = tensor({4, 0, 2});

    nn::NamedTensors dump;
    for (auto& [name, p] : model.state_dict()) dump.emplace_back(name, p.clone().detach());
    dump.emplace_back("batch.images", images);
    dump.emplace_back("batch.labels", labels);
    const nn::NamedTensors named = model.named_parameters();
    Tensor logits = model.forward(images);
    Tensor loss = model.loss(images, labels);
    loss.backward();
    dump.emplace_back("out.logits", logits.detach());
    dump.emplace_back("out.loss", loss.detach());
    for (auto& [name, p] : named) {
      TP_CHECK(p.grad().defined(), "vit_parity_dump: parameter {} got no gradient", name);
      dump.emplace_back("grad." + name, p.grad().clone());
    }
    // A Hessian-vector product at the same weights (second-order parity, tests/hvp_dump.h).
    testing::dump_hvp(dump, named, [&] { return model.loss(images, labels); }, 17);
    std::vector<Tensor> decay, no_decay;
    std::string decay_names;
    for (auto& [name, p] : named) {
      const bool d = p.dim() >= 2 && name != "cls_token" && name != "pos_embed";
      (d ? decay : no_decay).push_back(p);
      if (d) decay_names += (decay_names.empty() ? "" : ",") + name;
    }
    optim::AdamWOptions ao;
    ao.lr = lr, ao.weight_decay = weight_decay;
    optim::AdamW adamw(std::vector<optim::ParamGroup>{{decay, std::nullopt, weight_decay}, {no_decay, std::nullopt, 0.0}},
                       ao);
    adamw.step();
    for (auto& [name, p] : named) dump.emplace_back("adamw." + name, p.clone().detach());

    auto num = [](double v) { return fmt::format("{}", v); };
    nn::save_safetensors(argv[1], dump,
                         {{"image_size", std::to_string(c.image_size)}, {"channels", std::to_string(c.channels)},
                          {"patch_size", std::to_string(c.patch_size)}, {"patch_stride", std::to_string(c.stride())},
                          {"classes", std::to_string(c.classes)},
                          {"d_model", std::to_string(c.d_model)},       {"layers", std::to_string(c.layers)},
                          {"heads", std::to_string(c.heads)},           {"d_ff", std::to_string(c.d_ff)},
                          {"ln_eps", num(c.ln_eps)},                    {"activation", c.activation},
                          {"adamw_lr", num(lr)},                        {"weight_decay", num(weight_decay)},
                          {"decay_params", decay_names}});
    std::printf("vit_parity_dump: wrote %s (%zu parameters, loss %.6f)\n", argv[1], named.size(), loss.item<double>());
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "vit_parity_dump: %s\n", e.what());
    return 1;
  }
}
