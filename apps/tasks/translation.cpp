// The translation training loop (see translation.h).
#include "apps/tasks/translation.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <tuple>

#include "apps/eval/bleu.h"
#include "apps/data/parallel_corpus.h"
#include "apps/tasks/paper_transformer.h"
#include "apps/tasks/task.h"
#include "apps/train/run_dir.h"
#include "apps/train/trainer.h"
#include "apps/data/subword.h"
#include "tapestry/dist/dist.h"
#include "tapestry/models/transformer.h"
#include "tapestry/autograd/anomaly.h"
#include "tapestry/nn/safetensors.h"
#include "tapestry/ops/factory.h"
#include "tapestry/optim/optimizer.h"

namespace tapestry::apps {

using namespace models;  // the architectures and their decoding

namespace {

struct Encoded {
  std::vector<std::vector<int64_t>> src, tgt;
};

// Subword ids of the first `limit` pairs (0: all). A sentence that cannot fit in a batch of
// max_tokens padded tokens is refused here, naming its file and line, before training starts.
Encoded encode(const Subword& sp, const ParallelCorpus& c, int64_t limit, int64_t max_tokens) {
  Encoded e;
  size_t n = limit > 0 ? std::min<size_t>(c.src.size(), static_cast<size_t>(limit)) : c.src.size();
  for (size_t i = 0; i < n; ++i) {
    e.src.push_back(sp.encode(c.src[i]));
    e.tgt.push_back(sp.encode(c.tgt[i]));
    for (auto [ids, path, extra] : {std::tuple{&e.src.back(), &c.src_path, 0}, std::tuple{&e.tgt.back(), &c.tgt_path, 1}})
      TP_CHECK(static_cast<int64_t>(ids->size()) + extra <= max_tokens,
               "{}:{}: the sentence is {} subword tokens, more than a batch holds (--max-tokens {})", *path, i + 1,
               ids->size() + extra, max_tokens);
  }
  return e;
}

// Mean token loss over a corpus, no dropout, no graph.
double evaluate_loss(Transformer& model, const TokenBatcher& batches, double smoothing) {
  NoGradGuard no_grad;
  model.eval();
  double total = 0;
  int64_t tokens = 0;
  for (auto& rows : batches.plan(0, 0)) {
    Batch b = batches.make(rows);
    total += model.loss(b.src, b.tgt_in, b.tgt_out, smoothing).item<double>() * static_cast<double>(b.tgt_tokens);
    tokens += b.tgt_tokens;
  }
  model.train();
  return total / static_cast<double>(std::max<int64_t>(tokens, 1));
}

// Translations of `sources` (greedy when beam == 1), in order, batched by 50 sentences.
std::vector<std::string> translate_all(Transformer& model, const Subword& sp, const std::vector<std::string>& sources,
                                       int64_t beam, double alpha, int64_t batch = 50) {
  TP_CHECK(batch >= 1, "translate: the batch must hold at least one sentence, got {}", batch);
  std::vector<std::string> out;
  DecodeOptions opt;
  opt.bos = Subword::kBos, opt.eos = Subword::kEos;
  const size_t step = static_cast<size_t>(batch);
  const std::vector<Tensor> params = model.parameters();
  const Device device = params.empty() ? Device::CPU : params.front().device();  // the ids go where the model is
  for (size_t start = 0; start < sources.size(); start += step) {
    size_t end = std::min(sources.size(), start + step);
    std::vector<std::vector<int64_t>> ids;
    int64_t S = 1;
    for (size_t i = start; i < end; ++i) {
      ids.push_back(sp.encode(sources[i]));
      S = std::max<int64_t>(S, static_cast<int64_t>(ids.back().size()));
    }
    std::vector<int64_t> flat(ids.size() * S, Subword::kPad);
    for (size_t i = 0; i < ids.size(); ++i) std::copy(ids[i].begin(), ids[i].end(), flat.begin() + i * S);
    Tensor src = tensor(flat, {static_cast<int64_t>(ids.size()), S}).to(device);
    auto hyps = beam > 1 ? beam_search(model, src, beam, alpha, opt) : greedy_decode(model, src, opt);
    for (auto& h : hyps) out.push_back(sp.decode(h.tokens));
  }
  return out;
}

std::vector<std::string> head(const std::vector<std::string>& v, int64_t limit) {
  return limit > 0 && static_cast<size_t>(limit) < v.size() ? std::vector<std::string>(v.begin(), v.begin() + limit) : v;
}

}  // namespace

TranslationOptions quick_translation_options() {
  TranslationOptions o;
  o.trainer.epochs = 2;
  o.trainer.cooldown = 0;
  o.trainer.average = 0;
  o.trainer.out_dir = "runs/multi30k-quick";
  o.eval_limit = 300;
  o.beam = 1;
  return o;
}

OptionTable options_table(TranslationOptions& o) {
  OptionTable trainer = trainer_options(o.trainer), t("multi30k");
  t.add("data", o.data_dir, "the data directory (default: $TAPESTRY_DATA or ../shared/data/multi30k)");
  t.take(trainer, "out");
  t.add("config", o.config, "model size").one_of(TransformerConfig::names()).recipe();
  t.add("norm", o.pre_norm, "where the layers put LayerNorm: post (the paper's) or pre").one_of({"post", "pre"}).recipe("pre_norm");
  t.add("vocab-size", o.vocab_size, "joint SentencePiece vocabulary").positive();
  t.add("max-tokens", o.max_tokens, "padded tokens per batch").positive().recipe();
  t.take(trainer, "accumulate").recipe();
  t.take(trainer, "epochs");
  t.add("warmup", o.warmup, "Noam warmup steps").positive();
  t.add("lr-factor", o.lr_factor, "Noam schedule factor").above(0);
  t.add("label-smoothing", o.label_smoothing, "label smoothing").at_least(0).below(1);
  t.add("dropout", o.dropout, "dropout").at_least(0).below(1);
  t.take(trainer, "clip-norm");
  t.take(trainer, "seed").recipe();
  t.add("limit", o.limit, "use only the first N training pairs (0: all)").at_least(0).recipe();
  t.add("eval-limit", o.eval_limit, "score only the first N val/test sentences (0: all)").at_least(0);
  t.add("beam", o.beam, "beam size for the test set (1: greedy)").positive();
  t.add("alpha", o.alpha, "length penalty for the test set").at_least(0);
  add_run_rows(t, trainer, {"keep", "average", "cooldown"});
  t.add("detect-anomaly", o.detect_anomaly, "name the first op whose forward or backward gives NaN/inf (slow)")
      .this_run_only();
  return t;
}

std::string options_to_toml(const TranslationOptions& options) {
  TranslationOptions o = options;
  if (o.data_dir.empty()) o.data_dir = default_data_dir();
  return options_table(o).to_toml();
}

namespace {

// The translation task as the Trainer's DataSource: token-count batches of the training pairs,
// planned from (seed, epoch), each with its label-smoothed loss.
class TranslationData : public DataSource {
 public:
  TranslationData(Transformer& model, const TokenBatcher& batches, uint64_t seed, double smoothing)
      : model_(model), batches_(batches), seed_(seed), smoothing_(smoothing) {}
  int64_t plan(int64_t epoch) override {
    plan_ = batches_.plan(seed_, epoch);
    return static_cast<int64_t>(plan_.size());
  }
  TrainBatch batch(int64_t index) override {
    const auto pairs = shard_of(plan_.at(static_cast<size_t>(index)), shard_rank_, shard_world_);
    if (pairs.empty()) return {0, {}};
    Batch b = batches_.make(pairs);
    return {b.tgt_tokens, [this, b] { return model_.loss(b.src, b.tgt_in, b.tgt_out, smoothing_); }};
  }

