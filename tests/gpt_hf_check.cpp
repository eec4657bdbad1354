// Checks models::load_gpt2_hf against a GPT-2 checkpoint in Hugging Face's layout written by
// `tools/reference/gpt_ref.py write-hf` (random weights, with or without the "transformer."
// prefix, carrying the old attn.bias / attn.masked_bias buffers that the loader must skip):
//   gpt_hf_check FILE.safetensors
// 1. The config inferred from the shapes matches the file, and the logits of the file's
//    test.input_ids (eval mode) match its test.logits (a plain PyTorch GPT-2 forward) to 1e-4.
// 2. Damaged copies (written beside FILE, then removed) fail with a tapestry::Error naming the
//    fault: one without "h.0.mlp.c_fc.bias", one with "h.1.mlp.c_fc.weight" stored transposed
//    (Linear's [out, in] instead of Conv1D's [in, out]); and a head count that does not divide
//    the width is refused.
// Exit status 0 when all pass, 1 on any failure (each one printed), 2 on bad usage.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "tapestry/autograd/grad_mode.h"
#include "tapestry/models/gpt.h"
#include "tapestry/nn/safetensors.h"
#define DOCTEST_CONFIG_DISABLE  // helpers.h without doctest's runner: a program, not a test suite
#include "tests/checker.h"
#include "tests/helpers.h"  // error_of

using namespace tapestry;
using tapestry::testing::error_of;

namespace {

testing::Checker check("gpt_hf_check");

void fail(const std::string& what) { check.fail(what); }

// Writes `tensors` (with the original metadata) to `path`, loads it with load_gpt2_hf and
// requires an Error whose message contains `needle`. Removes the file afterwards.
void expect_load_error(const std::string& what, const std::string& path, const nn::NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata, int64_t heads, const std::string& needle) {
  nn::save_safetensors(path, tensors, metadata);
  std::string msg = error_of([&] { models::load_gpt2_hf(path, heads); });
  std::remove(path.c_str());
  if (msg.empty())
    fail(what + ": load_gpt2_hf accepted it");
  else if (msg.find(needle) == std::string::npos)
    fail(what + ": the error does not name '" + needle + "': " + msg);
  else
    check.note(fmt::format("{}: refused as expected ({})", what, msg));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: gpt_hf_check FILE.safetensors\n");
    return testing::Checker::kUsage;
  }
  const std::string path = argv[1];
  return check.run([&] {
    nn::SafetensorsFile file = nn::load_safetensors(path);
    auto n_head = file.metadata.find("n_head");
    TP_CHECK(n_head != file.metadata.end(), "gpt_hf_check: {} has no n_head in its metadata", path);
    const int64_t heads = std::stoll(n_head->second);
    std::map<std::string, Tensor> tensors = file.as_map();
    for (const char* key : {"test.input_ids", "test.logits"})
      TP_CHECK(tensors.count(key), "gpt_hf_check: {} has no {} (write it with gpt_ref.py write-hf)", path, key);
    // GPT2LMHeadModel files prefix every transformer key; GPT2Model files do not.
    const std::string prefix = tensors.count("transformer.wte.weight") ? "transformer." : "";
    TP_CHECK(tensors.count(prefix + "wte.weight") && tensors.count(prefix + "wpe.weight"),
             "gpt_hf_check: {} has no wte/wpe weights", path);
    const Tensor wte = tensors.at(prefix + "wte.weight"), wpe = tensors.at(prefix + "wpe.weight");
    int64_t layers = 0;
    while (tensors.count(prefix + "h." + std::to_string(layers) + ".ln_1.weight")) ++layers;

    // 1. The model and its logits.
    std::shared_ptr<models::GPT> model = models::load_gpt2_hf(path, heads);
    const models::GPTConfig& c = model->config;
    if (c.vocab != wte.size(0) || c.d_model != wte.size(1) || c.block_size != wpe.size(0) || c.layers != layers ||
        c.heads != heads || c.ff_dim() != 4 * wte.size(1))
      fail(fmt::format("inferred config vocab {} d_model {} block_size {} layers {} heads {} d_ff {}; the file has "
                       "{} {} {} {} {} {}",
                       c.vocab, c.d_model, c.block_size, c.layers, c.heads, c.ff_dim(), wte.size(0), wte.size(1),
                       wpe.size(0), layers, heads, 4 * wte.size(1)));
    model->eval();
    const Tensor ids = tensors.at("test.input_ids"), expected = tensors.at("test.logits");
    Tensor logits;
    {
      NoGradGuard no_grad;
      logits = model->forward(ids);
    }
    if (logits.sizes() != expected.sizes()) {
      fail(fmt::format("logits shape {}, expected {}", logits.sizes(), expected.sizes()));
    } else {
      const double diff = tapestry::max((logits - expected).abs()).item<double>();
      const double scale = tapestry::max(expected.abs()).item<double>();
      check.note(fmt::format("{} ({}, {} layers, {} heads): logits max abs diff {:.3g} (|logits| up to {:.3g})", path,
                             prefix.empty() ? "GPT2Model keys" : "GPT2LMHeadModel keys", layers, heads, diff, scale));
      if (!(diff <= 1e-4)) fail(fmt::format("logits differ from test.logits by {:.3g} > 1e-4", diff));
    }

    // 2. Damaged copies must be refused with an Error naming the key.
    const std::string missing = prefix + "h.0.mlp.c_fc.bias";
    nn::NamedTensors without;
    for (auto& [name, t] : file.tensors)
      if (name != missing) without.emplace_back(name, t);
    if (without.size() + 1 != file.tensors.size()) fail("the file has no " + missing);
    expect_load_error("missing " + missing, path + ".missing.safetensors", without, file.metadata, heads,
                      "h.0.mlp.c_fc.bias");

    const std::string misshapen = prefix + "h.1.mlp.c_fc.weight";
    nn::NamedTensors transposed;
    for (auto& [name, t] : file.tensors)
      transposed.emplace_back(name, name == misshapen ? t.t().contiguous() : t);
    expect_load_error("transposed " + misshapen, path + ".misshapen.safetensors", transposed, file.metadata, heads,
                      "h.1.mlp.c_fc.weight");

    for (int64_t bad_heads : {int64_t(0), wte.size(1) + 1}) {
      std::string msg = error_of([&] { models::load_gpt2_hf(path, bad_heads); });
      if (msg.empty())
        fail(fmt::format("load_gpt2_hf accepted heads = {} for d_model {}", bad_heads, wte.size(1)));
      else
        check.note(fmt::format("heads {}: refused as expected ({})", bad_heads, msg));
    }
    return testing::Checker::kPassed;
  });  // an Error, or std::stoll on a bad n_head, is one failure
}
