// Batched image augmentations for training (torchvision's RandomCrop(padding) and
// RandomHorizontalFlip), drawn from a generator: a DataLoader transform passes the batch's own.
// Images are [B, C, H, W] on the CPU; the result is a new contiguous tensor of the same shape
// and dtype, never part of a graph.
#pragma once
#include <cstdint>

#include "tapestry/ops/factory.h"

namespace tapestry::data {

// Each image zero-padded by `padding` on every side, then cropped back to H x W at a random
// offset (uniform over the 2 * padding + 1 positions per axis).
Tensor random_crop(const Tensor& images, int64_t padding, Generator& gen);

// Each image mirrored left to right with probability p.
Tensor random_horizontal_flip(const Tensor& images, Generator& gen, double p = 0.5);

}  // namespace tapestry::data
