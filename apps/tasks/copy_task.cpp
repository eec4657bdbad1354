// The copy task on the Trainer (see copy_task.h): Adam (0.9, 0.98, 1e-9) with the Noam schedule,
// as the Annotated Transformer trains it; greedy decoding on held-out sequences.
#include "apps/tasks/copy_task.h"

#include "tapestry/dist/dist.h"
#include "tapestry/models/transformer.h"
#include "apps/train/trainer.h"
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

// Random sequences, drawn fresh for every batch from their own generator.
class CopyData : public DataSource {
 public:
  CopyData(Transformer& model, const CopyTaskOptions& o) : model_(model), o_(o), gen_(o.seed + 1) {}
  int64_t plan(int64_t) override { return o_.max_steps; }  // one "epoch" of max_steps batches
  TrainBatch batch(int64_t) override {
    // Every rank draws the whole global batch (the same generator), then keeps its rows.
    Tensor seq = random_sequences(o_.batch, o_.seq_len, o_.vocab, gen_);
    if (shard_world_ > 1) {
      if (shard_rank_ >= o_.batch) return {0, {}};
      seq = seq.slice(0, shard_rank_, o_.batch, shard_world_).contiguous();
    }
    const int64_t rows = seq.size(0);
    Tensor tgt_in = seq.slice(1, 0, o_.seq_len - 1).contiguous(), tgt_out = seq.slice(1, 1, o_.seq_len).contiguous();
    return {rows * (o_.seq_len - 1), [this, seq, tgt_in, tgt_out] { return model_.loss(seq, tgt_in, tgt_out, 0.0); }};
  }

 private:
  Transformer& model_;
  const CopyTaskOptions& o_;
  Generator gen_;
};
}  // namespace

CopyTaskResult train_copy_task(const CopyTaskOptions& o) {
  manual_seed(o.seed);
  Generator eval_gen(o.seed + 2);
  TransformerConfig cfg;
  cfg.src_vocab = cfg.tgt_vocab = o.vocab;
  cfg.d_model = o.d_model, cfg.heads = o.heads, cfg.d_ff = o.d_ff;
  cfg.enc_layers = cfg.dec_layers = o.layers;
  cfg.dropout = o.dropout;
  cfg.pre_norm = o.pre_norm;
  cfg.pad_id = 0;
  Transformer model(cfg);
  model.to(Device::parse(o.device));  // before the optimizer, whose state follows the parameters
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

  TrainerOptions to;
  to.eval_every = o.eval_every;
  to.progress = o.progress;
  to.step_log = o.step_log;
  to.seed = o.seed;
  Trainer trainer(model, opt, &schedule, to);
  trainer.evaluate = [&](int64_t, int64_t) {
    auto hyps = greedy_decode(model, held_out, dec);
    int64_t exact = 0;
    for (int64_t i = 0; i < o.eval_sequences; ++i) {
      std::vector<int64_t> want(expected.begin() + i * (o.seq_len - 1), expected.begin() + (i + 1) * (o.seq_len - 1));
      exact += hyps[static_cast<size_t>(i)].tokens == want;
    }
    return Metrics{{"exact_copies", "exact copies", 100.0 * static_cast<double>(exact) / static_cast<double>(o.eval_sequences), 1, "%"}};
  };
  trainer.should_stop = [](const Metrics& m) { return metric(m, "exact_copies") == 100.0; };
  CopyData data(model, o);
  FitResult fit = trainer.fit(data);

  CopyTaskResult r;
  r.steps = fit.steps;
  r.last_loss = fit.last_loss;
  if (!dist::is_main()) {  // rank 0 evaluated; whether it solved the task is agreed by every rank
    r.solved = fit.finished_early;
    return r;
  }
  r.accuracy = metric(fit.last_metrics, "exact_copies") / 100.0;
  r.solved = fit.finished_early || r.accuracy == 1.0;
  return r;
}

}  // namespace tapestry::apps
