// The language-model task (see language_model.h): its options, its text as token streams, and
// the run. Fine-tuning a base, LoRA and merging are in lm_finetune.cpp; the model families in
// lm_families.cpp.
#include "apps/tasks/language_model.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "apps/data/parallel_corpus.h"
#include "apps/data/subword.h"
#include "apps/data/text.h"
#include "apps/tasks/lm_families.h"
#include "apps/tasks/lm_finetune.h"
#include "apps/tasks/task.h"
#include "apps/train/run_dir.h"
#include "apps/train/saved_model.h"
#include "apps/train/trainer.h"
#include "tapestry/dist/dist.h"
#include "tapestry/ops/file.h"
#include "tapestry/optim/optimizer.h"

namespace tapestry::apps {

using models::CausalLM;

double peak_rss_mib() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;  // Linux reports KiB
}

namespace {

// "sep line1 sep line2 sep ...": every line's tokens and its separator are predicted, so the
// loss over the stream (after the first token) covers exactly the bytes of the lines plus one
// newline each.
struct Stream {
  std::vector<int32_t> ids;
  int64_t bytes = 0;
};

Stream encode_stream(const LMTokenizer& tok, const std::vector<std::string>& lines) {
  Stream s;
  s.ids.push_back(static_cast<int32_t>(tok.separator()));
  for (const std::string& line : lines) {
    for (int64_t id : tok.encode(line)) s.ids.push_back(static_cast<int32_t>(id));
    s.ids.push_back(static_cast<int32_t>(tok.separator()));
    s.bytes += static_cast<int64_t>(line.size()) + 1;
  }
  return s;
}

// Windows of block + 1 tokens from `starts`, as ids [b, block] and the next-token targets.
std::pair<Tensor, Tensor> make_windows(const std::vector<int32_t>& stream, const std::vector<int64_t>& starts,
                                       int64_t len) {
  const int64_t b = static_cast<int64_t>(starts.size());
  std::vector<int64_t> x(static_cast<size_t>(b * len)), y(static_cast<size_t>(b * len));
  for (int64_t r = 0; r < b; ++r)
    for (int64_t t = 0; t < len; ++t) {
      x[r * len + t] = stream[static_cast<size_t>(starts[r] + t)];
      y[r * len + t] = stream[static_cast<size_t>(starts[r] + t + 1)];
    }
  return {tensor(x, {b, len}), tensor(y, {b, len})};
}

// The training stream as the Trainer's DataSource: each epoch cuts it into windows of block + 1
// tokens from an offset drawn from (seed, epoch) and shuffles them, so the plan follows from the
// epoch alone (Note [Exact resume]).
class LMData : public DataSource {
 public:
  LMData(CausalLM& model, const std::vector<int32_t>& stream, int64_t block, int64_t batch, uint64_t seed)
      : model_(model), stream_(stream), block_(block), batch_(batch), seed_(seed) {}
  int64_t plan(int64_t epoch) override {
    std::mt19937_64 rng(seed_ * 1000003ULL + static_cast<uint64_t>(epoch));
    const int64_t n = static_cast<int64_t>(stream_.size());
    // (The offset leaves room for at least one window: n >= block + 1 is checked up front.)
    const int64_t room = std::min(block_, n - block_ - 1) + 1;
    const int64_t offset = static_cast<int64_t>(rng() % static_cast<uint64_t>(room));
    starts_.clear();
    for (int64_t s = offset; s + block_ + 1 <= n; s += block_) starts_.push_back(s);
    for (size_t i = starts_.size(); i > 1; --i) std::swap(starts_[i - 1], starts_[rng() % i]);  // Fisher-Yates
    return (static_cast<int64_t>(starts_.size()) + batch_ - 1) / batch_;
  }
  TrainBatch batch(int64_t index) override {
    const size_t b = static_cast<size_t>(index * batch_);
    std::vector<int64_t> starts(starts_.begin() + b, starts_.begin() + std::min(starts_.size(), b + batch_));
    starts = shard_of(starts, shard_rank_, shard_world_);  // this rank's windows (all of them on one process)
    if (starts.empty()) return {0, {}};
    auto [x, y] = make_windows(stream_, starts, block_);
    return {x.numel(), [this, x = x, y = y] { return model_.loss(x, y); }};
  }

