// Writes a small encoder-only text model (models::Bert), a padded batch with BERT-masked inputs,
// and tapestry's MLM logits and loss, classifier logits and loss, every parameter gradient of
// their sum, and the parameters after one AdamW step, for `tools/reference/bert_ref.py check`.
//   bert_parity_dump OUT.safetensors [post]
// With "post" the blocks are post-norm (BERT's own layout); otherwise pre-norm with a final norm.
#include <cstdio>
#include <cstring>
#include <string>

#include "tapestry/autograd/grad_mode.h"
#include "tapestry/models/bert.h"
#include "tapestry/nn/safetensors.h"
#include "tapestry/optim/optimizer.h"

using namespace tapestry;

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: bert_parity_dump OUT.safetensors [post]\n");
    return 2;
  }
  try {
    manual_seed(31);
    models::BertConfig c = models::BertConfig::named("tiny", 29);
    c.max_len = 12, c.classes = 3, c.d_model = 16, c.heads = 4, c.d_ff = 24, c.dropout = 0.0;
    c.norm_first = !(argc == 3 && std::strcmp(argv[2], "post") == 0);
    const double lr = 1e-3, weight_decay = 0.01;
    models::Bert model(c);
    {
      NoGradGuard no_grad;  // make every parameter matter (the init's 0.02 hides swaps)
      for (auto& [name, p] : model.named_parameters()) p.add_(randn(p.sizes()).mul_(0.2));
    }
    // [CLS]=2 ... [SEP]=3 then padding 0; [MASK]=4; ordinary tokens from 5.
    Tensor ids = tensor({2, 7, 9, 11, 28, 3, 0, 0, 0, 0,  //
                         2, 5, 6, 7, 8, 9, 10, 12, 14, 3,  //
                         2, 20, 3, 0, 0, 0, 0, 0, 0, 0},
                        {3, 10});
    Generator gen(4);
    models::MaskedTokens m = models::mask_tokens(ids, 4, c.vocab, 5, {0, 1, 2, 3, 4}, gen, 0.4);
    Tensor labels = tensor({2, 0, 1});

    nn::NamedTensors dump;
    for (auto& [name, p] : model.state_dict()) dump.emplace_back(name, p.clone().detach());
    dump.emplace_back("batch.ids", m.ids);
    dump.emplace_back("batch.mlm_labels", m.labels);
    dump.emplace_back("batch.class_ids", ids);
    dump.emplace_back("batch.labels", labels);
    const nn::NamedTensors named = model.named_parameters();
    Tensor mlm_logits = model.mlm_logits(model.encode(m.ids));
    Tensor class_logits = model.classify(ids);
    Tensor mlm = model.mlm_loss(m.ids, m.labels), cls = model.class_loss(ids, labels);
    (mlm + cls).backward();
    dump.emplace_back("out.mlm_logits", mlm_logits.detach());
    dump.emplace_back("out.class_logits", class_logits.detach());
    dump.emplace_back("out.mlm_loss", mlm.detach());
    dump.emplace_back("out.class_loss", cls.detach());
    for (auto& [name, p] : named) {
      TP_CHECK(p.grad().defined(), "bert_parity_dump: parameter {} got no gradient", name);
      dump.emplace_back("grad." + name, p.grad().clone());
    }
    optim::AdamWOptions ao;
    ao.lr = lr, ao.weight_decay = weight_decay;
    optim::AdamW adamw(model.parameters(), ao);
    adamw.step();
    for (auto& [name, p] : named) dump.emplace_back("adamw." + name, p.clone().detach());
    auto num = [](double v) { return fmt::format("{}", v); };
    nn::save_safetensors(argv[1], dump,
                         {{"vocab", std::to_string(c.vocab)},     {"max_len", std::to_string(c.max_len)},
                          {"classes", std::to_string(c.classes)}, {"layers", std::to_string(c.layers)},
                          {"heads", std::to_string(c.heads)},     {"d_model", std::to_string(c.d_model)},
                          {"d_ff", std::to_string(c.d_ff)},       {"ln_eps", num(c.ln_eps)},
                          {"norm_first", c.norm_first ? "1" : "0"}, {"pad_id", std::to_string(c.pad_id)},
                          {"adamw_lr", num(lr)},                  {"weight_decay", num(weight_decay)}});
    std::printf("bert_parity_dump: wrote %s (%zu parameters, MLM loss %.6f, class loss %.6f, %s-norm)\n", argv[1],
                named.size(), mlm.item<double>(), cls.item<double>(), c.norm_first ? "pre" : "post");
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "bert_parity_dump: %s\n", e.what());
    return 1;
  }
}
