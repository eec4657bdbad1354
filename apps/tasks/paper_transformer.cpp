// The paper's model, optimizer and schedule (see paper_transformer.h).
#include "apps/tasks/paper_transformer.h"

namespace tapestry::apps {

namespace {

std::vector<Tensor> parameters_on(nn::Module& model, Device device) {
  model.to(device);
  return model.parameters();
}

optim::AdamOptions paper_adam() {
  optim::AdamOptions o;
  o.beta1 = 0.9, o.beta2 = 0.98, o.eps = 1e-9;
  return o;
}

}  // namespace

PaperTransformer::PaperTransformer(const models::TransformerConfig& config, Device device, int64_t warmup,
                                   double lr_factor)
    : model(config), adam(parameters_on(model, device), paper_adam()), schedule(config.d_model, warmup, lr_factor) {}

}  // namespace tapestry::apps