 private:
  CausalLM& model_;
  const std::vector<int32_t>& stream_;
  int64_t block_, batch_;
  uint64_t seed_;
  std::vector<int64_t> starts_;
};

void write_ids(const std::string& path, const std::vector<int32_t>& ids) {
  write_file_atomic(path, std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(int32_t)));
}

}  // namespace

double stream_loss(CausalLM& model, const std::vector<int32_t>& stream, int64_t block, int64_t batch) {
  NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  const int64_t n = static_cast<int64_t>(stream.size());
  double total = 0;
  int64_t count = 0;
  std::vector<int64_t> starts;
  auto flush = [&](int64_t len) {
    if (starts.empty()) return;
    auto [x, y] = make_windows(stream, starts, len);
    total += model.loss(x, y).item<double>() * static_cast<double>(x.numel());
    count += x.numel();
    starts.clear();
  };
  int64_t s = 0;
  for (; s + block + 1 <= n; s += block) {
    starts.push_back(s);
    if (static_cast<int64_t>(starts.size()) == batch) flush(block);
  }
  flush(block);
  if (s + 1 < n) {  // the tail, shorter than a window
    starts.push_back(s);
    flush(n - 1 - s);
  }
  if (was_training) model.train();
  return count ? total / static_cast<double>(count) : 0.0;
}


OptionTable options_table(LMOptions& o) {
  OptionTable trainer = trainer_options(o.trainer), t("lm");
  t.add("data", o.train_path, "the training text, UTF-8, plain or .gz (default: Multi30k's train.en)");
  t.add("val", o.val_path, "validation text (default: Multi30k's val.en, or with --data the last 5% of it)");
  t.take(trainer, "out");
  t.add("tokenizer", o.tokenizer, "sentencepiece (trained on --data), byte, or gpt2 (GPT-2's BPE; "
        "tools/get-gpt2-tokenizer.sh fetches its files)").one_of({"sentencepiece", "byte", "gpt2"});
  t.add("gpt2-dir", o.gpt2_dir, "where encoder.json and vocab.bpe are (default: $TAPESTRY_GPT2_DIR or "
        "~/.cache/tapestry/gpt2)");
  t.add("vocab-size", o.vocab_size, "SentencePiece vocabulary").positive();
  std::vector<std::string> families, model_help, config_help;
  for (const LMFamily& f : lm_families()) {
    families.push_back(f.name);
    model_help.push_back(fmt::format("{} ({})", f.name, f.blurb));
    config_help.push_back(fmt::format("{} {}", f.name, fmt::join(f.configs, ", ")));
  }
  t.add("model", o.model, names_text(model_help)).one_of(families).recipe();
  t.add("config", o.config, fmt::format("model size: {}", fmt::join(config_help, "; "))).recipe();
  t.add("block", o.block, "context length of the training windows").positive().recipe();
  t.add("batch", o.batch, "windows per batch").positive().recipe();
  t.take(trainer, "epochs").recipe();  // the cosine schedule spans them
  o.adamw.add_rows(t, "AdamW weight decay on matrices (none on biases and LayerNorm)");
  t.add("dropout", o.dropout, "dropout (with --lora-rank: on the adapters' inputs; a fully fine-tuned --base has none)")
      .at_least(0).below(1);
  t.take(trainer, "clip-norm");
  t.take(trainer, "seed").recipe();
  t.add("limit", o.limit, "train on the first N lines only (0: all)").at_least(0).recipe();
  t.add("base", o.base, "fine-tune this model instead of training one: a run folder of train --task lm, or a Hugging "
        "Face Llama directory (its model and tokenizer replace --model, --config and --tokenizer)").recipe();
  t.add("lora-rank", o.lora_rank, "with --base: freeze it and train LoRA adapters of this rank, saved alone in "
        "adapter.safetensors (0: every weight trains)").at_least(0).recipe();
  t.add("lora-alpha", o.lora_alpha, "the LoRA update is scaled by alpha / rank").above(0).recipe();
  t.add("lora-targets", o.lora_targets, "the layers LoRA adapts, comma-separated: q, k, v, o (attention), gate, up, "
        "down (MLP)").check(lora_targets_problem).recipe();
  t.add("merge", o.merge, "after a LoRA run, write its base with the adapters merged in to OUT/merged (with "
        "--resume, of a finished run too)").this_run_only();
  add_run_rows(t, trainer);
  t.add("export-ids", o.export_ids, "also write the token streams (train.ids, val.ids: int32) for tools/lm-compare.sh")
      .this_run_only();
  t.add_check([&o] { return o.lora_rank == 0 || !o.base.empty() ? "" : "--lora-rank needs --base, the model whose adapters it trains"; });
  t.add_check([&o] { return !o.merge || o.lora_rank > 0 ? "" : "--merge needs --lora-rank: it merges a LoRA run's adapters into the base"; });
  return t;
}

