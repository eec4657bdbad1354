// Image classification with the Vision Transformer (`tapestry train --task image`): an
// MNIST-layout folder of IDX files (Fashion-MNIST from Debian's dataset-fashion-mnist by
// default) read with data::read_mnist, a validation split held out of the training images by a
// fixed seed (the test images are read once, at the end), shuffled batches with light
// augmentation (random crop with padding, horizontal flip), AdamW with warmup and cosine decay,
// validation accuracy after each epoch, then the test accuracy and its confusion matrix
// (confusion.txt, confusion.svg).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "apps/train/run_setup.h"
#include "apps/train/trainer.h"
#include "tapestry/models/vit.h"

namespace tapestry::apps {

struct ImageOptions {
  TrainerOptions trainer = [] {
    TrainerOptions t;
    t.epochs = 30;
    t.out_dir = "runs/vit";
    t.seed = 1;
    t.keep = 1;
    t.average = 0;
    return t;
  }();
  std::string data_dir;          // empty: default_image_dir()
  std::string config = "fmnist";  // models::ViTConfig::named
  int64_t patch = 0, patch_stride = 0;  // 0: the config's patch size; non-overlapping
  int64_t batch = 128;
  AdamWCosine adamw = {300, 2e-3, 1e-5, 0.05};  // warmup steps, lr, min-lr, weight decay
  double dropout = 0.0, label_smoothing = 0.0;
  int64_t val_size = 5000;       // training images held out for validation
  // Augmentation: light, since this small model underfits under more (crop padding 2 + flip:
  // val 89.74%) and overfits under none (90.04%); padding 1 + flip gave 90.94% (docs/training.md,
  // "Images", 30 epochs, tuned on val).
  int64_t crop_padding = 1;      // random crop after zero-padding this much (0: no crop)
  bool flip = true;              // random horizontal flips
  int64_t limit = 0;             // train on the first N training images only (0: all)
  int64_t classes = 0;           // the class count (0: the config's); every label must be below it
};

// Pixels standardised as (x - mean) / std, the training split's figures.
struct Normalization {
  double mean = 0, std = 1;
  Tensor apply(const Tensor& images) const;
};

// $TAPESTRY_IMAGE_DATA, else Debian's Fashion-MNIST (/usr/share/datasets/fashion-mnist).
std::string default_image_dir();
// Fashion-MNIST's class names when the folder is Fashion-MNIST's, else "0" .. "9".
std::vector<std::string> class_names(const std::string& data_dir, int64_t classes);

OptionTable options_table(ImageOptions& options);

struct ImageResult {
  int64_t steps = 0, parameters = 0;
  double val_accuracy = 0, test_accuracy = 0, seconds = 0, images_per_s = 0;
  std::vector<std::vector<int64_t>> confusion;  // [true][predicted] on the test images
  bool stopped = false;
  int interrupted = 0;
};

ImageResult train_image_classifier(const ImageOptions& options);

// A ViT from a run folder train_image_classifier wrote (its config from the weights' metadata).
struct ImageClassifier {
  std::shared_ptr<models::ViT> model;
  std::string data_dir;
  std::vector<std::string> names;
  Normalization norm;  // apply to images before the model
};
ImageClassifier load_image_classifier(const std::string& checkpoint_dir);

// Mean cross-entropy, accuracy (0..1) and the confusion matrix ([true][predicted]) of a model
// over images [N, C, H, W] with labels [N], in batches, without gradients: one forward each.
struct ImageScores {
  double loss = 0, accuracy = 0;
  std::vector<std::vector<int64_t>> confusion;
};
ImageScores score_images(models::ViT& model, const Tensor& images, const Tensor& labels, int64_t batch);

}  // namespace tapestry::apps
