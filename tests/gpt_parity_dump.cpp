// Writes a small GPT's weights, one batch (with ignored targets), and tapestry's logits, loss,
// every parameter gradient and the parameters after two AdamW steps (decay and no-decay
// groups) to a safetensors file, for `tools/reference/gpt_ref.py check` to verify against the
// same model in PyTorch.
//   gpt_parity_dump OUT.safetensors
//
// Keys: the state_dict's names (weights before any step), batch.ids / batch.targets [3, 10],
// out.logits [3, 10, V] (forward), out.loss (loss), grad.<param>, adamw.<param> (after step 1);
// then, with the moved weights and the same batch, out.loss2, grad2.<param>, adamw2.<param>
// (after step 2, which exercises the moment buffers and bias corrections). The metadata holds
// the config, the optimizer settings and the names in each parameter group.
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tapestry/autograd/grad_mode.h"
#include "tapestry/models/gpt.h"
#include "tapestry/nn/safetensors.h"
#include "tapestry/optim/optimizer.h"
#include "tests/hvp_dump.h"

using namespace tapestry;

namespace {

// The names (in named_parameters order) of the parameters in `group`, matched by identity.
std::string names_in(const nn::NamedTensors& named, const std::vector<Tensor>& group) {
  std::set<const void*> members;
  for (const Tensor& t : group) members.insert(t.impl_ptr().get());
  std::string out;
  for (auto& [name, p] : named)
    if (members.count(p.impl_ptr().get())) out += (out.empty() ? "" : ",") + name;
  return out;
}

void dump_grads(nn::NamedTensors& dump, const nn::NamedTensors& named, const std::string& prefix) {
  for (auto& [name, p] : named) {
    TP_CHECK(p.grad().defined(), "gpt_parity_dump: parameter {} got no gradient", name);
    dump.emplace_back(prefix + name, p.grad().clone());
  }
}

void dump_params(nn::NamedTensors& dump, const nn::NamedTensors& named, const std::string& prefix) {
  for (auto& [name, p] : named) dump.emplace_back(prefix + name, p.clone().detach());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: gpt_parity_dump OUT.safetensors\n");
    return 2;
  }
  try {
    const std::string out = argv[1];
    manual_seed(13);
    models::GPTConfig c;
    c.vocab = 23, c.block_size = 16, c.layers = 2, c.heads = 4, c.d_model = 32;
    c.dropout = 0.0, c.gelu_tanh = true;
    const double lr = 1e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
    models::GPT model(c);
    // GPT-2's init leaves biases at 0 and LayerNorm at (1, 0), and its 0.02 weights make the
    // attention almost uniform: a swapped LayerNorm weight and bias, a missing bias or a wrong
    // score scale would barely show. N(0, 0.1) added to every parameter makes each one matter.
    {
      NoGradGuard no_grad;
      for (auto& [name, p] : model.named_parameters()) p.add_(randn(p.sizes()).mul_(0.1));
    }

    // B=3, T=10 (shorter than block_size: the position rows 10..15 get no gradient, so the AdamW
    // step moves them by the weight decay alone). Targets include -100 (ignored) at the ends and
    // in the middle, and the ids 0 and V-1.
    Tensor ids = tensor({5, 17, 3, 9, 22, 0, 14, 8, 11, 2,     //
                         7, 7, 1, 19, 4, 13, 6, 21, 10, 15,    //
                         12, 3, 18, 20, 9, 16, 1, 5, 0, 22},
                        {3, 10});
    Tensor targets = tensor({17, 3, 9, 22, 0, 14, 8, 11, 2, -100,      //
                             7, 1, 19, -100, 13, 6, 21, 10, 15, 4,     //
                             -100, -100, 20, 9, 16, 1, 5, 0, 22, 6},
                            {3, 10});

    nn::NamedTensors dump;
    for (auto& [name, p] : model.state_dict()) dump.emplace_back(name, p.clone().detach());
    dump.emplace_back("batch.ids", ids);
    dump.emplace_back("batch.targets", targets);

    const nn::NamedTensors named = model.named_parameters();
    Tensor logits = model.forward(ids);
    Tensor loss = model.loss(ids, targets);
    loss.backward();
    dump.emplace_back("out.logits", logits.detach());
    dump.emplace_back("out.loss", loss.detach());
    dump_grads(dump, named, "grad.");
    // A Hessian-vector product at the same weights (second-order parity, tests/hvp_dump.h).
    testing::dump_hvp(dump, named, [&] { return model.loss(ids, targets); }, 11);

    // AdamW with GPT-2's two groups; the per-group weight decay overrides the options'.
    optim::ParamGroup decay, no_decay;
    decay.params = model.decay_parameters();
    decay.weight_decay = weight_decay;
    no_decay.params = model.no_decay_parameters();
    no_decay.weight_decay = 0.0;
    optim::AdamWOptions ao;
    ao.lr = lr, ao.beta1 = beta1, ao.beta2 = beta2, ao.eps = eps, ao.weight_decay = 0.0;
    std::vector<optim::ParamGroup> groups{decay, no_decay};
    optim::AdamW adamw(std::move(groups), ao);
    adamw.step();
    dump_params(dump, named, "adamw.");

    // Step 2 on the same batch from the moved weights.
    model.zero_grad();
    Tensor loss2 = model.loss(ids, targets);
    loss2.backward();
    dump.emplace_back("out.loss2", loss2.detach());
    dump_grads(dump, named, "grad2.");
    adamw.step();
    dump_params(dump, named, "adamw2.");

    auto num = [](double v) { return fmt::format("{}", v); };
    std::map<std::string, std::string> meta = {
        {"vocab", std::to_string(c.vocab)},       {"block_size", std::to_string(c.block_size)},
        {"layers", std::to_string(c.layers)},     {"heads", std::to_string(c.heads)},
        {"d_model", std::to_string(c.d_model)},   {"d_ff", std::to_string(c.ff_dim())},
        {"dropout", num(c.dropout)},              {"ln_eps", num(c.ln_eps)},
        {"gelu_tanh", c.gelu_tanh ? "1" : "0"},   {"adamw_lr", num(lr)},
        {"adamw_beta1", num(beta1)},              {"adamw_beta2", num(beta2)},
        {"adamw_eps", num(eps)},                  {"weight_decay", num(weight_decay)},
        {"adamw_steps", "2"},
        // The groups by name, and their sizes (a tensor listed twice would show only there).
        {"decay_params", names_in(named, model.decay_parameters())},
        {"no_decay_params", names_in(named, model.no_decay_parameters())},
        {"decay_count", std::to_string(model.decay_parameters().size())},
        {"no_decay_count", std::to_string(model.no_decay_parameters().size())}};
    nn::save_safetensors(out, dump, meta);
    std::printf("gpt_parity_dump: wrote %s (%zu parameters, loss %.6f, after one step %.6f)\n", out.c_str(),
                named.size(), loss.item<double>(), loss2.item<double>());
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "gpt_parity_dump: %s\n", e.what());
    return 1;
  }
}
