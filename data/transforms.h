// Batched image augmentations for training (torchvision's RandomCrop(padding) and
// RandomHorizontalFlip), drawn from a generator: a DataLoader transform passes the batch's own.
// Images are [B, C, H, W] on the CPU; the result is a new contiguous tensor of the same shape
// and dtype, never part of a graph.
#pragma once
#include <cstdint>
#include <vector>

#include "tapestry/data/dataloader.h"
#include "tapestry/ops/factory.h"

namespace tapestry::data {

// Each image zero-padded by `padding` on every side, then cropped back to H x W at a random
// offset (uniform over the 2 * padding + 1 positions per axis).
Tensor random_crop(const Tensor& images, int64_t padding, Generator& gen);

// Each image mirrored left to right with probability p.
Tensor random_horizontal_flip(const Tensor& images, Generator& gen, double p = 0.5);

// torchvision's Normalize: (x - mean[c]) / std[c] on each channel c of floating-point images
// [B, C, H, W] or [C, H, W] (one value stands for every channel), on any device, differentiable.
// mean and std need one value per channel, finite, and std above 0.
Tensor normalize(const Tensor& images, const std::vector<double>& mean, const std::vector<double>& std);

// The same as a DataLoader transform (its batch's data normalized; the target untouched):
//   data::DataLoader loader(ds, o, data::Normalize{{0.2860}, {0.3530}});
struct Normalize {
  std::vector<double> mean, std;
  Batch operator()(Batch b, Generator&) const {
    b.data = normalize(b.data, mean, std);
    return b;
  }
};

}  // namespace tapestry::data
