// The language-model task (see language_model.h).
#include "apps/tasks/language_model.h"

#include "apps/tasks/task.h"
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "apps/data/parallel_corpus.h"
#include "apps/data/subword.h"
#include "apps/data/text.h"
#include "apps/train/run_dir.h"
#include "apps/train/saved_model.h"
#include "apps/train/trainer.h"
#include "tapestry/ops/file.h"
#include "tapestry/dist/dist.h"
#include "tapestry/nn/lora.h"
#include "tapestry/nn/safetensors.h"
#include "tapestry/models/gpt.h"
#include "tapestry/models/llama.h"
#include "tapestry/optim/optimizer.h"

namespace tapestry::apps {

using namespace models;

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

namespace {

// --lora-targets' names, and the Linear layers they name in each model.
const std::vector<std::string> kLoraTargets = {"q", "k", "v", "o", "gate", "up", "down"};
const std::map<std::string, std::string> kLlamaLayers = {{"q", "q_proj"},       {"k", "k_proj"},   {"v", "v_proj"},
                                                         {"o", "o_proj"},       {"gate", "gate_proj"},
                                                         {"up", "up_proj"},     {"down", "down_proj"}};
const std::map<std::string, std::string> kGptLayers = {{"q", "w_q"}, {"k", "w_k"}, {"v", "w_v"},
                                                       {"o", "w_o"}, {"up", "fc"},  {"down", "proj"}};

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ',');) {
    const size_t a = part.find_first_not_of(' '), b = part.find_last_not_of(' ');
    if (a != std::string::npos) parts.push_back(part.substr(a, b - a + 1));
  }
  return parts;
}

std::string lora_targets_problem(const std::string& value) {
  const std::vector<std::string> parts = split_list(value);
  if (parts.empty()) return "give some of " + names_text(kLoraTargets);
  // Issue 44: "q,,k" and "q,q" were taken, the empty name and the repeat dropped silently.
  if (static_cast<size_t>(std::count(value.begin(), value.end(), ',')) + 1 != parts.size())
    return fmt::format("'{}' has an empty name between commas", value);
  std::set<std::string> seen;
  for (const std::string& part : parts) {
    if (std::find(kLoraTargets.begin(), kLoraTargets.end(), part) == kLoraTargets.end())
      return fmt::format("'{}' is not a layer: give some of {}", part, names_text(kLoraTargets));
    if (!seen.insert(part).second) return fmt::format("'{}' is named twice", part);
  }
  return "";
}

// The model's Linear layer names for --lora-targets.
std::vector<std::string> lora_layer_names(const std::string& model, const std::string& targets) {
  const auto& layers = model == "llama" ? kLlamaLayers : kGptLayers;
  std::vector<std::string> names;
  for (const std::string& part : split_list(targets)) {
    TP_CHECK(layers.count(part), "train: --lora-targets: the GPT has no '{}' layer (its MLP is up and down)", part);
    names.push_back(layers.at(part));
  }
  return names;
}

}  // namespace

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
  t.add("model", o.model, "gpt (GPT-2's blocks) or llama (RMSNorm, rotary positions, SwiGLU, grouped-query "
        "attention)").one_of({"gpt", "llama"}).recipe();
  t.add("config", o.config, fmt::format("model size: gpt {}; llama {}", fmt::join(GPTConfig::names(), ", "),
                                        fmt::join(LlamaConfig::names(), ", "))).recipe();
  t.add("block", o.block, "context length of the training windows").positive().recipe();
  t.add("batch", o.batch, "windows per batch").positive().recipe();
  t.take(trainer, "epochs").recipe();  // the cosine schedule spans them
  t.add("warmup", o.warmup, "steps of linear warmup before the cosine decay").positive();
  t.add("lr", o.lr, "peak learning rate (AdamW)").above(0);
  t.add("min-lr", o.min_lr, "learning rate at the end of the cosine decay").at_least(0);
  t.add("weight-decay", o.weight_decay, "AdamW weight decay on matrices (none on biases and LayerNorm)").at_least(0);
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
  t.take(trainer, "save-every");
  t.add_process_rows(o.threads, o.device);
  t.take_all(trainer, kRunControlFlags);
  t.add("export-ids", o.export_ids, "also write the token streams (train.ids, val.ids: int32) for tools/lm-compare.sh")
      .this_run_only();
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
  const std::string src = o.gpt2_dir.empty() ? default_gpt2_dir() : o.gpt2_dir, dst = to.out_dir + "/gpt2";
  std::unique_ptr<LMTokenizer> tok = gpt2_tokenizer(src);
  if (dist::is_main()) {  // rank 0 writes the run folder
    std::filesystem::create_directories(dst);
    for (const char* f : {"encoder.json", "vocab.bpe"}) {
      std::ifstream in(src + "/" + f, std::ios::binary);
      write_file_atomic(dst + "/" + f, std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()));
    }
  }
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

