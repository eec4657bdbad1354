// Writes a Transformer's weights, one padded batch, and tapestry's logits, loss, every
// parameter gradient and the parameters after one Adam step to a safetensors file, for
// tools/reference/transformer_ref.py to check against the same model in PyTorch.
//   parity_dump OUT.safetensors [post|pre] [separate|shared]
#include <cstdio>
#include <string>

#include "tapestry/models/transformer.h"
#include "tapestry/nn/safetensors.h"
#include "tapestry/optim/optimizer.h"
#include "tests/hvp_dump.h"

using namespace tapestry;

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: parity_dump OUT.safetensors post|pre separate|shared\n");
    return 2;
  }
  try {
    std::string out = argv[1];
    bool pre_norm = std::string(argv[2]) == "pre", shared = std::string(argv[3]) == "shared";
    manual_seed(pre_norm ? 11 : 7);
    models::TransformerConfig c;
    c.src_vocab = shared ? 17 : 19;
    c.tgt_vocab = 17;
    c.d_model = 32, c.heads = 4, c.d_ff = 64, c.enc_layers = 2, c.dec_layers = 2;
    c.dropout = 0.0, c.pre_norm = pre_norm, c.share_embeddings = shared, c.pad_id = 0;
    const double smoothing = 0.1, lr = 1e-3;
    models::Transformer model(c);

    // A batch with padding at the ends of shorter sentences. (B=3, S=7), (B=3, T=6)
    Tensor src = tensor({5, 9, 3, 12, 4, 2, 0, 7, 3, 2, 0, 0, 0, 0, 8, 8, 6, 1, 14, 10, 2}, {3, 7});
    Tensor tgt = tensor({1, 4, 9, 3, 6, 2, 0, 1, 5, 2, 0, 0, 0, 0, 1, 7, 7, 11, 3, 16, 2}, {3, 7});
    Tensor tgt_in = tgt.slice(1, 0, 6).contiguous(), tgt_out = tgt.slice(1, 1, 7).contiguous();

    nn::NamedTensors dump;
    for (auto& [name, p] : model.state_dict()) dump.emplace_back(name, p.clone().detach());
    dump.emplace_back("batch.src", src);
    dump.emplace_back("batch.tgt_in", tgt_in);
    dump.emplace_back("batch.tgt_out", tgt_out);

    Tensor logits = model.forward(src, tgt_in);
    Tensor loss = cross_entropy(logits.reshape({-1, c.tgt_vocab}), tgt_out.reshape({-1}), smoothing, c.pad_id);
    loss.backward();
    dump.emplace_back("out.logits", logits.detach());
    dump.emplace_back("out.loss", loss.detach());
    for (auto& [name, p] : model.named_parameters()) dump.emplace_back("grad." + name, p.grad());
    // A Hessian-vector product at the same weights (second-order parity, tests/hvp_dump.h).
    testing::dump_hvp(dump, model.named_parameters(), [&] {
      return cross_entropy(model.forward(src, tgt_in).reshape({-1, c.tgt_vocab}), tgt_out.reshape({-1}), smoothing,
                           c.pad_id);
    }, 13);

    optim::AdamOptions ao;
    ao.lr = lr, ao.beta1 = 0.9, ao.beta2 = 0.98, ao.eps = 1e-9;
    optim::Adam adam(model.parameters(), ao);
    adam.step();
    for (auto& [name, p] : model.named_parameters()) dump.emplace_back("adam." + name, p.clone().detach());

    std::map<std::string, std::string> meta = {
        {"src_vocab", std::to_string(c.src_vocab)}, {"tgt_vocab", std::to_string(c.tgt_vocab)},
        {"d_model", std::to_string(c.d_model)},     {"heads", std::to_string(c.heads)},
        {"d_ff", std::to_string(c.d_ff)},           {"enc_layers", std::to_string(c.enc_layers)},
        {"dec_layers", std::to_string(c.dec_layers)}, {"pre_norm", pre_norm ? "1" : "0"},
        {"share_embeddings", shared ? "1" : "0"},   {"pad_id", std::to_string(c.pad_id)},
        {"label_smoothing", fmt::format("{}", smoothing)}, {"adam_lr", fmt::format("{}", lr)}};
    nn::save_safetensors(out, dump, meta);
    std::printf("parity_dump: wrote %s (%s-norm, %s embeddings, loss %.6f)\n", out.c_str(), pre_norm ? "pre" : "post",
                shared ? "shared" : "separate", loss.item<double>());
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "parity_dump: %s\n", e.what());
    return 1;
  }
}
