// tapestry: the whole public API in one include.
#pragma once
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "autograd/node.h"
#include "ops/factory.h"
#include "ops/tensor.h"

namespace tapestry {
constexpr const char* kVersion = TAPESTRY_VERSION;  // from CMakeLists.txt project()
}
