// Activation checkpointing, as PyTorch's torch.utils.checkpoint (the reentrant kind): a segment
// of the forward runs without recording, only its inputs are kept, and backward runs it again
// (with the default generator's state of the first run, so dropout draws the same masks) and
// backpropagates through that recomputation. A model then holds one segment's activations at a
// time during backward instead of every segment's, for one more forward of compute.
//
//   Tensor y = checkpoint([block](const TensorList& in) { return block->forward(in[0]); }, {x});
//
// The gradients are those of calling fn directly, to the bit, where each input and parameter has
// at most two uses (the recomputation runs the same kernels on the same values; a sum of two
// terms has one order). A tensor with more uses inside and outside segments gets each segment's
// part already summed, so its sum is associated differently: equal to rounding. fn must compute its result from `inputs` and from tensors that are
// leaves (parameters, whose gradients accumulate during the recomputation's backward) or need no
// gradient (masks, tables); a non-leaf tensor requiring grad that fn reads any other way gets no
// gradient through it. fn is kept until backward: capture by value. Under NoGradGuard, or when
// no input requires grad, fn simply runs (and records, in the second case).
#pragma once
#include <functional>

#include "tapestry/autograd/functions.h"

namespace tapestry {

Tensor checkpoint(const std::function<Tensor(const TensorList&)>& fn, const TensorList& inputs);

}  // namespace tapestry
