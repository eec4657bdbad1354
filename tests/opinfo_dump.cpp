// Runs every sample of the OpInfo table (tests/opinfo.h), and optionally N random op programs,
// through tapestry and writes everything into one safetensors file for
// tools/reference/opinfo_ref.py to replay in PyTorch (tests/opinfo.sh runs both):
//
//   opinfo_dump OUT.safetensors [--seed N] [--random-programs N]
//
// Per case K: tensors "cK.in0", "cK.in1", ... (each input's values, contiguous); then either
// the error tapestry threw, or the outputs "cK.out" (or "cK.out0", "cK.out1", ... for a list,
// or values + indices), the random upstream gradients "cK.gout" / "cK.gout0"... of the
// floating outputs that require grad, and the input gradients "cK.grad0", ... (zeros when no
// gradient reached the input). The metadata key "opinfo" holds one JSON document:
//   {"seed": N, "cases": [{"id", "kind" (table|program), "op", "expr", "sample", "expect_error",
//     "inputs": [{"tensor", "name", "dtype", "shape", "strides", "offset", "grad"}],
//     "error", "foreign_error", "outputs", "gouts", "grads", "backward_error"}]}
// Each input's strides and storage offset are recorded so that the reference can rebuild the
// same layout (transposed, step-sliced, expanded) before running the expression.
#include <cstdio>
#include <exception>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tapestry/nn/safetensors.h"
#include "tests/opinfo.h"

using namespace tapestry;
using namespace tapestry::opinfo;
using json = nlohmann::json;

namespace {


json null_or(const std::string& s) { return s.empty() ? json(nullptr) : json(s); }

struct Dump {
  std::vector<std::pair<std::string, Tensor>> tensors;
  json cases = json::array();
  int64_t n = 0, errors = 0;

  void add(const std::string& kind, const std::string& op, const std::string& expr, const std::string& sample,
           bool expect_error, const OpFn& fn, const TensorList& inputs, const std::vector<bool>& differentiable,
           uint64_t seed) {
    const std::string id = "c" + std::to_string(n++);
    json c;
    c["id"] = id;
    c["kind"] = kind;
    c["op"] = op;
    c["expr"] = expr;
    c["sample"] = sample;
    c["expect_error"] = expect_error;

    json ins = json::array();
    for (size_t i = 0; i < inputs.size(); ++i) {
      const Tensor& x = inputs[i];
      const std::string name = id + ".in" + std::to_string(i);
      tensors.emplace_back(name, x.detach());
      ins.push_back({{"tensor", name},
                     {"name", input_name(i)},
                     {"dtype", nn::safetensors_dtype(x.dtype())},
                     {"shape", x.sizes()},
                     {"strides", x.strides()},
                     {"offset", x.offset()},
                     {"grad", false}});
    }

    RunResult r = run_case(fn, inputs, differentiable, seed);
    for (size_t i = 0; i < inputs.size(); ++i) ins[i]["grad"] = static_cast<bool>(r.grad_input[i]);
    c["inputs"] = ins;
    c["error"] = r.threw ? json(r.error) : json(nullptr);
    c["foreign_error"] = r.foreign;
    json outs = json::array(), gouts = json::array(), grads = json::array();
    if (r.threw) {
      ++errors;
    } else {
      const bool multi = r.outputs.size() != 1;
      for (size_t j = 0; j < r.outputs.size(); ++j) {
        const std::string suffix = multi ? std::to_string(j) : "";
        const std::string name = id + ".out" + suffix;
        tensors.emplace_back(name, r.outputs[j].detach());
        outs.push_back(name);
        if (r.gouts[j].defined()) {
          const std::string gname = id + ".gout" + suffix;
          tensors.emplace_back(gname, r.gouts[j]);
          gouts.push_back(gname);
        } else {
          gouts.push_back(nullptr);
        }
      }
      for (size_t i = 0; i < inputs.size(); ++i) {
        if (r.grads[i].defined() && r.backward_error.empty()) {
          const std::string name = id + ".grad" + std::to_string(i);
          tensors.emplace_back(name, r.grads[i].detach());
          grads.push_back(name);
        } else {
          grads.push_back(nullptr);
        }
      }
    }
    c["outputs"] = outs;
    c["gouts"] = gouts;
    c["grads"] = grads;
    c["backward_error"] = null_or(r.backward_error);
    // Second order (RunResult::grads2): the directions and d <J^T gout, u> / d input.
    json dirs = json::array(), grads2 = json::array();
    for (size_t i = 0; i < r.grads2.size(); ++i) {
      if (r.grads2[i].defined() && r.backward2_error.empty()) {
        const std::string d = id + ".dir" + std::to_string(i), g2 = id + ".gradgrad" + std::to_string(i);
        tensors.emplace_back(d, r.dirs[i]);
        tensors.emplace_back(g2, r.grads2[i].detach());
        dirs.push_back(d);
        grads2.push_back(g2);
      } else {
        dirs.push_back(nullptr);
        grads2.push_back(nullptr);
      }
    }
    c["dirs"] = dirs;
    c["grads2"] = grads2;
    c["backward2_error"] = null_or(r.backward2_error);
    cases.push_back(std::move(c));
  }
};

int usage() {
  std::fprintf(stderr, "usage: opinfo_dump OUT.safetensors [--seed N] [--random-programs N]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out;
  uint64_t seed = 1;
  long long programs = 0;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--seed" && i + 1 < argc) {
        seed = std::stoull(argv[++i]);
      } else if (a == "--random-programs" && i + 1 < argc) {
        programs = std::stoll(argv[++i]);
      } else if (!a.empty() && a[0] != '-' && out.empty()) {
        out = a;
      } else {
        return usage();
      }
    }
  } catch (const std::exception&) {
    return usage();
  }
  if (out.empty() || programs < 0) return usage();

  try {
    Dump d;
    size_t n_ops = 0;
    for (const OpInfo& op : op_table()) {
      ++n_ops;
      for (const Sample& s : make_samples(op, seed))
        d.add("table", op.name, op.expr, s.desc, s.expect_error, op.fn, s.inputs, op.differentiable,
              seed * 1000003u + static_cast<uint64_t>(d.n));
    }
    const int64_t table_cases = d.n;
    std::mt19937_64 rng(seed);
    for (long long i = 0; i < programs; ++i) {
      Program p = random_program(rng);
      d.add("program", "program", p.expr, p.desc, false, p.fn, p.inputs, std::vector<bool>(p.inputs.size(), true),
            seed * 1000003u + static_cast<uint64_t>(d.n));
    }
    json meta = {{"seed", seed}, {"cases", d.cases}};
    nn::save_safetensors(out, d.tensors,
                         {{"opinfo", meta.dump(-1, ' ', false, json::error_handler_t::replace)}});
    std::printf("opinfo_dump: wrote %s: %lld table cases from %zu ops, %lld random programs, %lld tapestry errors\n",
                out.c_str(), static_cast<long long>(table_cases), n_ops, programs, static_cast<long long>(d.errors));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "opinfo_dump: %s\n", e.what());
    return 1;
  }
}
