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
                                       int64_t beam, double alpha) {
  std::vector<std::string> out;
  DecodeOptions opt;
  opt.bos = Subword::kBos, opt.eos = Subword::kEos;
  for (size_t start = 0; start < sources.size(); start += 50) {
    size_t end = std::min(sources.size(), start + 50);
    std::vector<std::vector<int64_t>> ids;
    int64_t S = 1;
    for (size_t i = start; i < end; ++i) {
      ids.push_back(sp.encode(sources[i]));
      S = std::max<int64_t>(S, static_cast<int64_t>(ids.back().size()));
    }
    std::vector<int64_t> flat(ids.size() * S, Subword::kPad);
    for (size_t i = 0; i < ids.size(); ++i) std::copy(ids[i].begin(), ids[i].end(), flat.begin() + i * S);
    Tensor src = tensor(flat, {static_cast<int64_t>(ids.size()), S});
    auto hyps = beam > 1 ? beam_search(model, src, beam, alpha, opt) : greedy_decode(model, src, opt);
    for (auto& h : hyps) out.push_back(sp.decode(h.tokens));
  }
  return out;
}

std::vector<std::string> head(const std::vector<std::string>& v, int64_t limit) {
  return limit > 0 && static_cast<size_t>(limit) < v.size() ? std::vector<std::string>(v.begin(), v.begin() + limit) : v;
}

std::string toml_string(const std::string& v) { return "\"" + v + "\""; }  // options_to_toml checks v

std::string toml_number(double v) {
  std::string s = fmt::format("{}", v);
  return s.find_first_of(".en") == std::string::npos ? s + ".0" : s;  // a TOML float has a point or exponent
}

}  // namespace

