// Copy task training loop (see copy_task.h): Adam (0.9, 0.98, 1e-9) with the Noam schedule, as
// the Annotated Transformer trains it; greedy decoding on held-out sequences.
#include "apps/tasks/copy_task.h"

#include "tapestry/models/transformer.h"
#include "tapestry/optim/optimizer.h"

namespace tapestry::apps {

using namespace models;  // the architectures and their decoding

namespace {
// [n, len] random symbols in [1, vocab) with the start symbol 1 in front.
Tensor random_sequences(int64_t n, int64_t len, int64_t vocab, Generator& gen) {
  Tensor seq = randint(1, vocab, {n, len}, DType::Int64, &gen);
  seq.select(1, 0).fill_(1);
  return seq;
}
}  // namespace

CopyTaskResult train_copy_task(const CopyTaskOptions& o, const std::function<void(int64_t, double, double)>& report) {
  manual_seed(o.seed);
  Generator data_gen(o.seed + 1), eval_gen(o.seed + 2);
  TransformerConfig cfg;
  cfg.src_vocab = cfg.tgt_vocab = o.vocab;
  cfg.d_model = o.d_model, cfg.heads = o.heads, cfg.d_ff = o.d_ff;
  cfg.enc_layers = cfg.dec_layers = o.layers;
  cfg.dropout = o.dropout;
  cfg.pre_norm = o.pre_norm;
  cfg.pad_id = 0;
  Transformer model(cfg);
  optim::AdamOptions ao;
  ao.beta1 = 0.9, ao.beta2 = 0.98, ao.eps = 1e-9;
  optim::Adam opt(model.parameters(), ao);
  optim::NoamSchedule schedule(o.d_model, o.warmup, o.lr_factor);

  Tensor held_out = random_sequences(o.eval_sequences, o.seq_len, o.vocab, eval_gen);
  std::vector<int64_t> expected = held_out.slice(1, 1, o.seq_len).contiguous().to_vector<int64_t>();
  DecodeOptions dec;
  dec.bos = 1;
  dec.eos = -1;         // no end symbol: decode exactly seq_len - 1 tokens
  dec.max_extra = -1;   // output length = source length - 1

  CopyTaskResult r;
  for (int64_t step = 1; step <= o.max_steps; ++step) {
    model.train();
    Tensor seq = random_sequences(o.batch, o.seq_len, o.vocab, data_gen);
    Tensor tgt_in = seq.slice(1, 0, o.seq_len - 1).contiguous(), tgt_out = seq.slice(1, 1, o.seq_len).contiguous();
    schedule.apply(opt, step);
    Tensor loss = model.loss(seq, tgt_in, tgt_out, 0.0);
    loss.backward();
    opt.step();
    opt.zero_grad();
    r.last_loss = loss.item<double>();
    r.steps = step;
    if (step % o.eval_every == 0 || step == o.max_steps) {
      auto hyps = greedy_decode(model, held_out, dec);
      int64_t exact = 0;
      for (int64_t i = 0; i < o.eval_sequences; ++i) {
        std::vector<int64_t> want(expected.begin() + i * (o.seq_len - 1), expected.begin() + (i + 1) * (o.seq_len - 1));
        exact += hyps[i].tokens == want;
      }
      r.accuracy = static_cast<double>(exact) / static_cast<double>(o.eval_sequences);
      if (report) report(step, r.last_loss, r.accuracy);
      if (exact == o.eval_sequences) {
        r.solved = true;
        break;
      }
    }
  }
  return r;
}

}  // namespace tapestry::apps
