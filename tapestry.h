// tapestry: the whole public API in one include.
#pragma once
#include "autograd/anomaly.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "autograd/node.h"
#include "models/transformer.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "nn/safetensors.h"
#include "ops/factory.h"
#include "ops/tensor.h"
#include "optim/optimizer.h"

namespace tapestry {
constexpr const char* kVersion = TAPESTRY_VERSION;  // from CMakeLists.txt project()
}
