// The copy task on the Trainer (see copy_task.h): Adam (0.9, 0.98, 1e-9) with the Noam schedule,
// as the Annotated Transformer trains it; greedy decoding on held-out sequences.
#include "apps/tasks/copy_task.h"

#include <cstdio>

#include "apps/tasks/task.h"
#include "apps/tasks/paper_transformer.h"
#include "apps/train/trainer.h"
#include "tapestry/dist/dist.h"

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
  CopyData(Transformer& model, const CopyTaskOptions& o) : model_(model), o_(o), gen_(o.trainer.seed + 1) {}
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

OptionTable options_table(CopyTaskOptions& o) {
  OptionTable trainer = trainer_options(o.trainer), t("copy");
  t.add("steps", o.max_steps, "maximum training steps").positive();
  t.add("batch", o.batch, "sequences per batch").positive();
  t.add("d-model", o.d_model, "model width").positive();
  t.add("heads", o.heads, "attention heads").positive();
  t.add("d-ff", o.d_ff, "feed-forward width").positive();
  t.add("layers", o.layers, "encoder and decoder layers").positive();
  t.add("norm", o.pre_norm, "where the layers put LayerNorm: post (the paper's) or pre")
      .one_of({"post", "pre"});
  t.add("warmup", o.warmup, "Noam warmup steps").positive();
  t.add("lr-factor", o.lr_factor, "Noam schedule factor").above(0);
  t.take_all(trainer, {"eval-every", "seed", "threads", "device", "step-log", "no-progress"});
  return t;
}

CopyTaskResult train_copy_task(const CopyTaskOptions& options) {
  CopyTaskOptions o = options;
  RunSetup run(options_table(o), o.trainer);
  run.seed();  // no run folder
  Generator eval_gen(o.trainer.seed + 2);
  TransformerConfig cfg;
  cfg.src_vocab = cfg.tgt_vocab = o.vocab;
  cfg.d_model = o.d_model, cfg.heads = o.heads, cfg.d_ff = o.d_ff;
  cfg.enc_layers = cfg.dec_layers = o.layers;
  cfg.dropout = o.dropout;
  cfg.pre_norm = o.pre_norm;
  cfg.pad_id = 0;
  PaperTransformer paper(cfg, training_device(o.trainer.device), o.warmup, o.lr_factor);
  Transformer& model = paper.model;

  Tensor held_out = random_sequences(o.eval_sequences, o.seq_len, o.vocab, eval_gen);
  std::vector<int64_t> expected = held_out.slice(1, 1, o.seq_len).contiguous().to_vector<int64_t>();
  DecodeOptions dec;
  dec.bos = 1;
  dec.eos = -1;         // no end symbol: decode exactly seq_len - 1 tokens
  dec.max_extra = -1;   // output length = source length - 1

  Trainer trainer(model, paper.adam, &paper.schedule, run.trainer());
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

// `tapestry train --task copy`: solved (exit 0) when every held-out sequence is copied exactly.
int run_copy_task(const CopyTaskOptions& o) {
  std::printf("copy task: vocab %lld, length %lld, batch %lld, d_model %lld, %lld+%lld %s-norm layers, %lld heads, "
              "d_ff %lld, Noam warmup %lld\n",
              (long long)o.vocab, (long long)o.seq_len, (long long)o.batch, (long long)o.d_model, (long long)o.layers,
              (long long)o.layers, o.pre_norm ? "pre" : "post", (long long)o.heads, (long long)o.d_ff,
              (long long)o.warmup);
  std::fflush(stdout);
  const CopyTaskResult r = train_copy_task(o);
  if (r.solved) {
    std::printf("solved: every held-out sequence copied exactly after %lld steps\n", (long long)r.steps);
    return 0;
  }
  std::printf("not solved after %lld steps: %.1f%% exact copies\n", (long long)r.steps, 100 * r.accuracy);
  return 1;
}

Task copy_task() {
  TaskSpec<CopyTaskOptions> t;
  t.name = "copy", t.summary = "the Annotated Transformer's copy task";
  t.table = [](CopyTaskOptions& o) { return options_table(o); };
  t.run = run_copy_task;
  return make_task(std::move(t));
}

}  // namespace tapestry::apps
