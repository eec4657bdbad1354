// The text tasks (see text_classification.h).
#include "apps/tasks/text_classification.h"

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "apps/data/mail_corpus.h"
#include "apps/tasks/task.h"
#include "apps/train/run_dir.h"
#include "apps/train/saved_model.h"
#include "tapestry/data/dataloader.h"
#include "tapestry/nn/safetensors.h"
#include "tapestry/ops/file.h"

namespace tapestry::apps {

using models::Bert;
using models::BertConfig;

TextOptions default_mlm_options() {
  TextOptions o;
  o.trainer.out_dir = "runs/mlm";
  o.trainer.epochs = 8;
  o.adamw.lr = 1e-3;
  return o;
}

TextOptions default_classify_options() {
  TextOptions o;
  o.trainer.out_dir = "runs/classify";
  return o;
}

namespace {

void add_common_rows(OptionTable& t, OptionTable& trainer, TextOptions& o) {
  t.add("data", o.data_dir, "the mail corpus: a folder of JSON records by group (default: $TAPESTRY_SPAM_DIR or "
        "~/.cache/tapestry/spam-assassin; tools/get-spam.sh fetches it)");
  t.take(trainer, "out");
  t.add("max-len", o.max_len, "tokens per mail, [CLS] and [SEP] included").at_least(3).recipe();
  t.add("batch", o.batch, "mails per batch").positive().recipe();
  t.take(trainer, "epochs").recipe();  // the cosine schedule spans them
  o.adamw.add_rows(t, "AdamW weight decay on matrices");
  t.add("dropout", o.dropout, "dropout").at_least(0).below(1);
  t.take(trainer, "clip-norm");
  t.take(trainer, "seed").recipe();
  t.add("limit", o.limit, "train on the first N training mails only (0: all)").at_least(0).recipe();
  add_run_rows(t, trainer);
}

}  // namespace

OptionTable mlm_options_table(TextOptions& o) {
  OptionTable trainer = trainer_options(o.trainer), t("mlm");
  t.add("config", o.config, "model size").one_of(BertConfig::names()).recipe();
  t.add("vocab-size", o.vocab_size, "SentencePiece vocabulary").positive().recipe();
  t.add("mask-prob", o.mask_prob, "the share of tokens masked (BERT: 0.15)").above(0).at_least(0).below(1);
  add_common_rows(t, trainer, o);
  return t;
}

OptionTable classify_options_table(TextOptions& o) {
  OptionTable trainer = trainer_options(o.trainer), t("classify");
  t.add("init", o.init, "an MLM run folder to fine-tune (its tokenizer, config and weights); empty: from scratch");
  t.add("model", o.model, "bert (the encoder) or bow (a bag-of-words logistic regression)").one_of({"bert", "bow"})
      .recipe();
  t.add("config", o.config, "model size (from scratch)").one_of(BertConfig::names()).recipe();
  t.add("vocab-size", o.vocab_size, "SentencePiece vocabulary (from scratch)").positive().recipe();
  add_common_rows(t, trainer, o);
  t.add_check([&o] { return o.init.empty() || o.model == "bert" ? "" : "--init fine-tunes the encoder; --model bow starts from scratch"; });
  return t;
}

BagOfWords::BagOfWords(int64_t v, int64_t classes, int64_t pad) : vocab(v), pad_id(pad) {
  linear = register_module("linear", std::make_shared<nn::Linear>(v, classes));
}

Tensor BagOfWords::forward(const Tensor& ids_in) {
  const Tensor ids = ids_in.to(linear->weight.device());
  const int64_t B = ids.size(0);
  // counts[b, v] = how often id v occurs in mail b (padding included, then cleared).
  Tensor ones_like_ids = ones(ids.sizes(), TensorOptions(DType::Float32, ids.device()));
  Tensor counts = zeros({B, vocab}, TensorOptions(DType::Float32, ids.device())).scatter_add(1, ids, ones_like_ids);
  counts = counts.scatter(1, full({B, 1}, static_cast<double>(pad_id), TensorOptions(DType::Int64, ids.device())), 0.0);
  return linear->forward(log(counts + 1.0));
}

namespace {

// Token ids of every mail: [CLS] pieces [SEP], cut to max_len.
std::vector<std::vector<int64_t>> encode_mails(const Subword& sp, const std::vector<Mail>& mails, int64_t max_len) {
  std::vector<std::vector<int64_t>> out;
  out.reserve(mails.size());
  for (const Mail& m : mails) {
    std::vector<int64_t> ids = sp.encode(m.text);
    if (static_cast<int64_t>(ids.size()) > max_len - 2) ids.resize(static_cast<size_t>(max_len - 2));
    ids.insert(ids.begin(), Subword::kBos);
    ids.push_back(Subword::kEos);
    out.push_back(std::move(ids));
  }
  return out;
}

// Rows `which` of seqs as one int64 [B, T] batch padded with pad 0 to its longest row.
Tensor pad_batch(const std::vector<std::vector<int64_t>>& seqs, const std::vector<int64_t>& which) {
  size_t T = 1;
  for (int64_t i : which) T = std::max(T, seqs[static_cast<size_t>(i)].size());
  std::vector<int64_t> flat(which.size() * T, Subword::kPad);
  for (size_t r = 0; r < which.size(); ++r) {
    const auto& s = seqs[static_cast<size_t>(which[r])];
    std::copy(s.begin(), s.end(), flat.begin() + static_cast<std::ptrdiff_t>(r * T));
  }
  return tensor(flat, {static_cast<int64_t>(which.size()), static_cast<int64_t>(T)});
}

// The row numbers start .. min(start + batch, n) - 1: one evaluation batch.
std::vector<int64_t> batch_rows(size_t start, size_t n, int64_t batch) {
  std::vector<int64_t> rows;
  for (size_t i = start; i < std::min(n, start + static_cast<size_t>(batch)); ++i) rows.push_back(static_cast<int64_t>(i));
  return rows;
}

const std::vector<int64_t> kSpecial = {Subword::kPad, Subword::kUnk, Subword::kBos, Subword::kEos};

struct Corpus {
  std::string dir;
  MailSplits split;
};

Corpus read_corpus(const TextOptions& o) {
  Corpus c;
  c.dir = o.data_dir.empty() ? default_spam_dir() : o.data_dir;
  c.split = split_mail_corpus(read_mail_corpus(c.dir));
  if (o.limit > 0 && static_cast<size_t>(o.limit) < c.split.train.size()) c.split.train.resize(static_cast<size_t>(o.limit));
  return c;
}

// Batches of training mails in a seeded order per epoch (data::DataLoader over their indices);
// `make` turns a batch's indices and the batch's own generator into its loss.
class MailBatches : public DataSource {
 public:
  using Make = std::function<TrainBatch(const std::vector<int64_t>& rows, Generator& gen)>;
  MailBatches(int64_t n, int64_t batch, uint64_t seed, Make make)
      : loader_(data::TensorDataset(arange(n).reshape({n, 1}), arange(n)), options(batch, seed),
                [this](data::Batch b, Generator& g) {
                  batch_gen_ = g;  // the batch's own generator, one per (seed, epoch, batch)
                  return b;
                }),
        make_(std::move(make)) {}
  int64_t plan(int64_t epoch) override {
    epoch_ = epoch;
    return loader_.batches();
  }
  TrainBatch batch(int64_t i) override {
    std::vector<int64_t> rows = loader_.batch(epoch_, i).target.to_vector<int64_t>();
    rows = shard_of(rows, shard_rank_, shard_world_);
    if (rows.empty()) return {0, {}};
    return make_(rows, batch_gen_);
  }

