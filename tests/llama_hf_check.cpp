// Checks models::load_llama_hf and models::Llama against a Hugging Face checkpoint directory that
// `tools/reference/llama_ref.py write-hf` wrote (a tiny random Llama with grouped-query attention),
// and writes what tapestry computes for `llama_ref.py check` to recompute in PyTorch:
//   llama_hf_check DIR DUMP.safetensors
// 1. The config read from config.json, and the weights in float32 whatever the files stored.
// 2. DUMP: a batch (batch.ids, batch.targets [3, 10] with ignored targets), out.logits, out.loss,
//    grad.<key> for every parameter under its Hugging Face key, adamw.<key> after one AdamW step
//    (decay on matrices only; the settings in the metadata), and gen.prompt [8] with gen.cached
//    and gen.uncached: 50 greedy tokens with the KV cache and without it, which must be equal here.
//    A batch of two prompts of different lengths (left-padded) must also generate the same with
//    and without the cache.
// 3. Damaged copies of DIR (made beside it, then removed) fail with one tapestry::Error naming the
//    file and the tensor or field: a missing shard, a config.json whose intermediate_size
//    disagrees with the tensors, a shard in a dtype the reader does not read (F8_E4M3), no
//    config.json, a config with rope_scaling, and an unexpected tensor.
// Exit status 0 when all pass, 1 on any failure (each one printed), 2 on bad usage.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tapestry/autograd/grad_mode.h"
#include "tapestry/models/llama.h"
#include "tapestry/nn/safetensors.h"
#include "tapestry/optim/optimizer.h"
#define DOCTEST_CONFIG_DISABLE  // helpers.h without doctest's runner: a program, not a test suite
#include "tests/checker.h"
#include "tests/hvp_dump.h"
#include "tests/helpers.h"  // error_of

using namespace tapestry;
using tapestry::testing::error_of;
namespace fs = std::filesystem;