std::string options_to_toml(const LMOptions& options) {
  LMOptions o = options;  // the default corpus written out, so that the file says what was read
  if (o.train_path.empty()) {
    o.train_path = default_data_dir() + "/train.en.gz";
    if (o.val_path.empty()) o.val_path = default_data_dir() + "/val.en.gz";
  }
  return options_table(o).to_toml();
}

namespace {

// The text of a run: --data and --val, or the default recipe's Multi30k English side; without
// --val, the last 5% of --data is held out.
struct LMText {
  std::string train_path, val_path;  // val_path: what the log and the curves call it
  std::vector<std::string> train, val;
};

LMText read_lm_text(const LMOptions& o) {
  LMText text;
  text.train_path = o.train_path.empty() ? default_data_dir() + "/train.en.gz" : o.train_path;
  text.train = read_lines(text.train_path);
  text.val_path = o.val_path;
  if (text.val_path.empty() && o.train_path.empty()) text.val_path = default_data_dir() + "/val.en.gz";
  if (!text.val_path.empty()) {
    text.val = read_lines(text.val_path);
  } else {
    TP_CHECK(text.train.size() >= 2, "train: {} has {} line(s); without --val, at least 2 are needed (the last "
             "5% are held out for validation)", text.train_path, text.train.size());
    const size_t held = std::max<size_t>(1, text.train.size() / 20);
    text.val.assign(text.train.end() - static_cast<int64_t>(held), text.train.end());
    text.train.resize(text.train.size() - held);
    text.val_path = fmt::format("the last {} lines of {}", held, text.train_path);
  }
  if (o.limit > 0 && static_cast<size_t>(o.limit) < text.train.size()) text.train.resize(static_cast<size_t>(o.limit));
  // Validation text without a character to predict would report a loss of 0 and bits per byte of
  // NaN after the whole run: refused before anything is trained or written.
  const bool has_text = std::any_of(text.val.begin(), text.val.end(), [](const std::string& line) {
    return line.find_first_not_of(" \t\r\f\v") != std::string::npos;
  });
  TP_CHECK(has_text, "train: the validation text ({}) is empty: give --val a file with text", text.val_path);
  return text;
}

// The --tokenizer, trained (sentencepiece) or copied (gpt2's files) into the run folder, so that
// the folder stands alone.
std::unique_ptr<LMTokenizer> make_lm_tokenizer(const LMOptions& o, const LMText& text) {
  const TrainerOptions& to = o.trainer;
  if (o.tokenizer == "byte") return byte_tokenizer();
  if (o.tokenizer == "sentencepiece")
    return sentencepiece_tokenizer(Subword::train_in_folder(to.out_dir, o.vocab_size, o.limit, to.seed,
                                                            text.train_path, [&] { return text.train; }));
  const std::string src = o.gpt2_dir.empty() ? default_gpt2_dir() : o.gpt2_dir;
  std::unique_ptr<LMTokenizer> tok = gpt2_tokenizer(src);
  if (dist::is_main())  // rank 0 writes the run folder
    write_files(to.out_dir, {{"gpt2/encoder.json", read_whole_file(src + "/encoder.json")},
                             {"gpt2/vocab.bpe", read_whole_file(src + "/vocab.bpe")}});
  return tok;
}

// --export-ids: the token streams for tools/lm-compare.sh (int32), and what they hold.
void export_streams(const std::string& dir, const LMTokenizer& tok, const Stream& train, const Stream& val) {
  if (!dist::is_main()) return;
  write_ids(dir + "/train.ids", train.ids);
  write_ids(dir + "/val.ids", val.ids);
  write_file_atomic(dir + "/ids.json",
                    fmt::format("{{\"vocab\": {}, \"train_tokens\": {}, \"val_tokens\": {}, \"val_bytes\": {}, "
                                "\"train_bytes\": {}, \"separator\": {}}}\n", tok.vocab_size(), train.ids.size(),
                                val.ids.size(), val.bytes, train.bytes, tok.separator()));
}


// The run's token streams, checked against the windows and batches they must fill.
struct Streams {
  Stream train, val;
};

Streams encode_streams(const LMOptions& o, const LMTokenizer& tok, const LMText& text) {
  Streams s{encode_stream(tok, text.train), encode_stream(tok, text.val)};
  const size_t n = s.train.ids.size();
  TP_CHECK(static_cast<int64_t>(n) > o.block, "train: {} gives {} tokens, fewer than one window of --block {} + 1",
           text.train_path, n, o.block);
  // A --block near the text's length gives an epoch of one huge window (minutes per step, and
  // nothing learned): the text must fill one batch of windows.
  const int64_t windows = (static_cast<int64_t>(n) - 1) / o.block;
  TP_CHECK(windows >= o.batch, "train: {} gives {} tokens, {} window(s) of --block {}: fewer than one batch (--batch "
           "{} needs {} tokens); lower --block or --batch", text.train_path, n, windows, o.block, o.batch,
           o.batch * o.block + 1);
  if (o.export_ids) export_streams(o.trainer.out_dir, tok, s.train, s.val);
  return s;
}

// The model a run trains: --model at --config, or the base (with LoRA: frozen, adapters beside
// it); the metadata written with its weights, and a line describing it.
struct LMModel {
  std::shared_ptr<CausalLM> model;
  std::map<std::string, std::string> metadata;
  std::string shape;
};

LMModel make_lm_model(const LMOptions& o, const LMFamily& family, const std::shared_ptr<CausalLM>& base,
                      const LMTokenizer& tok, const std::vector<std::string>& lora_layers) {
  LMModel m;
  m.model = base ? base : family.make(o.config, tok.vocab_size(), o.block, o.dropout);
  TP_CHECK(o.block <= m.model->context_length(), "train: --block {} is longer than the base's context ({} positions)",
           o.block, m.model->context_length());
  m.shape = family.describe(*m.model);
  m.metadata = o.lora_rank > 0 ? attach_lora(*m.model, o, tok, lora_layers, m.shape) : lm_metadata(*m.model, tok);
  return m;
}

// The run's figures, from the Trainer's result; the final line when the run finished.
LMResult lm_result(const FitResult& fit, const CausalLM& model, const Stream& train, const Stream& val, double seconds) {
  LMResult r;
  r.steps = fit.steps, r.stopped = fit.stopped, r.interrupted = fit.interrupted;
  r.train_tokens = static_cast<int64_t>(train.ids.size()), r.val_tokens = static_cast<int64_t>(val.ids.size());
  r.val_bytes = val.bytes, r.parameters = model.num_parameters(), r.trainable_parameters = model.num_trainable_parameters();
  r.seconds = seconds;
  int64_t tokens = 0;
  double train_seconds = 0;
  for (const EpochRecord& e : fit.epochs) {
    tokens += static_cast<int64_t>(e.tokens_per_s * e.seconds + 0.5);
    train_seconds += e.seconds;
  }
  r.tokens_per_s = train_seconds > 0 ? static_cast<double>(tokens) / train_seconds : 0;
  r.peak_rss_mib = peak_rss_mib();
  if (fit.stopped || fit.interrupted || fit.last_metrics.empty()) return r;
  r.val_loss = metric(fit.last_metrics, "val_loss");
  r.val_bpb = metric(fit.last_metrics, "val_bpb");
  r.val_ppl = metric(fit.last_metrics, "val_ppl");
  std::printf("final: val loss %.4f, perplexity %.2f, bits per byte %.4f (%zu val tokens, %lld bytes); %lld steps, "
              "%.0f train tokens/s, wall time %s, peak RSS %.0f MiB\n",
              r.val_loss, r.val_ppl, r.val_bpb, val.ids.size() - 1, (long long)val.bytes, (long long)r.steps,
              r.tokens_per_s, clock_text(r.seconds).c_str(), r.peak_rss_mib);
  std::fflush(stdout);
  return r;
}


// Val loss, bits per byte and perplexity over the val stream.
Metrics lm_metrics(CausalLM& model, const Stream& val, const LMOptions& o) {
  const double loss = stream_loss(model, val.ids, o.block, o.batch);
  const double bpb = loss * static_cast<double>(val.ids.size() - 1) / std::log(2.0) / static_cast<double>(val.bytes);
  return Metrics{{"val_loss", "val loss", loss, 4, "", false},
                 {"val_bpb", "val bits/byte", bpb, 4, "", false},
                 {"val_ppl", "val perplexity", std::exp(loss), 2, "", true}};
}

// --merge: from the model in memory, which holds what adapter.safetensors does (no base loaded again).
void merge_in_memory(const CausalLM& model, const LMTokenizer& tok, const LMOptions& o) {
  const std::string merged_dir = o.trainer.out_dir + "/merged";
  const int64_t n = write_merged(model, tok, o.base, merged_dir);
  std::printf("merged: the base with the adapters added in (%lld parameters) in %s; `tapestry generate %s %s`\n",
              (long long)n, merged_dir.c_str(), is_hf_dir(o.base) ? "--hf" : "--checkpoint", merged_dir.c_str());
  std::fflush(stdout);
}

}  // namespace