// GPT's (and Llama's) AdamW: betas (0.9, 0.95), weight decay on the matrices only.
std::unique_ptr<optim::AdamW> lm_adamw(CausalLM& model, const LMOptions& o) {
  optim::AdamWOptions ao;
  ao.lr = o.lr, ao.beta1 = 0.9, ao.beta2 = 0.95, ao.eps = 1e-8, ao.weight_decay = o.weight_decay;
  return std::make_unique<optim::AdamW>(
      std::vector<optim::ParamGroup>{{model.decay_parameters(), std::nullopt, o.weight_decay},
                                     {model.no_decay_parameters(), std::nullopt, 0.0}},
      ao);
}

std::map<std::string, std::string> gpt_metadata(const GPTConfig& cfg, const LMTokenizer& tok) {
  return {{"task", "lm"},
          {"model", "gpt"},
          {"tokenizer", tok.name()},
          {"vocab", std::to_string(cfg.vocab)},
          {"block_size", std::to_string(cfg.block_size)},
          {"layers", std::to_string(cfg.layers)},
          {"heads", std::to_string(cfg.heads)},
          {"d_model", std::to_string(cfg.d_model)},
          {"d_ff", std::to_string(cfg.ff_dim())},
          {"gelu_tanh", cfg.gelu_tanh ? "1" : "0"}};
}

std::map<std::string, std::string> llama_metadata(const LlamaConfig& cfg, const LMTokenizer& tok) {
  return {{"task", "lm"},
          {"model", "llama"},
          {"tokenizer", tok.name()},
          {"vocab", std::to_string(cfg.vocab)},
          {"max_positions", std::to_string(cfg.max_positions)},
          {"layers", std::to_string(cfg.layers)},
          {"heads", std::to_string(cfg.heads)},
          {"kv_heads", std::to_string(cfg.kv_heads)},
          {"d_model", std::to_string(cfg.d_model)},
          {"d_ff", std::to_string(cfg.d_ff)},
          {"rope_theta", fmt::format("{}", cfg.rope_theta)},
          {"rms_eps", fmt::format("{}", cfg.rms_eps)},
          {"tie_embeddings", cfg.tie_embeddings ? "1" : "0"}};
}

// The --model at --config for a vocabulary, with the checkpoint metadata that rebuilds it and a
// line describing it.
struct LMModel {
  std::string name;  // "GPT" or "Llama", for the log
  std::shared_ptr<CausalLM> model;
  std::map<std::string, std::string> metadata;
  std::string shape;
};