 private:
  Transformer& model_;
  const TokenBatcher& batches_;
  uint64_t seed_;
  double smoothing_;
  std::vector<std::vector<int64_t>> plan_;
};

}  // namespace

namespace {

// The Trainer's record, as the translation task reports it (rank 0 has the metrics).
TranslationResult translation_result(const FitResult& fit) {
  TranslationResult result;
  result.stopped = fit.stopped, result.interrupted = fit.interrupted;
  if (!dist::is_main()) return result;
  for (const EpochRecord& e : fit.epochs)
    result.epochs.push_back({e.epoch, e.steps, e.train_loss, metric(e.metrics, "val_loss"), metric(e.metrics, "val_bleu"),
                             e.seconds, e.tokens_per_s});
  result.skipped_steps = fit.skipped_steps;
  result.best_val_bleu = fit.best_epoch ? fit.best_value : -1, result.best_epoch = fit.best_epoch;
  result.averaged = fit.averaged;
  return result;
}

// The final model (averaged or last), scored as the test set is, with beam search: on val, then
// on test, with a few examples.
void score_final_model(Transformer& model, const Subword& sp, const TranslationOptions& o, const ParallelCorpus& val,
                       const ParallelCorpus& test, TranslationResult& result) {
  const auto val_src = head(val.src, o.eval_limit), val_ref = head(val.tgt, o.eval_limit);
  auto t_val = std::chrono::steady_clock::now();
  auto val_score = corpus_bleu(translate_all(model, sp, val_src, o.beam, o.alpha), val_ref);
  result.val_bleu = val_score.score;
  std::printf("final model on %s (%zu sentences, beam %lld, alpha %.1f, %.0f s): %s\n", o.val_split.c_str(),
              val_src.size(), (long long)o.beam, o.alpha, seconds_since(t_val), val_score.format().c_str());
  auto t_test = std::chrono::steady_clock::now();
  auto test_src = head(test.src, o.eval_limit), test_ref = head(test.tgt, o.eval_limit);
  auto hyps = translate_all(model, sp, test_src, o.beam, o.alpha);
  auto score = corpus_bleu(hyps, test_ref);
  result.test_bleu = score.score;
  result.test_bleu_line = score.format();
  std::printf("final model on %s (%zu sentences, beam %lld, alpha %.1f, %.0f s): %s\n%s\n", o.test_split.c_str(),
              test_src.size(), (long long)o.beam, o.alpha, seconds_since(t_test), score.format().c_str(),
              BleuScore::signature().c_str());
  for (size_t i = 0; i < std::min<size_t>(5, hyps.size()); ++i)
    std::printf("  src: %s\n  ref: %s\n  hyp: %s\n", test_src[i].c_str(), test_ref[i].c_str(), hyps[i].c_str());
}

}  // namespace

namespace {

struct Splits {
  ParallelCorpus train, val, test;
};

Splits read_splits(const TranslationOptions& o) {
  return {load_parallel(o.data_dir, o.train_split, o.src_lang, o.tgt_lang),
          load_parallel(o.data_dir, o.val_split, o.src_lang, o.tgt_lang),
          load_parallel(o.data_dir, o.test_split, o.src_lang, o.tgt_lang)};
}

// The joint subword model of both sides of the (possibly limited) training text, trained into the
// run folder (or the one it holds, when its recipe matches): its path.
std::string joint_subwords(const TranslationOptions& o, const ParallelCorpus& train) {
  return Subword::train_in_folder(o.trainer.out_dir, o.vocab_size, o.limit, o.trainer.seed, o.data_dir, [&] {
    std::vector<std::string> text;
    size_t n = o.limit > 0 ? std::min<size_t>(train.src.size(), static_cast<size_t>(o.limit)) : train.src.size();
    text.insert(text.end(), train.src.begin(), train.src.begin() + n);
    text.insert(text.end(), train.tgt.begin(), train.tgt.begin() + n);
    return text;
  });
}

TransformerConfig translation_config(const TranslationOptions& o, int64_t vocab) {
  TransformerConfig cfg = TransformerConfig::named(o.config, vocab, vocab);
  cfg.share_embeddings = true;
  cfg.dropout = o.dropout;
  cfg.pad_id = Subword::kPad;
  cfg.pre_norm = o.pre_norm;
  return cfg;
}

}  // namespace

TranslationResult train_translation(const TranslationOptions& options) {
  TranslationOptions o = options;
  if (o.data_dir.empty()) o.data_dir = default_data_dir();
  RunSetup run(options_table(o), o.trainer);
  const Splits text = read_splits(o);
  run.open({"spm.model", "spm.recipe"});
  std::printf("config (saved as %s/config.toml):\n%s", o.trainer.out_dir.c_str(), run.config_toml().c_str());
  AnomalyGuard anomaly(o.detect_anomaly);
  Subword sp(joint_subwords(o, text.train));
  const int64_t V = sp.vocab_size();
  Encoded tr = encode(sp, text.train, o.limit, o.max_tokens), va = encode(sp, text.val, o.eval_limit, o.max_tokens);
  encode(sp, text.test, o.eval_limit, o.max_tokens);  // only checked: the test set is decoded at the end
  TokenBatcher train_batches(tr.src, tr.tgt, o.max_tokens, Subword::kPad, Subword::kBos, Subword::kEos);
  TokenBatcher val_batches(va.src, va.tgt, o.max_tokens, Subword::kPad, Subword::kBos, Subword::kEos);

  PaperTransformer paper(translation_config(o, V), training_device(o.trainer.device), o.warmup, o.lr_factor);
  Transformer& model = paper.model;
  std::printf("train: %s %s-%s, %zu training pairs, vocabulary %lld (joint SentencePiece), config %s (%lld "
              "parameters, %s-norm), batches of <= %lld tokens x %lld, %lld epochs, Noam warmup %lld x %.2f\n",
              o.data_dir.c_str(), o.src_lang.c_str(), o.tgt_lang.c_str(), tr.src.size(), (long long)V, o.config.c_str(),
              (long long)model.num_parameters(), o.pre_norm ? "pre" : "post", (long long)o.max_tokens,
              (long long)o.trainer.accumulate, (long long)o.trainer.epochs, (long long)o.warmup, o.lr_factor);
  std::fflush(stdout);
  const auto run_start = std::chrono::steady_clock::now();

  // What resume must find unchanged: the model and everything that decides the batch plan.
  TrainerOptions& to = run.record({{"vocab_size", std::to_string(V)}},
                                  {{"config", o.config}, {"pre_norm", o.pre_norm ? "1" : "0"}},
                                  fmt::format("{}-{} {} on {}", o.src_lang, o.tgt_lang, o.config, o.data_dir));
  to.recipe_defaults = {{"pre_norm", "0"}};  // checkpoints from before pre-norm existed hold post-norm models
  Trainer trainer(model, paper.adam, &paper.schedule, to);
  const auto val_src = head(text.val.src, o.eval_limit), val_ref = head(text.val.tgt, o.eval_limit);
  trainer.evaluate = [&](int64_t, int64_t) {
    Metric loss{"val_loss", "val loss", evaluate_loss(model, val_batches, o.label_smoothing), 3, "", false};
    Metric bleu{"val_bleu", "val BLEU", corpus_bleu(translate_all(model, sp, val_src, 1, o.alpha), val_ref).score, 2,
                " (greedy)", true};
    return Metrics{loss, bleu};
  };
  TranslationData data(model, train_batches, to.seed, o.label_smoothing);
  FitResult fit = trainer.fit(data);

  TranslationResult result = translation_result(fit);
  // Under mpirun rank 0 evaluated, saved and reports; the other ranks' part ends with training.
  if (!dist::is_main() || fit.stopped || fit.interrupted) return result;
  score_final_model(model, sp, o, text.val, text.test, result);
  std::printf("total time %s\n", clock_text(seconds_since(run_start)).c_str());
  return result;
}

Translator load_translator(const std::string& dir, const std::string& weights) {
  Translator t;
  if (!weights.empty()) {
    t.weights_path = weights.find('/') == std::string::npos ? dir + "/" + weights : weights;
  } else {
    t.weights_path = std::ifstream(dir + "/model.avg.safetensors").good() ? dir + "/model.avg.safetensors"
                                                                          : dir + "/model.safetensors";
  }
  TP_CHECK(std::ifstream(t.weights_path).good(), "{} not found{}", t.weights_path,
           weights.empty() ? fmt::format(" (train with `tapestry train --task multi30k --out {}`)", dir) : "");
  auto file = nn::load_safetensors(t.weights_path);
  t.subword = std::make_unique<Subword>(dir + "/spm.model");
  auto it = file.metadata.find("config");
  TP_CHECK(it != file.metadata.end(), "{} records no config (not written by tapestry train)", t.weights_path);
  const int64_t V = t.subword->vocab_size();
  TransformerConfig cfg = TransformerConfig::named(it->second, V, V);
  cfg.share_embeddings = true;
  cfg.pad_id = Subword::kPad;
  auto norm = file.metadata.find("pre_norm");
  cfg.pre_norm = norm != file.metadata.end() && norm->second == "1";
  t.model = std::make_unique<Transformer>(cfg);
  t.model->load_state_dict(file.as_map());
  t.model->eval();
  return t;
}

std::vector<std::string> translate(Translator& t, const std::vector<std::string>& sources, int64_t beam, double alpha,
                                   int64_t batch) {
  return translate_all(*t.model, *t.subword, sources, beam, alpha, batch);
}

Task translation_task() {
  TaskSpec<TranslationOptions> t;
  t.name = "multi30k", t.summary = "German to English";
  t.quick = "the quick recipe, which shows learning in minutes (docs/training.md)";
  t.quick_defaults = quick_translation_options;
  t.table = [](TranslationOptions& o) { return options_table(o); };
  t.toml = [](const TranslationOptions& o) { return options_to_toml(o); };
  t.run = [](const TranslationOptions& o) { return exit_status(train_translation(o).interrupted); };
  return make_task(std::move(t));
}

}  // namespace tapestry::apps
