// tapestry: the engine's public API in one include (ops, autograd, nn, data, optim, models). Data
// parallelism is a component of its own: <tapestry/dist/dist.h>, linked as tapestry::dist.
#pragma once
#include "tapestry/version.h"
#include "tapestry/autograd/anomaly.h"
#include "tapestry/autograd/checkpoint.h"
#include "tapestry/autograd/functional.h"
#include "tapestry/autograd/functions.h"
#include "tapestry/autograd/grad_mode.h"
#include "tapestry/autograd/gradcheck.h"
#include "tapestry/autograd/node.h"
#include "tapestry/data/dataloader.h"
#include "tapestry/data/idx.h"
#include "tapestry/data/transforms.h"
#include "tapestry/models/bert.h"
#include "tapestry/models/gpt.h"
#include "tapestry/models/llama.h"
#include "tapestry/models/transformer.h"
#include "tapestry/models/vit.h"
#include "tapestry/nn/init.h"
#include "tapestry/nn/layers.h"
#include "tapestry/nn/lora.h"
#include "tapestry/nn/module.h"
#include "tapestry/nn/safetensors.h"
#include "tapestry/ops/autocast.h"
#include "tapestry/ops/cuda.h"
#include "tapestry/ops/factory.h"
#include "tapestry/ops/file.h"
#include "tapestry/ops/profile.h"
#include "tapestry/ops/runtime.h"
#include "tapestry/ops/tensor.h"
#include "tapestry/optim/optimizer.h"

namespace tapestry {
constexpr const char* kVersion = TAPESTRY_VERSION;  // tapestry/version.h, from project() in CMakeLists.txt
}
