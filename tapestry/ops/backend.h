// The backends behind ops/dispatch.cpp: every kernel entry point of ops/kernel_entries.h, declared
// again in kernels::cpu (ops/cpu/, always built) and kernels::cuda (ops/cuda/, built with
// -DTAPESTRY_CUDA=ON). Only the dispatcher and the backends include this header; everything
// else calls the dispatching entries of ops/kernels.h.
#pragma once
#include <cstddef>
#include <string>

#include "tapestry/ops/kernels.h"

namespace tapestry::kernels::cpu {
#include "tapestry/ops/kernel_entries.h"
}  // namespace tapestry::kernels::cpu

namespace tapestry::kernels::cuda {
#include "tapestry/ops/kernel_entries.h"
}  // namespace tapestry::kernels::cuda