LMResult train_language_model(const LMOptions& options) {
  LMOptions o = options;
  RunSetup run(options_table(o), o.trainer, [&o] { return options_to_toml(o); });
  // The config's name, which depends on the model, is checked before the data are read; a base
  // brings its own model.
  LanguageModel base = o.base.empty() ? LanguageModel{} : load_base(o);
  const LMFamily& family = lm_family(o.model);
  TP_CHECK(base.model || std::count(family.configs.begin(), family.configs.end(), o.config),
           "train: --config: must be {} for --model {}, got '{}'", names_text(family.configs), o.model, o.config);
  const std::vector<std::string> lora_layers = o.lora_rank > 0 ? lora_layer_names(family, o.lora_targets)
                                                               : std::vector<std::string>{};
  const LMText text = read_lm_text(o);
  run.open({"spm.model", "spm.recipe", "gpt2", "hf", "merged", "train.ids", "val.ids", "ids.json"});
  const std::unique_ptr<LMTokenizer> tok = base.model ? std::move(base.tokenizer) : make_lm_tokenizer(o, text);
  const Streams s = encode_streams(o, *tok, text);
  const LMModel made = make_lm_model(o, family, base.model, *tok, lora_layers);
  CausalLM& model = *made.model;
  model.to(training_device(o.trainer.device));  // before the optimizer, whose state follows the parameters
  const std::unique_ptr<optim::AdamW> adamw = o.adamw.adamw(model.decay_parameters(), model.no_decay_parameters(), 0.95);
  LMData data(model, s.train.ids, o.block, o.batch, o.trainer.seed);
  const int64_t steps_per_epoch = data.plan(1), total_steps = steps_per_epoch * o.trainer.epochs;
  const optim::CosineSchedule schedule = o.adamw.schedule(total_steps);
  const std::string what = base.model ? fmt::format("{} from {}", family.title, o.base) : family.title + " " + o.config;
  std::printf("train: language model on %s (%zu lines, %zu tokens, %lld bytes), val %s (%zu tokens), tokenizer %s "
              "(vocabulary %lld), %s (%s, %lld parameters), block %lld, batch %lld, %lld epochs of %lld steps, AdamW "
              "lr %.2e -> %.2e (cosine, warmup %lld), weight decay %.2f\n",
              text.train_path.c_str(), text.train.size(), s.train.ids.size(), (long long)s.train.bytes,
              text.val_path.c_str(), s.val.ids.size(), tok->name().c_str(), (long long)tok->vocab_size(), what.c_str(),
              made.shape.c_str(), (long long)model.num_parameters(), (long long)o.block, (long long)o.batch,
              (long long)o.trainer.epochs, (long long)steps_per_epoch, o.adamw.lr, o.adamw.min_lr,
              (long long)o.adamw.warmup_steps(total_steps), o.adamw.weight_decay);
  std::fflush(stdout);

  // The recipe beside the rows: what follows from the options (the data read, the tokenizer's
  // vocabulary, the base's fingerprint).
  std::map<std::string, std::string> recipe = {{"task", "lm"}, {"tokenizer", tok->name()},
                                               {"vocab", std::to_string(tok->vocab_size())}, {"data", text.train_path}};
  if (o.lora_rank > 0) recipe["base_fingerprint"] = made.metadata.at("base_fingerprint");
  TrainerOptions& to = run.record(recipe, made.metadata, fmt::format("{} on {} ({} tokens)", what, text.train_path, tok->name()));
  to.recipe_defaults = {{"model", "gpt"}};  // checkpoints from before the Llama hold GPTs
  if (base.model) to.run_files.merge(tokenizer_files(o.base, *tok, false));  // the folder stands alone
  to.trainable_only = o.lora_rank > 0;
  const auto start = std::chrono::steady_clock::now();
  Trainer trainer(model, *adamw, &schedule, to);
  trainer.evaluate = [&](int64_t, int64_t) { return lm_metrics(model, s.val, o); };
  const FitResult fit = trainer.fit(data);
  LMResult result = lm_result(fit, model, s.train, s.val, seconds_since(start));
  if (o.merge && !fit.stopped && !fit.interrupted && dist::is_main()) merge_in_memory(model, *tok, o);
  return result;
}

