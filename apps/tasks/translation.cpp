// The translation training loop (see translation.h).
#include "apps/tasks/translation.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <tuple>

#include "apps/eval/bleu.h"
#include "apps/data/parallel_corpus.h"
#include "apps/eval/plot.h"
#include "apps/train/run_dir.h"
#include "apps/data/subword.h"
#include "tapestry/models/transformer.h"
#include "tapestry/autograd/anomaly.h"
#include "tapestry/nn/safetensors.h"
#include "tapestry/ops/factory.h"
#include "tapestry/optim/optimizer.h"

namespace tapestry::apps {

using namespace models;  // the architectures and their decoding

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string clock(double s) {
  int64_t t = static_cast<int64_t>(s + 0.5);
  return t >= 3600 ? fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60) : fmt::format("{}:{:02}", t / 60, t % 60);
}

// One line redrawn in place on a terminal; on a pipe, a line each time `done` (batches, moving
// from `before`) crosses a tenth of the epoch.
void progress_line(int64_t epoch, int64_t before, int64_t done, int64_t total, int64_t step, double loss, double tok_s,
                   double lr, double eta, bool tty) {
  const int width = 24;
  int filled = static_cast<int>(width * done / std::max<int64_t>(total, 1));
  std::string bar = std::string(filled, '#') + std::string(width - filled, '.');
  std::string line = fmt::format("epoch {:>2} [{}] {:>4}/{} step {} | loss {:.3f} | {:.0f} tok/s | lr {:.2e} | ETA {}",
                                 epoch, bar, done, total, step, loss, tok_s, lr, clock(eta));
  if (tty) {
    std::fprintf(stderr, "\r%s", line.c_str());
    if (done == total) std::fprintf(stderr, "\n");
  } else if (done == total || done * 10 / std::max<int64_t>(total, 1) != before * 10 / std::max<int64_t>(total, 1)) {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

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

// A number from a checkpoint's metadata; a value that does not parse names the file and key.
template <class T> T meta_number(const std::map<std::string, std::string>& meta, const std::string& path, const char* key) {
  auto it = meta.find(key);
  TP_CHECK(it != meta.end(), "resume: {} has no '{}' entry (not a training checkpoint)", path, key);
  try {
    size_t used = 0;
    T v;
    if constexpr (std::is_floating_point_v<T>) v = static_cast<T>(std::stod(it->second, &used));
    else v = static_cast<T>(std::stoll(it->second, &used));
    if (used == it->second.size()) return v;
  } catch (const std::exception&) {
  }
  throw Error(fmt::format("resume: {}: '{}' is '{}', not a number: the checkpoint is damaged", path, key, it->second));
}

bool exists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

// The files a run writes into its folder (Note [Run folders]); epoch copies are matched by prefix.
const char* const kRunFiles[] = {"checkpoint.safetensors", "model.safetensors", "optimizer.safetensors",
                                 "model.best.safetensors", "model.avg.safetensors", "spm.model", "spm.recipe",
                                 "config.toml", "curves.svg"};

bool holds_run(const std::string& dir) {
  for (const char* f : kRunFiles)
    if (exists(dir + "/" + f)) return true;
  return false;
}

void remove_run(const std::string& dir) {
  std::error_code ec;
  for (const char* f : kRunFiles) std::filesystem::remove(dir + "/" + f, ec);
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("model.epoch", 0) == 0) std::filesystem::remove(entry.path(), ec);
  }
}

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
  return t;
}

