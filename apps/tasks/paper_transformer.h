// The Transformer as the paper trains it (section 5.3): Adam with beta (0.9, 0.98) and eps 1e-9,
// the learning rate on the Noam schedule. The translation and copy tasks both start from it.
#pragma once
#include <cstdint>

#include "tapestry/models/transformer.h"
#include "tapestry/optim/optimizer.h"

namespace tapestry::apps {

struct PaperTransformer {
  // The model is placed on `device` before the optimizer is built, whose state follows it.
  PaperTransformer(const models::TransformerConfig& config, Device device, int64_t warmup, double lr_factor);
  models::Transformer model;
  optim::Adam adam;
  optim::NoamSchedule schedule;
};

}  // namespace tapestry::apps