LMModel make_lm_model(const LMOptions& o, const LMTokenizer& tok) {
  LMModel m;
  if (o.model == "llama") {
    LlamaConfig cfg = LlamaConfig::named(o.config, tok.vocab_size());
    cfg.max_positions = o.block;
    cfg.dropout = o.dropout;
    m.name = "Llama";
    m.model = std::make_shared<Llama>(cfg);
    m.metadata = llama_metadata(cfg, tok);
    m.shape = fmt::format("{} layers, {} heads ({} key/value), d_model {}", cfg.layers, cfg.heads, cfg.kv_heads,
                          cfg.d_model);
  } else {
    GPTConfig cfg = GPTConfig::named(o.config, tok.vocab_size());
    cfg.block_size = o.block;
    cfg.dropout = o.dropout;
    m.name = "GPT";
    m.model = std::make_shared<GPT>(cfg);
    m.metadata = gpt_metadata(cfg, tok);
    m.shape = fmt::format("{} layers, {} heads, d_model {}", cfg.layers, cfg.heads, cfg.d_model);
  }
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

// ---- fine-tuning (--base) and LoRA

bool is_hf_dir(const std::string& dir) { return file_exists(dir + "/config.json"); }

// The model to fine-tune: a run folder of train --task lm, or a Hugging Face Llama directory.
LanguageModel load_base(const std::string& dir) {
  TP_CHECK(std::filesystem::is_directory(dir), "train: --base {}: no such directory", dir);
  TP_CHECK(!file_exists(dir + "/adapter.safetensors") || file_exists(dir + "/model.safetensors"),
           "train: --base {} is a LoRA run (adapters on a base of their own): fine-tune its merged model instead "
           "(`tapestry train --config-file {}/config.toml --resume --merge` writes it to {}/merged)", dir, dir, dir);
  LanguageModel lm = is_hf_dir(dir) ? load_hf_language_model(dir) : load_language_model(dir);
  lm.model->train();
  return lm;
}

std::string read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TP_CHECK(in.good(), "cannot read {}", path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Files by their path relative to a folder, written there (atomically, with their folders).
using FolderFiles = std::map<std::string, std::string>;
void write_files(const std::string& dir, const FolderFiles& files) {
  for (const auto& [name, bytes] : files) {
    std::filesystem::create_directories(std::filesystem::path(dir + "/" + name).parent_path());
    write_file_atomic(dir + "/" + name, bytes);
  }
}

// The tokenizer's files of a base (a run folder or a Hugging Face directory), so that a folder
// made from it stands alone: spm.model or gpt2/ as a run folder holds them, and a Hugging Face
// model's under hf/ (where load_language_model reads them) or, with hf_layout, at the top.
FolderFiles tokenizer_files(const std::string& base, const LMTokenizer& tok, bool hf_layout) {
  FolderFiles files;
  const std::string kind = tok.name();
  if (kind == "sentencepiece") {
    files["spm.model"] = read_whole_file(base + "/spm.model");
  } else if (kind == "gpt2") {
    for (const char* f : {"encoder.json", "vocab.bpe"}) files[std::string("gpt2/") + f] = read_whole_file(base + "/gpt2/" + f);
  } else if (kind != "byte") {  // hf-sentencepiece, hf-bpe
    const std::string from = is_hf_dir(base) ? base : base + "/hf", to = hf_layout ? "" : "hf/";
    for (const char* f : {"tokenizer.model", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"})
      if (file_exists(from + "/" + f)) files[to + f] = read_whole_file(from + "/" + f);
  }
  return files;
}

// A LoRA run's folder: the base it names, loaded and checked against the fingerprint it recorded,
// with the adapters attached and loaded.
struct AdapterRun {
  LanguageModel lm;
  std::string base;
};

AdapterRun load_adapter_run(const std::string& dir) {
  SavedModel saved;
  saved.path = dir + "/adapter.safetensors";
  saved.kind = "a LoRA adapter of train --task lm";
  saved.file = nn::load_safetensors(saved.path);
  TP_CHECK(saved.meta("task") == "lm" && saved.meta("adapter") == "lora", "{} is not {}", saved.path, saved.kind);
  AdapterRun run;
  run.base = saved.meta("base");
  TP_CHECK(std::filesystem::is_directory(run.base), "{}: its base model {} is not there; the adapters apply to that "
           "model only: put it back", saved.path, run.base);
  run.lm = is_hf_dir(run.base) ? load_hf_language_model(run.base) : load_language_model(run.base);
  const std::string found = nn::fingerprint(run.lm.model->state_dict()), recorded = saved.meta("base_fingerprint");
  TP_CHECK(found == recorded, "{}: the base model {} has changed since the adapters were trained (fingerprint {}, "
           "recorded {}); they apply to the model they were trained on only", saved.path, run.base, found, recorded);
  nn::LoRAOptions lora;
  lora.rank = saved.num("lora_rank");
  lora.alpha = saved.real("lora_alpha");
  lora.targets = split_list(saved.meta("lora_targets"));
  try {
    nn::add_lora(*run.lm.model, lora);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", saved.path, e.what()));
  }
  std::set<std::string> expected, held;
  for (const auto& [name, t] : nn::lora_state_dict(*run.lm.model)) expected.insert(name);
  for (const auto& [name, t] : saved.file.tensors) held.insert(name);
  TP_CHECK(expected == held, "{} holds {} tensors, but rank {} adapters on {} make {}: the file is not this run's "
           "adapters", saved.path, held.size(), lora.rank, saved.meta("lora_targets"), expected.size());
  run.lm.model->load_state_dict(saved.file.as_map(), false);
  run.lm.model->eval();
  return run;
}

// The metadata of a fully fine-tuned model, as a run of its kind from scratch writes it.
LMModel base_lm_model(const std::shared_ptr<CausalLM>& model, const LMTokenizer& tok) {
  LMModel m;
  m.model = model;
  if (auto* llama = dynamic_cast<Llama*>(model.get())) {
    const LlamaConfig& c = llama->config;
    m.name = "Llama";
    m.metadata = llama_metadata(c, tok);
    m.shape = fmt::format("{} layers, {} heads ({} key/value), d_model {}", c.layers, c.heads, c.kv_heads, c.d_model);
  } else {
    const GPTConfig& c = dynamic_cast<GPT&>(*model).config;
    m.name = "GPT";
    m.metadata = gpt_metadata(c, tok);
    m.shape = fmt::format("{} layers, {} heads, d_model {}", c.layers, c.heads, c.d_model);
  }
  return m;
}

}  // namespace

namespace {

// The merged model of a model with adapters (nn::merged_state_dict), in its base's own layout: a
// Hugging Face directory (the base's config.json, Hugging Face's names) or a run folder (the
// metadata a run of its kind writes), with the tokenizer's files. Written beside, then renamed
// over an older one: a crash leaves the old folder or none. Returns the parameter count.
int64_t write_merged(const CausalLM& model, const LMTokenizer& tok, const std::string& base, const std::string& out_dir) {
  const nn::NamedTensors merged = nn::merged_state_dict(model);
  const std::string tmp = out_dir + ".tmp";
  std::filesystem::remove_all(tmp);
  std::filesystem::create_directories(tmp);
  if (is_hf_dir(base)) {
    for (const char* f : {"config.json", "generation_config.json"})
      if (file_exists(base + "/" + f)) write_file_atomic(tmp + "/" + f, read_whole_file(base + "/" + f));
    nn::NamedTensors named;
    for (const auto& [name, t] : merged) named.emplace_back(name == "lm_head.weight" ? name : "model." + name, t);
    nn::save_safetensors(tmp + "/model.safetensors", named, {{"format", "pt"}});
  } else {
    // The shape of the model without its adapters is the base's: its run's metadata.
    std::map<std::string, std::string> meta;
    if (const auto* llama = dynamic_cast<const Llama*>(&model)) meta = llama_metadata(llama->config, tok);
    else meta = gpt_metadata(dynamic_cast<const GPT&>(model).config, tok);
    nn::save_safetensors(tmp + "/model.safetensors", merged, meta);
  }
  write_files(tmp, tokenizer_files(base, tok, is_hf_dir(base)));
  std::filesystem::remove_all(out_dir);
  std::filesystem::rename(tmp, out_dir);
  int64_t count = 0;
  for (const auto& [name, t] : merged) count += t.numel();
  return count;
}

}  // namespace

int64_t merge_lora_run(const std::string& run_dir, const std::string& out_dir) {
  TP_CHECK(file_exists(run_dir + "/adapter.safetensors"), "merge: {} has no adapter.safetensors (not a LoRA run of "
           "train --task lm --base DIR --lora-rank R)", run_dir);
  const AdapterRun run = load_adapter_run(run_dir);
  return write_merged(*run.lm.model, *run.lm.tokenizer, run.base, out_dir);
}

LMResult train_language_model(const LMOptions& options) {
  LMOptions o = options;
  const OptionTable table = options_table(o);
  table.check();  // before the data are read, as the flags would be
  TP_CHECK(o.min_lr <= o.lr, "train: --min-lr {} is above --lr {}", o.min_lr, o.lr);
  const bool fine_tune = !o.base.empty(), lora = o.lora_rank > 0;
  TP_CHECK(fine_tune || !lora, "train: --lora-rank needs --base, the model whose adapters it trains");
  TP_CHECK(lora || !o.merge, "train: --merge needs --lora-rank: it merges a LoRA run's adapters into the base");
  if (o.threads > 0) set_num_threads(static_cast<int>(o.threads));
  options_to_toml(o);  // refuses text TOML cannot hold, before anything is read or written
  // The config's name, which depends on the model, is checked before the data are read; a base
  // brings its own model.
  LanguageModel base;
  if (fine_tune) {
    base = load_base(o.base);
    // Recorded as an absolute path (in the recipe, config.toml and adapter.safetensors): the run
    // resumes and loads from any working directory.
    o.base = std::filesystem::absolute(o.base).lexically_normal().string();
    o.model = dynamic_cast<Llama*>(base.model.get()) ? "llama" : "gpt";
    o.config = "base";
  } else {
    const std::vector<std::string> configs = o.model == "llama" ? LlamaConfig::names() : GPTConfig::names();
    TP_CHECK(std::find(configs.begin(), configs.end(), o.config) != configs.end(),
             "train: --config: must be {} for --model {}, got '{}'", names_text(configs), o.model, o.config);
  }
  const std::vector<std::string> lora_layers = lora ? lora_layer_names(o.model, o.lora_targets) : std::vector<std::string>{};
  const std::string config_toml = options_to_toml(o);
  TrainerOptions to = o.trainer;

  // Data.
  const LMText text = read_lm_text(o);
  RunFolder folder(to.out_dir, to.resume, to.overwrite,
                   {"spm.model", "spm.recipe", "gpt2", "hf", "merged", "train.ids", "val.ids", "ids.json", "config.toml"});
  manual_seed(to.seed);
  const std::unique_ptr<LMTokenizer> tok = fine_tune ? std::move(base.tokenizer) : make_lm_tokenizer(o, text);
  const Stream train = encode_stream(*tok, text.train), val = encode_stream(*tok, text.val);
  TP_CHECK(static_cast<int64_t>(train.ids.size()) > o.block, "train: {} gives {} tokens, fewer than one window of "
           "--block {} + 1", text.train_path, train.ids.size(), o.block);
  // A --block near the text's length gives an epoch of one huge window (minutes per step, and
  // nothing learned): the text must fill one batch of windows.
  const int64_t windows = (static_cast<int64_t>(train.ids.size()) - 1) / o.block;
  TP_CHECK(windows >= o.batch, "train: {} gives {} tokens, {} window(s) of --block {}: fewer than one batch (--batch "
           "{} needs {} tokens); lower --block or --batch", text.train_path, train.ids.size(), windows, o.block,
           o.batch, o.batch * o.block + 1);
  if (o.export_ids) export_streams(to.out_dir, *tok, train, val);

  // Model (with LoRA: the base frozen, adapters beside it), optimizer and schedule.
  LMModel made = fine_tune ? base_lm_model(base.model, *tok) : make_lm_model(o, *tok);
  CausalLM& model = *made.model;
  TP_CHECK(o.block <= model.context_length(), "train: --block {} is longer than the base's context ({} positions)",
           o.block, model.context_length());
  std::string base_fingerprint;
  if (lora) {
    base_fingerprint = nn::fingerprint(model.state_dict());
    nn::LoRAOptions lo;
    lo.rank = o.lora_rank, lo.alpha = o.lora_alpha, lo.dropout = o.dropout, lo.targets = lora_layers;
    const std::vector<std::string> adapted = nn::add_lora(model, lo);
    made.metadata = {{"task", "lm"},
                     {"adapter", "lora"},
                     {"model", o.model},
                     {"tokenizer", tok->name()},
                     {"base", o.base},
                     {"base_fingerprint", base_fingerprint},
                     {"lora_rank", std::to_string(o.lora_rank)},
                     {"lora_alpha", fmt::format("{}", o.lora_alpha)},
                     {"lora_targets", fmt::format("{}", fmt::join(lora_layers, ","))}};
    made.shape += fmt::format("; LoRA rank {}, alpha {} on {} layers ({}), {} trainable", o.lora_rank, o.lora_alpha,
                              adapted.size(), fmt::join(lora_layers, ", "), model.num_trainable_parameters());
    to.trainable_only = true;
  }
  model.to(training_device(o.device));  // before the optimizer, whose state follows the parameters
  const std::unique_ptr<optim::AdamW> adamw = lm_adamw(model, o);
  LMData data(model, train.ids, o.block, o.batch, to.seed);
  const int64_t steps_per_epoch = data.plan(1), total_steps = steps_per_epoch * to.epochs;
  optim::CosineSchedule schedule(o.lr, std::min(o.warmup, total_steps), total_steps, o.min_lr);
  const std::string what = fine_tune ? fmt::format("{} from {}", made.name, o.base) : made.name + " " + o.config;
  std::printf("train: language model on %s (%zu lines, %zu tokens, %lld bytes), val %s (%zu tokens), tokenizer %s "
              "(vocabulary %lld), %s (%s, %lld parameters), block %lld, "
              "batch %lld, %lld epochs of %lld steps, AdamW lr %.2e -> %.2e (cosine, warmup %lld), weight decay %.2f\n",
              text.train_path.c_str(), text.train.size(), train.ids.size(), (long long)train.bytes,
              text.val_path.c_str(), val.ids.size(), tok->name().c_str(), (long long)tok->vocab_size(),
              what.c_str(), made.shape.c_str(), (long long)model.num_parameters(), (long long)o.block, (long long)o.batch, (long long)to.epochs,
              (long long)steps_per_epoch, o.lr, o.min_lr, (long long)std::min(o.warmup, total_steps), o.weight_decay);
  std::fflush(stdout);

  // What the run folder records: the recipe (and what follows from the options: the resolved
  // data, the tokenizer's vocabulary, the base's fingerprint), config.toml, the model's shape.
  to.recipe = table.recipe();
  to.recipe.insert({{"task", "lm"}, {"tokenizer", tok->name()}, {"vocab", std::to_string(tok->vocab_size())},
                    {"data", text.train_path}});
  if (lora) to.recipe["base_fingerprint"] = base_fingerprint;
  to.recipe_defaults = {{"model", "gpt"}};  // checkpoints from before the Llama hold GPTs
  to.run_files = {{"config.toml", config_toml}};
  if (fine_tune) to.run_files.merge(tokenizer_files(o.base, *tok, false));  // the folder stands alone
  to.model_metadata = made.metadata;
  to.curves_title = fmt::format("{} on {} ({} tokens)", what, text.train_path, tok->name());

  // Metric; fit.
  const auto start = std::chrono::steady_clock::now();
  Trainer trainer(model, *adamw, &schedule, to);
  trainer.evaluate = [&](int64_t, int64_t) {
    const double loss = stream_loss(model, val.ids, o.block, o.batch);
    const double bpb = loss * static_cast<double>(val.ids.size() - 1) / std::log(2.0) / static_cast<double>(val.bytes);
    return Metrics{{"val_loss", "val loss", loss, 4, "", false},
                   {"val_bpb", "val bits/byte", bpb, 4, "", false},
                   {"val_ppl", "val perplexity", std::exp(loss), 2, "", true}};
  };
  const FitResult fit = trainer.fit(data);
  LMResult result = lm_result(fit, model, train, val, seconds_since(start));
  if (o.merge && !fit.stopped && !fit.interrupted && dist::is_main()) {
    // From the model in memory, which holds what adapter.safetensors does (no base loaded again).
    const std::string merged_dir = to.out_dir + "/merged";
    const int64_t n = write_merged(model, *tok, o.base, merged_dir);
    std::printf("merged: the base with the adapters added in (%lld parameters) in %s; `tapestry generate %s %s`\n",
                (long long)n, merged_dir.c_str(), is_hf_dir(o.base) ? "--hf" : "--checkpoint", merged_dir.c_str());
    std::fflush(stdout);
  }
  return result;
}

LanguageModel load_language_model(const std::string& dir) {
  if (!file_exists(dir + "/model.safetensors") && file_exists(dir + "/adapter.safetensors"))
    return load_adapter_run(dir).lm;  // a LoRA run: its base with the adapters
  const SavedModel saved = read_saved_model(dir, {"lm"}, "a language model", "tapestry train --task lm");
  const std::string& path = saved.path;
  auto meta = [&](const char* key) { return saved.meta(key); };
  auto number = [&](const char* key) { return saved.num(key); };
  LanguageModel lm;
  const std::string t = meta("tokenizer");
  if (t == "byte") lm.tokenizer = byte_tokenizer();
  else if (t == "sentencepiece") lm.tokenizer = sentencepiece_tokenizer(dir + "/spm.model");
  else if (t == "gpt2") lm.tokenizer = gpt2_tokenizer(dir + "/gpt2");
  else if (t == "hf-bpe" || t == "hf-sentencepiece") lm.tokenizer = hf_tokenizer(dir + "/hf");  // a fine-tuned Hugging Face model
  else throw Error(fmt::format("{}: unknown tokenizer '{}'", path, t));
  // Run folders from before the Llama have no "model" entry: they hold a GPT.
  const std::string kind = saved.file.metadata.count("model") ? meta("model") : "gpt";
  if (kind == "llama") {
    LlamaConfig c;
    c.vocab = number("vocab"), c.max_positions = number("max_positions"), c.layers = number("layers");
    c.heads = number("heads"), c.kv_heads = number("kv_heads"), c.d_model = number("d_model");
    c.d_ff = number("d_ff"), c.tie_embeddings = meta("tie_embeddings") == "1";
    c.rope_theta = saved.real("rope_theta"), c.rms_eps = saved.real("rms_eps");
    try {
      c.validate();
    } catch (const Error& e) {
      throw Error(fmt::format("{}: {}", path, e.what()));
    }
    lm.model = std::make_shared<Llama>(c);
  } else if (kind == "gpt") {
    GPTConfig c;
    c.vocab = number("vocab"), c.block_size = number("block_size"), c.layers = number("layers");
    c.heads = number("heads"), c.d_model = number("d_model"), c.d_ff = number("d_ff");
    c.gelu_tanh = meta("gelu_tanh") == "1";
    c.dropout = 0;
    lm.model = std::make_shared<GPT>(c);
  } else {
    throw Error(fmt::format("{}: unknown model '{}' (expected gpt or llama)", path, kind));
  }
  TP_CHECK(lm.tokenizer->vocab_size() == lm.model->vocab_size(), "{}: the model has {} tokens but the tokenizer {}",
           path, lm.model->vocab_size(), lm.tokenizer->vocab_size());
  lm.model->load_state_dict(saved.file.as_map());
  lm.model->eval();
  return lm;
}

LanguageModel load_hf_language_model(const std::string& dir) {
  const LlamaConfig c = read_llama_hf_config(dir + "/config.json");
  LanguageModel lm;
  lm.tokenizer = hf_tokenizer(dir);
  TP_CHECK(lm.tokenizer->vocab_size() == c.vocab,
           "{}: the tokenizer ({}) has {} tokens but config.json's vocab_size is {}: they must belong to one model",
           dir, lm.tokenizer->name(), lm.tokenizer->vocab_size(), c.vocab);
  lm.model = load_llama_hf(dir, c);
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