TranslationResult train_translation(const TranslationOptions& o) {
  TP_CHECK(o.accumulate >= 1, "train: --accumulate must be at least 1, got {}", o.accumulate);
  TP_CHECK(std::isfinite(o.clip_norm) && o.clip_norm >= 0, "train: --clip-norm must be >= 0 (0: no clipping), got {}",
           o.clip_norm);
  TP_CHECK(std::isfinite(o.lr_factor) && o.lr_factor > 0, "train: --lr-factor must be a positive number, got {}",
           o.lr_factor);
  TP_CHECK(std::isfinite(o.alpha) && o.alpha >= 0, "train: --alpha must be a number >= 0, got {}", o.alpha);
  TP_CHECK(o.dropout >= 0 && o.dropout < 1, "train: --dropout must be in [0, 1), got {}", o.dropout);
  TP_CHECK(o.label_smoothing >= 0 && o.label_smoothing < 1, "train: --label-smoothing must be in [0, 1), got {}",
           o.label_smoothing);
  TP_CHECK(o.on_nan == "stop" || o.on_nan == "skip", "train: --on-nan must be stop or skip, got '{}'", o.on_nan);
  TP_CHECK(!(o.resume && o.overwrite), "train: --resume and --overwrite contradict each other; choose one");
  const std::string dir = o.data_dir.empty() ? default_data_dir() : o.data_dir;
  ParallelCorpus train = load_parallel(dir, o.train_split, o.src_lang, o.tgt_lang);
  ParallelCorpus val = load_parallel(dir, o.val_split, o.src_lang, o.tgt_lang);
  ParallelCorpus test = load_parallel(dir, o.test_split, o.src_lang, o.tgt_lang);
  std::error_code mkdir_error;
  std::filesystem::create_directories(o.out_dir, mkdir_error);  // with its parents, as `mkdir -p`
  TP_CHECK(std::filesystem::is_directory(o.out_dir), "train: cannot create the output directory {}{}", o.out_dir,
           mkdir_error ? ": " + mkdir_error.message() : "");
  // Note [Run folders]: one run per folder, held by a lock for the life of this call. A folder
  // that holds a run is refused unless the run is resumed or --overwrite removes it first, and
  // temp files of writers that died mid-write are removed (no writer can be alive: the lock).
  RunLock lock(o.out_dir);
  for (const std::string& f : remove_stale_temp_files(o.out_dir))
    std::printf("train: removed %s/%s, left by an interrupted write\n", o.out_dir.c_str(), f.c_str());
  if (holds_run(o.out_dir) && !o.resume) {
    TP_CHECK(o.overwrite, "train: {} already holds a run; pass --resume to continue it, or --overwrite to start over "
             "(which deletes its checkpoints)", o.out_dir);
    remove_run(o.out_dir);
    std::printf("train: --overwrite: removed the run in %s\n", o.out_dir.c_str());
  }
  const std::string config_toml = options_to_toml(o);
  std::printf("config (saved as %s/config.toml):\n%s", o.out_dir.c_str(), config_toml.c_str());
  manual_seed(o.seed);
  AnomalyGuard anomaly(o.detect_anomaly);

  // Joint subword model on both sides of the (possibly limited) training text. spm.recipe says
  // what it was trained from; a model trained from anything else is trained again.
  const std::string spm_path = o.out_dir + "/spm.model", spm_recipe_path = o.out_dir + "/spm.recipe";
  const std::string spm_recipe = fmt::format("vocab_size = {}\nlimit = {}\nseed = {}\ndata = {}\n", o.vocab_size,
                                             o.limit, o.seed, dir);
  bool spm_current = false;
  if (exists(spm_path) && exists(spm_recipe_path)) {
    std::ifstream in(spm_recipe_path);
    std::string recorded((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    spm_current = recorded == spm_recipe;
  }
  if (!spm_current) {
    std::error_code ec;
    std::filesystem::remove(spm_recipe_path, ec);
    std::vector<std::string> text;
    size_t n = o.limit > 0 ? std::min<size_t>(train.src.size(), static_cast<size_t>(o.limit)) : train.src.size();
    text.insert(text.end(), train.src.begin(), train.src.begin() + n);
    text.insert(text.end(), train.tgt.begin(), train.tgt.begin() + n);
    Subword::train(text, spm_path, o.vocab_size, o.seed);
    nn::write_file_atomic(spm_recipe_path, spm_recipe);
  }
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

  const bool tty = o.progress && ::isatty(2);
  TranslationResult result;
  int64_t step = 0;
  const auto run_start = std::chrono::steady_clock::now();
  // Note [Exact resume]: a checkpoint holds the model, the optimizer (moments, step count) and,
  // in its metadata, the position (epoch, next batch), the running epoch loss and the random
  // generator's state (dropout seeds come from it). Batches follow from (seed, epoch) and every
  // kernel is independent of the thread count, so a resumed run replays exactly what the
  // uninterrupted run would have done. The metadata also records the recipe that decides the
  // batch plan (`recipe` below), and resume refuses a run whose options differ. The checkpoint
  // written at the end of an epoch, after its validation and its epoch copy, points at batch 0
  // of the next epoch; one written after the last batch but before that (--save-every, an
  // interruption) resumes into the epoch's end.
  //
  // Note [Checkpoint unit]: all of it is one file, checkpoint.safetensors (tensors "model.*"
  // and "optimizer.*"), written to a temp file, fsync'd and renamed over the previous one: a
  // kill at any instant leaves either the old or the new generation, never a mix, and its CRC
  // catches damage. model.safetensors (the weights alone, for translate and attention) is
  // written after it and is not read by resume. Runs from before this format (a model and an
  // optimizer file) still resume, with the old torn-pair check.
  const std::string ckpt_path = o.out_dir + "/checkpoint.safetensors";
  const std::string model_path = o.out_dir + "/model.safetensors", opt_path = o.out_dir + "/optimizer.safetensors";
  int64_t start_epoch = 1, start_batch = 0;
  double resumed_loss_sum = 0;
  int64_t resumed_tokens = 0;
  // What resume must find unchanged: the model and everything that decides the batch plan.
  const std::map<std::string, std::string> recipe = {
      {"config", o.config},          {"pre_norm", o.pre_norm ? "1" : "0"},         {"vocab_size", std::to_string(V)},
      {"max_tokens", std::to_string(o.max_tokens)}, {"accumulate", std::to_string(o.accumulate)},
      {"seed", std::to_string(o.seed)},             {"limit", std::to_string(o.limit)}};
  auto save_checkpoint = [&](int64_t epoch, int64_t next_batch, double loss_sum, int64_t tokens) {
    TP_CHECK(std::isfinite(optim::global_norm(model.parameters())), "train: the weights are not finite after step {}; nothing was saved (the last "
             "checkpoint is intact). Lower --lr-factor or set --clip-norm", step);
    nn::NamedTensors state;
    for (auto& [name, t] : model.state_dict()) state.emplace_back("model." + name, t);
    for (auto& [name, t] : adam.state_dict()) state.emplace_back("optimizer." + name, t);
    auto meta = recipe;
    meta.insert({{"epoch", std::to_string(epoch)},
                 {"next_batch", std::to_string(next_batch)},
                 {"step", std::to_string(step)},
                 {"epoch_loss_sum", fmt::format("{:.17g}", loss_sum)},
                 {"epoch_tokens", std::to_string(tokens)},
                 {"rng", default_generator().state()}});
    nn::save_safetensors(ckpt_path, state, meta);
    model.save(model_path, {{"config", o.config}, {"pre_norm", o.pre_norm ? "1" : "0"}, {"step", std::to_string(step)}});
  };
  const bool legacy = !exists(ckpt_path) && exists(model_path) && exists(opt_path);
  if (o.resume && (exists(ckpt_path) || legacy)) {
    const std::string from = legacy ? model_path : ckpt_path;
    auto file = nn::load_safetensors(from);
    std::map<std::string, Tensor> model_state, opt_state;
    if (legacy) {
      model_state = file.as_map();
      opt_state = nn::load_safetensors(opt_path).as_map();
    } else {
      for (auto& [name, t] : file.tensors) {
        if (name.rfind("model.", 0) == 0) model_state[name.substr(6)] = t;
        else if (name.rfind("optimizer.", 0) == 0) opt_state[name.substr(10)] = t;
        else throw Error(fmt::format("resume: {}: unexpected tensor '{}' (not a training checkpoint)", from, name));
      }
    }
    for (const auto& [key, value] : recipe) {
      auto it = file.metadata.find(key);
      if (it == file.metadata.end()) continue;  // older checkpoints lack some (pre_norm absent: post-norm)
      TP_CHECK(it->second == value, "resume: {} was trained with {} = {}, but this run has {} = {}; resume with the "
               "options of its config.toml", from, key, it->second, key, value);
    }
    TP_CHECK(file.metadata.count("pre_norm") || !o.pre_norm, "resume: {} holds a post-norm model but this run asks "
             "for pre-norm", from);
    model.load_state_dict(model_state);
    adam.load_state_dict(opt_state);
    step = meta_number<int64_t>(file.metadata, from, "step");
    TP_CHECK(adam.step_count() == step, "resume: {} is at step {} but {} at step {}; the checkpoint is torn", opt_path,
             adam.step_count(), from, step);
    start_epoch = meta_number<int64_t>(file.metadata, from, "epoch");
    start_batch = meta_number<int64_t>(file.metadata, from, "next_batch");
    resumed_loss_sum = meta_number<double>(file.metadata, from, "epoch_loss_sum");
    resumed_tokens = meta_number<int64_t>(file.metadata, from, "epoch_tokens");
    TP_CHECK(start_epoch >= 1 && start_batch >= 0 && resumed_tokens >= 0, "resume: {}: epoch {}, batch {} is not a "
             "position: the checkpoint is damaged", from, start_epoch, start_batch);
    TP_CHECK(file.metadata.count("rng"), "resume: {} has no 'rng' entry (not a training checkpoint)", from);
    default_generator().set_state(file.metadata.at("rng"));
    std::printf("resume: from %s at epoch %lld, batch %lld, step %lld\n", from.c_str(), (long long)start_epoch,
                (long long)start_batch, (long long)step);
    // The best so far stays the best unless a later epoch beats it.
    const std::string best_path = o.out_dir + "/model.best.safetensors";
    if (exists(best_path)) {
      auto best = nn::load_safetensors(best_path).metadata;
      if (best.count("val_bleu") && best.count("epoch")) {
        result.best_val_bleu = meta_number<double>(best, best_path, "val_bleu");
        result.best_epoch = meta_number<int64_t>(best, best_path, "epoch");
      }
    }
  } else if (o.resume) {
    std::printf("resume: no checkpoint in %s yet; starting from the beginning\n", o.out_dir.c_str());
  }
  StopSignals stop_signals;
  nn::write_file_atomic(o.out_dir + "/config.toml", config_toml);
  for (int64_t epoch = start_epoch; epoch <= o.epochs; ++epoch) {
    auto plan = train_batches.plan(o.seed, epoch);
    // A checkpoint at the end of an epoch's batches (next_batch == plan.size()) resumes into that
    // epoch's end: validation, the epoch copy and the best are still to do.
    const bool resumed_here = epoch == start_epoch && start_batch > 0;
    const auto t0 = std::chrono::steady_clock::now();
    double loss_sum = resumed_here ? resumed_loss_sum : 0;
    int64_t tokens = resumed_here ? resumed_tokens : 0;
    const size_t first_batch = resumed_here ? static_cast<size_t>(start_batch) : 0;
    const int64_t first_tokens = tokens;  // rates count this process's work only
    model.train();
    // One optimizer step per group of `accumulate` batches: each batch's mean loss is weighted by
    // its share of the group's target tokens, so the summed gradient is that of the group's mean
    // token loss, as one batch of the group's size would give.
    const size_t group = static_cast<size_t>(o.accumulate);
    for (size_t i = first_batch; i < plan.size();) {
      const size_t end = std::min(plan.size(), i + group);
      std::vector<Batch> batches;
      int64_t group_tokens = 0;
      for (size_t j = i; j < end; ++j) {
        batches.push_back(train_batches.make(plan[j]));
        group_tokens += batches.back().tgt_tokens;
      }
      schedule.apply(adam, ++step);
      double group_loss_sum = 0;
      for (const Batch& b : batches) {
        Tensor loss = model.loss(b.src, b.tgt_in, b.tgt_out, o.label_smoothing);
        group_loss_sum += loss.item<double>() * static_cast<double>(b.tgt_tokens);
        if (batches.size() == 1) {
          loss.backward();
        } else {
          (loss * (static_cast<double>(b.tgt_tokens) / static_cast<double>(group_tokens))).backward();
        }
      }
      // A non-finite loss or gradient would poison the weights and every checkpoint after it.
      const double norm = o.clip_norm > 0 ? optim::clip_grad_norm(model.parameters(), o.clip_norm)
                                          : optim::grad_norm(model.parameters());
      const size_t before = i;
      i = end;
      if (!std::isfinite(group_loss_sum) || !std::isfinite(norm)) {
        const std::string what = fmt::format("a non-finite {} ({}) at step {} (epoch {}, batches {}-{})",
                                             std::isfinite(group_loss_sum) ? "gradient norm" : "loss",
                                             std::isfinite(group_loss_sum) ? norm : group_loss_sum, step, epoch,
                                             before + 1, end);
        adam.zero_grad();
        TP_CHECK(o.on_nan == "skip", "train: {}; stopped before saving anything, the last checkpoint is intact. Lower "
                 "--lr-factor, set --clip-norm, find the op with --detect-anomaly, or skip such steps with --on-nan skip",
                 what);
        --step;  // the step is not taken: the schedule and the optimizer stay where they were
        ++result.skipped_steps;
        std::fprintf(stderr, "train: skipped %s (%lld skipped so far)\n", what.c_str(), (long long)result.skipped_steps);
        continue;
      }
      loss_sum += group_loss_sum;
      tokens += group_tokens;
      adam.step();
      adam.zero_grad();
      if (StopSignals::pending()) {
        save_checkpoint(epoch, static_cast<int64_t>(i), loss_sum, tokens);
        std::printf("\ntrain: %s: stopped after step %lld with a checkpoint in %s; continue with --resume\n",
                    StopSignals::name(StopSignals::pending()), (long long)step, o.out_dir.c_str());
        std::fflush(stdout);
        result.interrupted = StopSignals::pending();
        return result;
      }
      if (o.save_every > 0 && step % o.save_every == 0 && i < plan.size())
        save_checkpoint(epoch, static_cast<int64_t>(i), loss_sum, tokens);
      if (o.stop_after > 0 && step == o.stop_after) {  // tests: an interruption right after a checkpoint
        save_checkpoint(epoch, static_cast<int64_t>(i), loss_sum, tokens);
        result.stopped = true;
        return result;
      }
      if (o.progress) {
        double el = seconds_since(t0);
        progress_line(epoch, static_cast<int64_t>(before), static_cast<int64_t>(i), static_cast<int64_t>(plan.size()), step,
                      loss_sum / static_cast<double>(tokens), static_cast<double>(tokens - first_tokens) / el,
                      adam.lr(), el / static_cast<double>(i - first_batch) * static_cast<double>(plan.size() - i),
                      tty);
      }
    }
    EpochResult r;
    r.epoch = epoch;
    r.steps = step;
    r.seconds = seconds_since(t0);
    r.train_loss = loss_sum / static_cast<double>(std::max<int64_t>(tokens, 1));
    r.tokens_per_s = static_cast<double>(tokens - first_tokens) / r.seconds;
    r.val_loss = evaluate_loss(model, val_batches, o.label_smoothing);
    auto val_src = head(val.src, o.eval_limit), val_ref = head(val.tgt, o.eval_limit);
    r.val_bleu = corpus_bleu(translate_all(model, sp, val_src, 1, o.alpha), val_ref).score;
    // Per-epoch copies: the last `keep` stay (for averaging), and the best on val BLEU. They are
    // written before the checkpoint that moves resume past this epoch.
    const std::string epoch_path = fmt::format("{}/model.epoch{}.safetensors", o.out_dir, epoch);
    model.save(epoch_path, {{"config", o.config}, {"pre_norm", o.pre_norm ? "1" : "0"}, {"epoch", std::to_string(epoch)}});
    if (epoch - o.keep >= 1) std::remove(fmt::format("{}/model.epoch{}.safetensors", o.out_dir, epoch - o.keep).c_str());
    if (r.val_bleu > result.best_val_bleu) {
      result.best_val_bleu = r.val_bleu;
      result.best_epoch = epoch;
      model.save(o.out_dir + "/model.best.safetensors",
                 {{"config", o.config},
                  {"pre_norm", o.pre_norm ? "1" : "0"},
                  {"epoch", std::to_string(epoch)},
                  {"val_bleu", fmt::format("{:.2f}", r.val_bleu)}});
    }
    save_checkpoint(epoch + 1, 0, 0, 0);
    if (StopSignals::pending()) {
      std::printf("train: %s: stopped after epoch %lld with a checkpoint in %s; continue with --resume\n",
                  StopSignals::name(StopSignals::pending()), (long long)epoch, o.out_dir.c_str());
      result.interrupted = StopSignals::pending();
      return result;
    }
    std::printf("epoch %lld: train loss %.3f, val loss %.3f, val BLEU %.2f (greedy), %.0f s, %.0f tok/s, elapsed %s%s\n",
                (long long)epoch, r.train_loss, r.val_loss, r.val_bleu, r.seconds, r.tokens_per_s,
                clock(seconds_since(run_start)).c_str(),
                result.skipped_steps ? fmt::format(", {} steps skipped so far", result.skipped_steps).c_str() : "");
    std::fflush(stdout);
    result.epochs.push_back(r);
    // The curves so far (an interrupted run keeps its picture); epochs before a resume are not
    // in this process, so a resumed run plots from where it resumed.
    Series train_loss{"train loss", "#1f77b4", {}}, val_loss{"val loss", "#ff7f0e", {}},
        val_bleu{"val BLEU (greedy)", "#2ca02c", {}, true};
    for (auto& e : result.epochs) {
      train_loss.y.push_back(e.train_loss);
      val_loss.y.push_back(e.val_loss);
      val_bleu.y.push_back(e.val_bleu);
    }
    write_svg_chart(o.out_dir + "/curves.svg", fmt::format("{}-{} {} on {}", o.src_lang, o.tgt_lang, o.config, dir),
                    {train_loss, val_loss, val_bleu});
  }

  // An average left by an earlier run in this directory must not pass for this run's.
  std::remove((o.out_dir + "/model.avg.safetensors").c_str());
  if (o.average > 1) {
    std::vector<std::string> paths;
    for (int64_t e = std::max<int64_t>(1, o.epochs - o.average + 1); e <= o.epochs; ++e) {
      std::string p = fmt::format("{}/model.epoch{}.safetensors", o.out_dir, e);
      if (std::ifstream(p).good()) paths.push_back(p);
    }
    if (paths.size() > 1) {
      model.load_state_dict(average_checkpoints(paths));
      model.save(o.out_dir + "/model.avg.safetensors",
                 {{"config", o.config}, {"pre_norm", o.pre_norm ? "1" : "0"}, {"averaged", std::to_string(paths.size())}});
      result.averaged = static_cast<int64_t>(paths.size());
      std::printf("averaged the weights of the last %zu epoch checkpoints\n", paths.size());
    }
  }
  // The final model (averaged or last), scored as the test set is: on val, then on test.
  auto t_val = std::chrono::steady_clock::now();
  auto val_src = head(val.src, o.eval_limit), val_ref = head(val.tgt, o.eval_limit);
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
  std::printf("total time %s\n", clock(seconds_since(run_start)).c_str());
  for (size_t i = 0; i < std::min<size_t>(5, hyps.size()); ++i)
    std::printf("  src: %s\n  ref: %s\n  hyp: %s\n", test_src[i].c_str(), test_ref[i].c_str(), hyps[i].c_str());
  return result;
}

std::map<std::string, Tensor> average_checkpoints(const std::vector<std::string>& paths) {
  TP_CHECK(!paths.empty(), "average_checkpoints: no checkpoints given");
  std::map<std::string, Tensor> sum;
  for (const auto& [name, t] : nn::load_safetensors(paths[0]).tensors) sum[name] = t.to(DType::Float64);
  for (size_t i = 1; i < paths.size(); ++i) {
    auto next = nn::load_safetensors(paths[i]).as_map();
    TP_CHECK(next.size() == sum.size(), "average_checkpoints: {} holds {} tensors but {} holds {}", paths[i],
             next.size(), paths[0], sum.size());
    for (auto& [name, acc] : sum) {
      auto it = next.find(name);
      TP_CHECK(it != next.end() && it->second.sizes() == acc.sizes(),
               "average_checkpoints: {} has no tensor '{}' of shape {}", paths[i], name, acc.sizes());
      acc.add_(it->second.to(DType::Float64));
    }
  }
  std::map<std::string, Tensor> out;
  for (auto& [name, acc] : sum) out[name] = (acc / static_cast<double>(paths.size())).to(DType::Float32);
  return out;
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
