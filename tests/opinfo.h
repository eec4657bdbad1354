// An OpInfo-style table for differential testing against PyTorch (after PyTorch's own OpInfo).
//
// Each entry names one op as tapestry computes it (a C++ function of a TensorList) and as PyTorch
// computes it (a Python expression over the inputs a, b, c, ... and L, the list of all of them),
// which inputs are differentiable, and generators of sample inputs: 0-d and empty tensors,
// transposed and step-sliced (non-contiguous) layouts, expanded (stride-0) inputs, broadcast
// pairs, inf/NaN, ties, float32 and int64, and samples on which PyTorch raises, where tapestry
// must throw a tapestry::Error.
//
// Two consumers:
//   tests/test_opinfo.cpp  every sample runs (errors exactly where marked), and float64 samples
//                          pass gradcheck;
//   tests/opinfo_dump.cpp  writes every sample's inputs (with their strides), outputs, upstream
//                          gradients and input gradients to one safetensors file, which
//                          tools/reference/opinfo_ref.py replays in PyTorch (tests/opinfo.sh).
//
// To add an op: add an entry to its family's add_*_rows function (tests/opinfo.cpp) with its expression, its function,
// its differentiable inputs and sample generators; mark the samples on which PyTorch raises.
#pragma once
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "tapestry/autograd/functions.h"

namespace tapestry::opinfo {

struct Sample {
  std::string desc;            // e.g. "transposed [4, 5]"
  TensorList inputs;           // a, b, c, ... in order; each with storage of its own
  bool expect_error = false;   // PyTorch raises here, so tapestry must throw a tapestry::Error
  std::string no_gradcheck;    // non-empty: why gradcheck is skipped (a kink, ties, ...)
};

using OpFn = std::function<TensorList(const TensorList&)>;
using SampleFn = std::function<std::vector<Sample>(Generator&)>;

// How random_program may use a one-input op as a link of its chains: not at all, on any real
// input (smooth, or with kinks where gradcheck may not hold), on a positive one (it is fed
// x^2 + 0.5), or at most once per chain (it grows values: chains of them overflow to inf).
enum class Link { None, Smooth, Kinked, Positive, Grows };

struct OpInfo {
  std::string name;                   // unique, e.g. "sum_dim0"; the key of the reference's allowlist
  std::string expr;                   // PyTorch: a Python expression over a, b, c, ... and L
  OpFn fn;                            // tapestry: every output (a list for split, values+indices for max)
  std::vector<bool> differentiable;   // per input position; positions past the end are not
  std::vector<SampleFn> samples;
  Link link = Link::None;             // random_program's use of it

  bool is_differentiable(size_t i) const { return i < differentiable.size() && differentiable[i]; }
};

// The table (built once).
const std::vector<OpInfo>& op_table();

// The samples of one op, drawn from a generator seeded with `seed` and the op's name: the same
// seed gives the same samples. Fresh tensors on every call.
std::vector<Sample> make_samples(const OpInfo& op, uint64_t seed);

// "a", "b", ..., "z": the Python name of input i.
std::string input_name(size_t i);

// True when every element of a floating tensor is finite (always true for int64 and bool).
bool all_finite(const Tensor& t);

// True when some dim of size > 1 has stride 0 (an expanded view: elements share memory).
bool has_expanded_dims(const Tensor& t);

// One run of an op as the dump records it: the float inputs flagged differentiable are made
// leaves that require grad; the forward runs; then, for the floating outputs that require grad,
// one backward of sum_j <out_j, gout_j> with gout_j ~ N(0, 1) drawn from Generator(seed).
struct RunResult {
  bool threw = false;           // the forward threw
  bool foreign = false;         // ... something other than a tapestry::Error
  std::string error;            // its message
  TensorList outputs;
  TensorList gouts;             // per output; undefined where no backward went through it
  std::vector<bool> grad_input; // per input: requires grad
  TensorList grads;             // per input; zeros where no gradient reached it, undefined if !grad_input
  std::string backward_error;   // non-empty when the backward threw
  // Second order, after a first backward that worked: with random directions u (per
  // differentiable input), grads2[i] = d <grads(gouts), u> / d input i, from a backward that
  // records (create_graph) on fresh leaves; zeros where nothing reached an input.
  TensorList dirs, grads2;
  std::string backward2_error;
};
RunResult run_case(const OpFn& fn, const TensorList& inputs, const std::vector<bool>& differentiable, uint64_t seed);

// A random chain of 2-5 ops (the table's one-input ops, as their Link allows; binary ops against new leaves with broadcasting, views,
// reductions, matmul) on small random shapes. Every input is a float64 leaf and differentiable.
struct Program {
  std::string expr;     // the whole chain as one Python expression
  std::string desc;     // the op names, e.g. "exp > transpose > add(bcast) > sum"
  TensorList inputs;
  OpFn fn;              // returns one output
  bool smooth = true;   // no kinks or ties possible (no relu, abs, clamp, max, maximum, minimum)
};
Program random_program(std::mt19937_64& rng);

}  // namespace tapestry::opinfo