namespace {

testing::Checker check("llama_hf_check");

std::string hf_key(const std::string& name) { return name == "lm_head.weight" ? name : "model." + name; }

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// A copy of `dir` changed by `damage`, loaded: the Error must contain every needle.
template <class Damage>
void expect_refused(const std::string& what, const std::string& dir, Damage damage,
                    const std::vector<std::string>& needles) {
  const std::string copy = dir + ".damaged";
  fs::remove_all(copy);
  fs::copy(dir, copy, fs::copy_options::recursive);
  damage(copy);
  const std::string msg = error_of([&] { models::load_llama_hf(copy); });
  fs::remove_all(copy);
  if (msg.empty()) {
    check.fail(what + ": load_llama_hf accepted it");
    return;
  }
  for (const std::string& needle : needles)
    if (msg.find(needle) == std::string::npos) {
      check.fail(what + ": the error does not name '" + needle + "': " + msg);
      return;
    }
  check.note(fmt::format("{}: refused ({})", what, msg));
}

// A safetensors file by hand, holding one tensor in a dtype tapestry does not read.
void write_f8_file(const std::string& path, const std::string& key) {
  std::string header = "{\"" + key + "\":{\"dtype\":\"F8_E4M3\",\"shape\":[4],\"data_offsets\":[0,4]}}";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string bytes(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  write_text(path, bytes + header + std::string(4, '\x38'));
}

std::string replace_once(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  TP_CHECK(at != std::string::npos, "llama_hf_check: '{}' not found", from);
  return text.replace(at, from.size(), to);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: llama_hf_check DIR DUMP.safetensors\n");
    return testing::Checker::kUsage;
  }
  const std::string dir = argv[1], out = argv[2];
  return check.run([&] {
    // 1. The config and the weights.
    const models::LlamaConfig c = models::read_llama_hf_config(dir + "/config.json");
    std::shared_ptr<models::Llama> model = models::load_llama_hf(dir);
    check.note(fmt::format("{}: vocab {}, {} layers, {} heads ({} key/value), d_model {}, d_ff {}, theta {}, eps {}, "
                           "{} head, {} parameters", dir, c.vocab, c.layers, c.heads, c.kv_heads, c.d_model, c.d_ff,
                           c.rope_theta, c.rms_eps, c.tie_embeddings ? "tied" : "untied", model->num_parameters()));
    check.expect(model->config.kv_heads < model->config.heads, "the checkpoint should use grouped-query attention");
    for (auto& [name, p] : model->named_parameters())
      check.expect(p.dtype() == DType::Float32, name + " is not float32");

    // 2. Forward, loss, gradients, one AdamW step.
    model->train();
    Tensor ids = tensor(std::vector<int64_t>{5, 17, 3, 9, 22, 0, 14, 8, 11, 2,  //
                                             7, 7, 1, 19, 4, 13, 6, 21, 10, 15,  //
                                             12, 3, 18, 20, 9, 16, 1, 5, 0, c.vocab - 1},
                        {3, 10});
    Tensor targets = tensor({17, 3, 9, 22, 0, 14, 8, 11, 2, -100,    //
                             7, 1, 19, -100, 13, 6, 21, 10, 15, 4,   //
                             -100, -100, 20, 9, 16, 1, 5, 0, 22, 6},
                            {3, 10});
    nn::NamedTensors dump{{"batch.ids", ids}, {"batch.targets", targets}};
    Tensor logits = model->forward(ids);
    Tensor loss = model->loss(ids, targets);
    loss.backward();
    dump.emplace_back("out.logits", logits.detach());
    dump.emplace_back("out.loss", loss.detach());
    const nn::NamedTensors named = model->named_parameters();
    for (auto& [name, p] : named) {
      if (!check.expect(p.grad().defined(), name + " got no gradient")) continue;
      dump.emplace_back("grad." + hf_key(name), p.grad().clone());
    }
    {  // A Hessian-vector product at the same weights (second-order parity, tests/hvp_dump.h).
      nn::NamedTensors by_hf_key;
      for (auto& [name, p] : named) by_hf_key.emplace_back(hf_key(name), p);
      testing::dump_hvp(dump, by_hf_key, [&] { return model->loss(ids, targets); }, 19);
    }
    const double lr = 1e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
    optim::AdamWOptions ao;
    ao.lr = lr, ao.beta1 = beta1, ao.beta2 = beta2, ao.eps = eps, ao.weight_decay = 0.0;
    optim::AdamW adamw({{model->decay_parameters(), std::nullopt, weight_decay},
                        {model->no_decay_parameters(), std::nullopt, 0.0}},
                       ao);
    adamw.step();
    for (auto& [name, p] : named) dump.emplace_back("adamw." + hf_key(name), p.clone().detach());

    // Greedy generation from the loaded weights, with and without the cache.
    model = models::load_llama_hf(dir);
    const std::vector<int64_t> prompt{1, 40, 2, 33, 7, 61, 12, 5};
    models::SampleOptions so;
    so.greedy = true, so.max_new = 50;
    const std::vector<int64_t> cached = models::generate(*model, {prompt}, so)[0];
    so.use_cache = false;
    const std::vector<int64_t> uncached = models::generate(*model, {prompt}, so)[0];
    check.expect(cached.size() == 50, fmt::format("generated {} tokens, not 50", cached.size()));
    check.expect(cached == uncached, "50 greedy tokens differ with and without the KV cache");
    const std::vector<std::vector<int64_t>> two{{3, 9, 27}, prompt};  // left-padded into one batch
    so.max_new = 20;
    const auto batch_uncached = models::generate(*model, two, so);
    so.use_cache = true;
    check.expect(models::generate(*model, two, so) == batch_uncached,
                 "a left-padded batch generates differently with and without the cache");
    dump.emplace_back("gen.prompt", tensor(prompt, {static_cast<int64_t>(prompt.size())}));
    dump.emplace_back("gen.cached", tensor(cached, {static_cast<int64_t>(cached.size())}));
    dump.emplace_back("gen.uncached", tensor(uncached, {static_cast<int64_t>(uncached.size())}));
    auto num = [](double v) { return fmt::format("{}", v); };
    nn::save_safetensors(out, dump,
                         {{"adamw_lr", num(lr)}, {"adamw_beta1", num(beta1)}, {"adamw_beta2", num(beta2)},
                          {"adamw_eps", num(eps)}, {"weight_decay", num(weight_decay)}});
    check.note(fmt::format("wrote {} (loss {:.6f}); greedy 50 tokens equal with and without the cache", out,
                           loss.item<double>()));

    // 3. Damaged copies.
    const bool sharded = fs::exists(dir + "/model.safetensors.index.json");
    if (sharded) {
      const std::string last = fmt::format("model-{:05d}-of-{:05d}.safetensors", 3, 3);
      expect_refused("a missing shard", dir, [&](const std::string& d) { fs::remove(d + "/" + last); }, {last});
      expect_refused("a shard in F8_E4M3", dir, [&](const std::string& d) {
        write_f8_file(d + "/model-extra.safetensors", "model.layers.0.mlp.scale");
        const std::string index = d + "/model.safetensors.index.json";
        write_text(index, replace_once(read_text(index), "\"weight_map\": {",
                                       "\"weight_map\": {\n    \"model.layers.0.mlp.scale\": \"model-extra.safetensors\","));
      }, {"model-extra.safetensors", "model.layers.0.mlp.scale", "F8_E4M3"});
    }
    expect_refused("config.json's intermediate_size disagreeing with the tensors", dir, [&](const std::string& d) {
      const std::string cfg = d + "/config.json";
      write_text(cfg, replace_once(read_text(cfg), fmt::format("\"intermediate_size\": {}", c.d_ff),
                                   fmt::format("\"intermediate_size\": {}", c.d_ff + 8)));
    }, {"model.layers.0.mlp.gate_proj.weight", ".safetensors", "config.json"});
    expect_refused("no config.json", dir, [&](const std::string& d) { fs::remove(d + "/config.json"); },
                   {"config.json"});
    expect_refused("rope_scaling", dir, [&](const std::string& d) {
      const std::string cfg = d + "/config.json";
      write_text(cfg, replace_once(read_text(cfg), "\"rope_scaling\": null",
                                   "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0}"));
    }, {"config.json", "rope_scaling"});
    expect_refused("an unexpected tensor", dir, [&](const std::string& d) {
      write_text(d + "/config.json", replace_once(read_text(d + "/config.json"), "\"num_hidden_layers\": 2",
                                                  "\"num_hidden_layers\": 1"));
    }, {"unexpected tensor 'model.layers.1."});
    return testing::Checker::kPassed;
  });
}