LanguageModel load_language_model(const std::string& dir) {
  if (!file_exists(dir + "/model.safetensors") && file_exists(dir + "/adapter.safetensors"))
    return load_adapter_language_model(dir);  // a LoRA run: its base with the adapters
  const SavedModel saved = read_saved_model(dir, {"lm"}, "a language model", "tapestry train --task lm");
  const std::string& path = saved.path;
  LanguageModel lm;
  const std::string t = saved.meta("tokenizer");
  if (t == "byte") lm.tokenizer = byte_tokenizer();
  else if (t == "sentencepiece") lm.tokenizer = sentencepiece_tokenizer(dir + "/spm.model");
  else if (t == "gpt2") lm.tokenizer = gpt2_tokenizer(dir + "/gpt2");
  else if (t == "hf-bpe" || t == "hf-sentencepiece") lm.tokenizer = hf_tokenizer(dir + "/hf");  // a fine-tuned Hugging Face model
  else throw Error(fmt::format("{}: unknown tokenizer '{}'", path, t));
  // Run folders from before the Llama have no "model" entry: they hold a GPT.
  const std::string kind = saved.file.metadata.count("model") ? saved.meta("model") : "gpt";
  std::vector<std::string> kinds;
  for (const LMFamily& f : lm_families()) {
    if (f.name == kind) lm.model = f.from_metadata(saved);
    kinds.push_back(f.name);
  }
  TP_CHECK(lm.model, "{}: unknown model '{}' (expected {})", path, kind, names_text(kinds));
  TP_CHECK(lm.tokenizer->vocab_size() == lm.model->vocab_size(), "{}: the model has {} tokens but the tokenizer {}",
           path, lm.model->vocab_size(), lm.tokenizer->vocab_size());
  lm.model->load_state_dict(saved.file.as_map());
  lm.model->eval();
  return lm;
}

Task language_model_task() {
  TaskSpec<LMOptions> t;
  t.name = "lm", t.summary = "a GPT language model on any text";
  t.table = [](LMOptions& o) { return options_table(o); };
  t.toml = [](const LMOptions& o) { return options_to_toml(o); };
  t.run = [](const LMOptions& o) { return exit_status(train_language_model(o).interrupted); };
  return make_task(std::move(t));
}

}  // namespace tapestry::apps