 private:
  static data::DataLoaderOptions options(int64_t batch, uint64_t seed) {
    data::DataLoaderOptions o;
    o.batch_size = batch, o.shuffle = true, o.seed = seed;
    return o;
  }
  Generator batch_gen_{0};
  data::DataLoader loader_;
  Make make_;
  int64_t epoch_ = 1;
};

std::unique_ptr<optim::AdamW> text_adamw(nn::Module& model, const AdamWCosine& recipe) {
  std::vector<Tensor> decay, no_decay;  // matrices decay; biases, LayerNorms and embeddings' biases do not
  for (auto& [name, p] : model.named_parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  return recipe.adamw(decay, no_decay);
}

// max_len: the tokens per mail the model was trained on; positions: its position table (BertConfig::max_len).
std::map<std::string, std::string> bert_metadata(const BertConfig& c, const std::string& task, const std::string& model,
                                                 int64_t max_len) {
  return {{"task", task},           {"model", model},
          {"vocab", std::to_string(c.vocab)},       {"max_len", std::to_string(max_len)},
          {"positions", std::to_string(c.max_len)},
          {"classes", std::to_string(c.classes)},   {"layers", std::to_string(c.layers)},
          {"heads", std::to_string(c.heads)},       {"d_model", std::to_string(c.d_model)},
          {"d_ff", std::to_string(c.d_ff)},         {"norm_first", c.norm_first ? "1" : "0"}};
}

BertConfig bert_config(const SavedModel& s) {
  BertConfig c;
  c.vocab = s.num("vocab"), c.max_len = s.num("positions"), c.classes = s.num("classes"), c.layers = s.num("layers");
  c.heads = s.num("heads"), c.d_model = s.num("d_model"), c.d_ff = s.num("d_ff");
  c.norm_first = s.meta("norm_first") == "1";
  return c;
}

// The run folder's tokenizer: copied from --init's folder, or trained on the training split.
std::unique_ptr<Subword> text_tokenizer(const TextOptions& o, const Corpus& c) {
  const std::string out = o.trainer.out_dir;
  if (!o.init.empty()) {
    const std::string from = o.init + "/spm.model";
    TP_CHECK(file_exists(from), "{} not found: --init takes a run folder of `tapestry train --task mlm`", from);
    std::filesystem::copy_file(from, out + "/spm.model", std::filesystem::copy_options::overwrite_existing);
    return std::make_unique<Subword>(out + "/spm.model");
  }
  const std::string path = Subword::train_in_folder(out, o.vocab_size, o.limit, o.trainer.seed, c.dir, [&] {
    std::vector<std::string> text;
    for (const Mail& m : c.split.train) text.push_back(m.text.substr(0, 4000));  // a long mail adds little
    return text;
  });
  return std::make_unique<Subword>(path);
}

double seconds_of(const FitResult& fit) {
  double s = 0;
  for (const EpochRecord& e : fit.epochs) s += e.seconds;
  return s;
}

}  // namespace

namespace {

// BERT's masking of a batch of ids: random replacements come from the pieces (4 ..), never a
// special id or [MASK] itself.
struct Masking {
  int64_t mask_id;
  double prob;
  models::MaskedTokens operator()(const Tensor& ids, Generator& gen) const {
    return models::mask_tokens(ids, mask_id, mask_id, 4, kSpecial, gen, prob);
  }
};

// The val mails' masked-LM loss and masked-token accuracy, with the same masks every time (one
// generator per evaluation).
Metrics mlm_metrics(Bert& model, const std::vector<std::vector<int64_t>>& val, const Masking& mask, int64_t batch) {
  NoGradGuard no_grad;
  Generator gen(7);
  double loss = 0;
  int64_t targets = 0, correct = 0;
  for (size_t s = 0; s < val.size(); s += static_cast<size_t>(batch)) {
    models::MaskedTokens m = mask(pad_batch(val, batch_rows(s, val.size(), batch)), gen);
    Tensor logits = model.mlm_logits(model.encode(m.ids)).reshape({-1, model.config.vocab});
    Tensor labels = m.labels.reshape({-1}).to(logits.device());
    loss += cross_entropy(logits, labels, 0.0, -100, Reduction::Sum).item<double>();
    Tensor chosen = ne(labels, -100.0);
    targets += chosen.to(DType::Int64).sum().item<int64_t>();
    correct += mul(chosen.to(DType::Int64), eq(argmax(logits, 1), labels).to(DType::Int64)).sum().item<int64_t>();
  }
  return Metrics{{"val_loss", "val MLM loss", loss / std::max<int64_t>(1, targets), 4, "", false},
                 {"val_mlm_accuracy", "val masked-token accuracy", 100.0 * correct / std::max<int64_t>(1, targets), 2,
                  "%", true}};
}

}  // namespace

TextResult train_mlm(const TextOptions& options) {
  TextOptions o = options;
  RunSetup run(mlm_options_table(o), o.trainer);
  BertConfig::named(o.config, 1);
  const Corpus corpus = read_corpus(o);
  run.open({"spm.model", "spm.recipe"});
  const std::unique_ptr<Subword> sp = text_tokenizer(o, corpus);
  const auto train = encode_mails(*sp, corpus.split.train, o.max_len), val = encode_mails(*sp, corpus.split.val, o.max_len);
  const Masking mask{sp->vocab_size(), o.mask_prob};  // [MASK]: one id past SentencePiece's pieces
  BertConfig cfg = BertConfig::named(o.config, sp->vocab_size() + 1);
  cfg.max_len = o.max_len, cfg.dropout = o.dropout;
  Bert model(cfg);
  model.to(training_device(o.trainer.device));
  const std::unique_ptr<optim::AdamW> adamw = text_adamw(model, o.adamw);
  MailBatches batches(static_cast<int64_t>(train.size()), o.batch, o.trainer.seed,
                      [&](const std::vector<int64_t>& rows, Generator& gen) {
                        models::MaskedTokens m = mask(pad_batch(train, rows), gen);
                        const int64_t targets = ne(m.labels, -100.0).to(DType::Int64).sum().item<int64_t>();
                        return TrainBatch{targets, [&model, m] { return model.mlm_loss(m.ids, m.labels); }};
                      });
  const int64_t steps_per_epoch = batches.plan(1);
  const optim::CosineSchedule schedule = o.adamw.schedule(steps_per_epoch * o.trainer.epochs);
  std::printf("train: masked LM (%s: %lld layers, %lld heads, d_model %lld, %lld parameters) on %s: %zu train, %zu val "
              "mails, SentencePiece %lld + [MASK], max_len %lld, batch %lld, %lld epochs of %lld steps, AdamW lr %.2e\n",
              o.config.c_str(), (long long)cfg.layers, (long long)cfg.heads, (long long)cfg.d_model,
              (long long)model.num_parameters(), corpus.dir.c_str(), train.size(), val.size(),
              (long long)sp->vocab_size(), (long long)o.max_len, (long long)o.batch, (long long)o.trainer.epochs,
              (long long)steps_per_epoch, o.adamw.lr);
  std::fflush(stdout);
  TrainerOptions& to = run.record({{"task", "mlm"}, {"data", corpus.dir}}, bert_metadata(cfg, "mlm", "bert", cfg.max_len),
                                  fmt::format("masked LM {} on {}", o.config, corpus.dir));
  to.rate_unit = "masked tok";

  Trainer trainer(model, *adamw, &schedule, to);
  trainer.evaluate = [&](int64_t, int64_t) { return mlm_metrics(model, val, mask, o.batch); };
  const FitResult fit = trainer.fit(batches);
  TextResult r;
  r.steps = fit.steps, r.stopped = fit.stopped, r.interrupted = fit.interrupted, r.parameters = model.num_parameters();
  if (fit.stopped || fit.interrupted || fit.last_metrics.empty() || !dist::is_main()) return r;
  r.val_metric = metric(fit.last_metrics, "val_mlm_accuracy") / 100;
  std::printf("final: val MLM loss %.4f, masked-token accuracy %.2f%%; %lld steps in %s; fine-tune with "
              "`tapestry train --task classify --init %s`\n",
              metric(fit.last_metrics, "val_loss"), 100 * r.val_metric, (long long)r.steps,
              clock_text(seconds_of(fit)).c_str(), to.out_dir.c_str());
  std::fflush(stdout);
  return r;
}

namespace {

// Accuracy, the spam class's F1 and the confusion matrix of `predict` over mails.
struct Scores {
  double accuracy = 0, spam_f1 = 0;
  std::vector<std::vector<int64_t>> confusion{{0, 0}, {0, 0}};
};
Scores score(const std::function<Tensor(const Tensor&)>& logits_of, const std::vector<std::vector<int64_t>>& seqs,
             const std::vector<Mail>& mails, int64_t batch) {
  NoGradGuard no_grad;
  Scores s;
  for (size_t start = 0; start < seqs.size(); start += static_cast<size_t>(batch)) {
    const std::vector<int64_t> rows = batch_rows(start, seqs.size(), batch);
    std::vector<int64_t> pred = argmax(logits_of(pad_batch(seqs, rows)), 1).to_vector<int64_t>();
    for (size_t k = 0; k < rows.size(); ++k) ++s.confusion[static_cast<size_t>(mails[static_cast<size_t>(rows[k])].label)][static_cast<size_t>(pred[k])];
  }
  const double tp = static_cast<double>(s.confusion[1][1]), fp = static_cast<double>(s.confusion[0][1]),
               fn = static_cast<double>(s.confusion[1][0]), tn = static_cast<double>(s.confusion[0][0]);
  s.accuracy = seqs.empty() ? 0 : (tp + tn) / static_cast<double>(seqs.size());
  s.spam_f1 = tp > 0 ? 2 * tp / (2 * tp + fp + fn) : 0;
  return s;
}

}  // namespace

namespace {

// The classifier a classify run trains: the MLM run's encoder (its config and weights; a fresh
// classifier head), a fresh encoder, or the bag of words; with its checkpoint metadata and a line
// saying which.
struct Classifier {
  std::shared_ptr<Bert> bert;
  std::shared_ptr<BagOfWords> bow;
  int64_t max_len = 0;  // the tokens per mail it reads: --max-len, at most the encoder's positions
  std::string what;
  std::map<std::string, std::string> metadata;
  nn::Module& module() { return bert ? static_cast<nn::Module&>(*bert) : static_cast<nn::Module&>(*bow); }
  Tensor logits(const Tensor& ids) const { return bert ? bert->classify(ids) : bow->forward(ids); }
};

Classifier make_classifier(const TextOptions& o, const std::optional<SavedModel>& init, const Subword& sp) {
  Classifier c;
  BertConfig cfg = init ? bert_config(*init) : BertConfig::named(o.config, sp.vocab_size() + 1);
  if (init) TP_CHECK(cfg.vocab == sp.vocab_size() + 1, "{}: its vocabulary of {} does not match {}/spm.model's {} + [MASK]",
                     init->path, cfg.vocab, o.init, sp.vocab_size());
  if (!init) cfg.max_len = o.max_len;
  c.max_len = std::min(o.max_len, cfg.max_len);
  cfg.classes = 2, cfg.dropout = o.dropout;
  if (o.model == "bow") {
    c.bow = std::make_shared<BagOfWords>(sp.vocab_size() + 1, 2, Subword::kPad);
    c.what = "bag-of-words logistic regression";
    c.metadata = {{"task", "classify"}, {"model", "bow"}, {"vocab", std::to_string(c.bow->vocab)},
                  {"max_len", std::to_string(c.max_len)}};
    return c;
  }
  c.bert = std::make_shared<Bert>(cfg);
  if (init) {
    std::map<std::string, Tensor> state = init->file.as_map();
    state.erase("classifier.weight"), state.erase("classifier.bias");  // the MLM run never trained it
    c.bert->load_state_dict(state, false);
  }
  c.what = init ? fmt::format("the encoder of {} (fine-tuned)", o.init) : fmt::format("encoder {} from scratch", o.config);
  c.metadata = bert_metadata(cfg, "classify", "bert", c.max_len);
  return c;
}

// The run's figures; the final model's test scores and confusion matrix (written beside the
// weights) when the run finished.
TextResult classify_result(const FitResult& fit, Classifier& c, const Subword& sp, const Corpus& corpus,
                           const std::string& out_dir) {
  TextResult r;
  r.steps = fit.steps, r.stopped = fit.stopped, r.interrupted = fit.interrupted, r.parameters = c.module().num_parameters();
  if (fit.stopped || fit.interrupted || fit.last_metrics.empty() || !dist::is_main()) return r;
  r.val_metric = metric(fit.last_metrics, "val_accuracy") / 100;
  c.module().eval();
  const auto test = encode_mails(sp, corpus.split.test, c.max_len);
  Scores t = score([&](const Tensor& ids) { return c.logits(ids); }, test, corpus.split.test, 64);
  r.test_accuracy = t.accuracy, r.test_spam_f1 = t.spam_f1, r.confusion = t.confusion;
  const std::string table_text = fmt::format(
      "true \\ predicted   ham  spam\nham              {:5d} {:5d}\nspam             {:5d} {:5d}\n", t.confusion[0][0],
      t.confusion[0][1], t.confusion[1][0], t.confusion[1][1]);
  if (!out_dir.empty()) write_file_atomic(out_dir + "/confusion.txt", table_text);
  std::printf("test confusion matrix (%zu mails):\n%s", test.size(), table_text.c_str());
  std::printf("final: test accuracy %.2f%%, spam F1 %.2f (%zu mails); val accuracy %.2f%%; %lld steps in %s\n",
              100 * t.accuracy, 100 * t.spam_f1, test.size(), 100 * r.val_metric, (long long)r.steps,
              clock_text(seconds_of(fit)).c_str());
  std::fflush(stdout);
  return r;
}

}  // namespace

TextResult train_text_classifier(const TextOptions& options) {
  TextOptions o = options;
  RunSetup run(classify_options_table(o), o.trainer);
  std::optional<SavedModel> init;
  if (!o.init.empty())  // before the data are read or a folder made
    init = read_saved_model(o.init, {"mlm", "classify"}, "a text encoder", "tapestry train --task mlm");
  const Corpus corpus = read_corpus(o);
  run.open({"spm.model", "spm.recipe", "confusion.txt"});
  const std::unique_ptr<Subword> sp = text_tokenizer(o, corpus);
  Classifier c = make_classifier(o, init, *sp);
  nn::Module& model = c.module();
  model.to(training_device(o.trainer.device));
  auto logits_of = [&c](const Tensor& ids) { return c.logits(ids); };
  const auto train = encode_mails(*sp, corpus.split.train, c.max_len), val = encode_mails(*sp, corpus.split.val, c.max_len);
  const std::unique_ptr<optim::AdamW> adamw = text_adamw(model, o.adamw);
  std::vector<int64_t> train_labels;
  for (const Mail& m : corpus.split.train) train_labels.push_back(m.label);
  MailBatches batches(static_cast<int64_t>(train.size()), o.batch, o.trainer.seed,
                      [&](const std::vector<int64_t>& rows, Generator&) {
                        std::vector<int64_t> y;
                        for (int64_t r : rows) y.push_back(train_labels[static_cast<size_t>(r)]);
                        Tensor ids = pad_batch(train, rows), labels = tensor(y);
                        return TrainBatch{static_cast<int64_t>(rows.size()), [logits_of, ids, labels] {
                                            Tensor logits = logits_of(ids);
                                            return cross_entropy(logits, labels.to(logits.device()));
                                          }};
                      });
  const int64_t steps_per_epoch = batches.plan(1);
  const optim::CosineSchedule schedule = o.adamw.schedule(steps_per_epoch * o.trainer.epochs);
  std::printf("train: ham/spam with %s (%lld parameters) on %s: %zu train, %zu val mails, max_len %lld, batch %lld, "
              "%lld epochs of %lld steps, AdamW lr %.2e\n",
              c.what.c_str(), (long long)model.num_parameters(), corpus.dir.c_str(), train.size(), val.size(),
              (long long)c.max_len, (long long)o.batch, (long long)o.trainer.epochs, (long long)steps_per_epoch, o.adamw.lr);
  std::fflush(stdout);
  TrainerOptions& to = run.record({{"task", "classify"}, {"data", corpus.dir}}, c.metadata, "ham/spam: " + c.what);
  to.rate_unit = "mail";

  Trainer trainer(model, *adamw, &schedule, to);
  trainer.evaluate = [&](int64_t, int64_t) {
    Scores s = score(logits_of, val, corpus.split.val, 64);
    return Metrics{{"val_accuracy", "val accuracy", 100 * s.accuracy, 2, "%", true},
                   {"val_spam_f1", "val spam F1", 100 * s.spam_f1, 2, "", true}};
  };
  return classify_result(trainer.fit(batches), c, *sp, corpus, to.out_dir);
}

std::vector<double> TextClassifier::spam_probability(const std::vector<std::string>& texts) {
  NoGradGuard no_grad;
  std::vector<Mail> mails;
  for (const std::string& t : texts) mails.push_back(Mail{"", "", "", t, 0});
  const auto seqs = encode_mails(*subword, mails, max_len);
  std::vector<double> out;
  for (size_t i = 0; i < seqs.size(); ++i) {
    Tensor ids = pad_batch(seqs, {static_cast<int64_t>(i)});
    Tensor p = softmax(bert ? bert->classify(ids) : bow->forward(ids), 1);
    out.push_back(p.select(1, 1).item<double>());
  }
  return out;
}

TextClassifier load_text_classifier(const std::string& dir) {
  const SavedModel s = read_saved_model(dir, {"classify"}, "a text classifier", "tapestry train --task classify");
  TP_CHECK(file_exists(dir + "/spm.model"), "{}/spm.model not found: the classifier's tokenizer is missing", dir);
  TextClassifier c;
  c.subword = std::make_unique<Subword>(dir + "/spm.model");
  c.max_len = s.num("max_len");
  if (s.meta("model") == "bow") {
    c.bow = std::make_shared<BagOfWords>(s.num("vocab"), 2, Subword::kPad);
    c.bow->load_state_dict(s.file.as_map());
    c.bow->eval();
  } else {
    BertConfig cfg = bert_config(s);
    cfg.dropout = 0;
    c.bert = std::make_shared<Bert>(cfg);
    c.bert->load_state_dict(s.file.as_map());
    c.bert->eval();
  }
  TP_CHECK(c.subword->vocab_size() + 1 == (c.bert ? c.bert->config.vocab : c.bow->vocab),
           "{}: the model's vocabulary does not match {}/spm.model", s.path, dir);
  return c;
}

namespace {

Task text_task(std::string name, std::string summary, TextOptions (*defaults)(), OptionTable (*table)(TextOptions&),
               TextResult (*train)(const TextOptions&)) {
  TaskSpec<TextOptions> t;
  t.name = std::move(name), t.summary = std::move(summary), t.defaults = defaults, t.table = table;
  t.run = [train](const TextOptions& o) { return exit_status(train(o).interrupted); };
  return make_task(std::move(t));
}

}  // namespace

Task mlm_task() {
  return text_task("mlm", "masked-LM pre-training of the text encoder on the mail corpus", default_mlm_options,
                   mlm_options_table, train_mlm);
}

Task classify_task() {
  return text_task("classify", "ham/spam", default_classify_options, classify_options_table, train_text_classifier);
}

}  // namespace tapestry::apps