std::string options_to_toml(const TranslationOptions& o) {
  // CLI11's TOML reader unescapes nothing and ends a value at '#': such paths could not read back.
  for (const std::string* path : {&o.data_dir, &o.out_dir})
    TP_CHECK(path->find_first_of("\"\\#\n") == std::string::npos,
             "train: the path '{}' holds a quote, a backslash, '#' or a newline, which config.toml cannot hold", *path);
  std::string t = "# tapestry train: read back with `tapestry train --config-file FILE`; flags override it\n";
  auto line = [&](const char* key, const std::string& value) { t += fmt::format("{} = {}\n", key, value); };
  line("task", toml_string("multi30k"));
  line("data", toml_string(o.data_dir.empty() ? default_data_dir() : o.data_dir));
  line("out", toml_string(o.out_dir));
  line("config", toml_string(o.config));
  line("norm", toml_string(o.pre_norm ? "pre" : "post"));
  line("vocab-size", std::to_string(o.vocab_size));
  line("max-tokens", std::to_string(o.max_tokens));
  line("accumulate", std::to_string(o.accumulate));
  line("epochs", std::to_string(o.epochs));
  line("warmup", std::to_string(o.warmup));
  line("lr-factor", toml_number(o.lr_factor));
  line("label-smoothing", toml_number(o.label_smoothing));
  line("dropout", toml_number(o.dropout));
  line("clip-norm", toml_number(o.clip_norm));
  line("seed", std::to_string(o.seed));
  line("limit", std::to_string(o.limit));
  line("eval-limit", std::to_string(o.eval_limit));
  line("beam", std::to_string(o.beam));
  line("alpha", toml_number(o.alpha));
  line("save-every", std::to_string(o.save_every));
  line("keep", std::to_string(o.keep));
  line("average", std::to_string(o.average));
  line("threads", std::to_string(o.threads));
  line("device", toml_string(o.device));
  return t;
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

TranslationResult train_translation(const TranslationOptions& o) {
  // The Trainer's options first: they are checked before the data are read.
  TrainerOptions to;
  to.epochs = o.epochs, to.accumulate = o.accumulate, to.clip_norm = o.clip_norm, to.on_nan = o.on_nan;
  to.progress = o.progress, to.step_log = o.step_log, to.seed = o.seed, to.reshard = o.reshard;
  to.time_limit = o.time_limit;
  to.out_dir = o.out_dir, to.resume = o.resume, to.save_every = o.save_every, to.stop_after = o.stop_after;
  to.keep = o.keep, to.average = o.average, to.best_metric = "val_bleu";
  check_options(to);
  TP_CHECK(std::isfinite(o.lr_factor) && o.lr_factor > 0, "train: --lr-factor must be a positive number, got {}",
           o.lr_factor);
  TP_CHECK(std::isfinite(o.alpha) && o.alpha >= 0, "train: --alpha must be a number >= 0, got {}", o.alpha);
  TP_CHECK(o.dropout >= 0 && o.dropout < 1, "train: --dropout must be in [0, 1), got {}", o.dropout);
  TP_CHECK(o.label_smoothing >= 0 && o.label_smoothing < 1, "train: --label-smoothing must be in [0, 1), got {}",
           o.label_smoothing);
  const std::string dir = o.data_dir.empty() ? default_data_dir() : o.data_dir;
  ParallelCorpus train = load_parallel(dir, o.train_split, o.src_lang, o.tgt_lang);
  ParallelCorpus val = load_parallel(dir, o.val_split, o.src_lang, o.tgt_lang);
  ParallelCorpus test = load_parallel(dir, o.test_split, o.src_lang, o.tgt_lang);
  RunFolder folder(o.out_dir, o.resume, o.overwrite, {"spm.model", "spm.recipe", "config.toml"});
  const std::string config_toml = options_to_toml(o);
  std::printf("config (saved as %s/config.toml):\n%s", o.out_dir.c_str(), config_toml.c_str());
  manual_seed(o.seed);
  AnomalyGuard anomaly(o.detect_anomaly);

  // Joint subword model on both sides of the (possibly limited) training text.
  const std::string spm_path = Subword::train_in_folder(o.out_dir, o.vocab_size, o.limit, o.seed, dir, [&] {
    std::vector<std::string> text;
    size_t n = o.limit > 0 ? std::min<size_t>(train.src.size(), static_cast<size_t>(o.limit)) : train.src.size();
    text.insert(text.end(), train.src.begin(), train.src.begin() + n);
    text.insert(text.end(), train.tgt.begin(), train.tgt.begin() + n);
    return text;
  });
  Subword sp(spm_path);
  const int64_t V = sp.vocab_size();
  Encoded tr = encode(sp, train, o.limit, o.max_tokens), va = encode(sp, val, o.eval_limit, o.max_tokens);
  encode(sp, test, o.eval_limit, o.max_tokens);  // only checked: the test set is decoded at the end
  TokenBatcher train_batches(tr.src, tr.tgt, o.max_tokens, Subword::kPad, Subword::kBos, Subword::kEos);
  TokenBatcher val_batches(va.src, va.tgt, o.max_tokens, Subword::kPad, Subword::kBos, Subword::kEos);

  TransformerConfig cfg = TransformerConfig::named(o.config, V, V);
  cfg.share_embeddings = true;
  cfg.dropout = o.dropout;
  cfg.pad_id = Subword::kPad;
  cfg.pre_norm = o.pre_norm;
  Transformer model(cfg);
  model.to(Device::parse(o.device));  // before the optimizer, whose state follows the parameters
  optim::AdamOptions ao;
  ao.beta1 = 0.9, ao.beta2 = 0.98, ao.eps = 1e-9;
  optim::Adam adam(model.parameters(), ao);
  optim::NoamSchedule schedule(cfg.d_model, o.warmup, o.lr_factor);
  std::printf("train: %s %s-%s, %zu training pairs, vocabulary %lld (joint SentencePiece), config %s (%lld "
              "parameters, %s-norm), batches of <= %lld tokens x %lld, %lld epochs, Noam warmup %lld x %.2f\n",
              dir.c_str(), o.src_lang.c_str(), o.tgt_lang.c_str(), tr.src.size(), (long long)V, o.config.c_str(),
              (long long)model.num_parameters(), o.pre_norm ? "pre" : "post", (long long)o.max_tokens,
              (long long)o.accumulate, (long long)o.epochs, (long long)o.warmup,
              o.lr_factor);
  std::fflush(stdout);
  const auto run_start = std::chrono::steady_clock::now();

  // What resume must find unchanged: the model and everything that decides the batch plan.
  to.recipe = {{"config", o.config},          {"pre_norm", o.pre_norm ? "1" : "0"},         {"vocab_size", std::to_string(V)},
               {"max_tokens", std::to_string(o.max_tokens)}, {"accumulate", std::to_string(o.accumulate)},
               {"seed", std::to_string(o.seed)},             {"limit", std::to_string(o.limit)}};
  to.recipe_defaults = {{"pre_norm", "0"}};  // checkpoints from before pre-norm existed hold post-norm models
  to.model_metadata = {{"config", o.config}, {"pre_norm", o.pre_norm ? "1" : "0"}};
  to.run_files = {{"config.toml", config_toml}};
  to.curves_title = fmt::format("{}-{} {} on {}", o.src_lang, o.tgt_lang, o.config, dir);
  Trainer trainer(model, adam, &schedule, to);
  const auto val_src = head(val.src, o.eval_limit), val_ref = head(val.tgt, o.eval_limit);
  trainer.evaluate = [&](int64_t, int64_t) {
    Metric loss{"val_loss", "val loss", evaluate_loss(model, val_batches, o.label_smoothing), 3, "", false};
    Metric bleu{"val_bleu", "val BLEU", corpus_bleu(translate_all(model, sp, val_src, 1, o.alpha), val_ref).score, 2,
                " (greedy)", true};
    return Metrics{loss, bleu};
  };
  TranslationData data(model, train_batches, o.seed, o.label_smoothing);
  FitResult fit = trainer.fit(data);

  TranslationResult result;
  // Under mpirun rank 0 evaluated, saved and reports; the other ranks' part ends with training.
  if (!dist::is_main()) {
    result.stopped = fit.stopped, result.interrupted = fit.interrupted;
    return result;
  }
  for (const EpochRecord& e : fit.epochs)
    result.epochs.push_back({e.epoch, e.steps, e.train_loss, metric(e.metrics, "val_loss"), metric(e.metrics, "val_bleu"),
                             e.seconds, e.tokens_per_s});
  result.stopped = fit.stopped, result.interrupted = fit.interrupted, result.skipped_steps = fit.skipped_steps;
  result.best_val_bleu = fit.best_epoch ? fit.best_value : -1, result.best_epoch = fit.best_epoch;
  result.averaged = fit.averaged;
  if (fit.stopped || fit.interrupted) return result;

  // The final model (averaged or last), scored as the test set is: on val, then on test.
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
  std::printf("total time %s\n", clock_text(seconds_since(run_start)).c_str());
  for (size_t i = 0; i < std::min<size_t>(5, hyps.size()); ++i)
    std::printf("  src: %s\n  ref: %s\n  hyp: %s\n", test_src[i].c_str(), test_ref[i].c_str(), hyps[i].c_str());
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

std::vector<std::string> translate(Translator& t, const std::vector<std::string>& sources, int64_t beam, double alpha) {
  return translate_all(*t.model, *t.subword, sources, beam, alpha);
}

}  // namespace tapestry::apps
