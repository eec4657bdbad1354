// The encoder-only text model on the SpamAssassin mail corpus (apps/data/mail_corpus.h):
//   `tapestry train --task mlm`       pre-trains models::Bert with BERT's masked-LM objective on
//                                     the training split's text (80/10/10 masking);
//   `tapestry train --task classify`  fine-tunes it on ham/spam from an MLM run (--init DIR), or
//                                     trains it from scratch, or (--model bow) trains a
//                                     bag-of-words logistic regression on the same tokens;
//   `tapestry classify --checkpoint DIR` labels new mail.
// Mails are "[CLS] subject body [SEP]" in SentencePiece pieces (trained on the training split;
// [CLS] and [SEP] are its bos and eos, [MASK] one id past its vocabulary), cut to max_len.
// The split is fixed (split_mail_corpus); the test mails are scored once, at the end of a
// classify run: accuracy, the spam class's F1 and the confusion matrix.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "apps/data/subword.h"
#include "apps/train/run_setup.h"
#include "apps/train/trainer.h"
#include "tapestry/models/bert.h"

namespace tapestry::apps {

struct TextOptions {
  TrainerOptions trainer = [] {
    TrainerOptions t;
    t.epochs = 4;
    t.seed = 1;
    t.keep = 1;
    t.average = 0;
    t.clip_norm = 1.0;
    return t;
  }();
  std::string data_dir;         // empty: default_spam_dir()
  std::string init;             // classify: an MLM run folder to start from (its tokenizer and weights)
  std::string model = "bert";   // classify: bert, or bow (bag-of-words logistic regression)
  std::string config = "mini";  // models::BertConfig::named (from scratch; --init takes the run's)
  int64_t vocab_size = 8000;    // SentencePiece pieces (from scratch)
  int64_t max_len = 256;        // tokens per mail, [CLS] and [SEP] included
  int64_t batch = 32;
  AdamWCosine adamw = {100, 5e-4, 1e-5, 0.01};  // warmup steps, lr, min-lr, weight decay
  double dropout = 0.1;
  double mask_prob = 0.15;      // mlm: the share of tokens chosen
  int64_t limit = 0;            // train on the first N training mails only (0: all)
};

// The option tables of the two tasks ("mlm", "classify"); each sets its own default --out.
OptionTable mlm_options_table(TextOptions& options);
OptionTable classify_options_table(TextOptions& options);
TextOptions default_mlm_options();
TextOptions default_classify_options();

struct TextResult {
  int64_t steps = 0, parameters = 0;
  double val_metric = 0;                  // mlm: masked-token accuracy; classify: accuracy
  double test_accuracy = 0, test_spam_f1 = 0;
  std::vector<std::vector<int64_t>> confusion;  // classify: [true][predicted] on the test mails
  bool stopped = false;
  int interrupted = 0;
};

TextResult train_mlm(const TextOptions& options);
TextResult train_text_classifier(const TextOptions& options);

// A bag-of-words logistic regression, the worked example of docs/api.md: each mail is the
// log(1 + count) of every vocabulary id (scatter_add over its tokens), one Linear on top.
class BagOfWords : public nn::Module {
 public:
  BagOfWords(int64_t vocab, int64_t classes, int64_t pad_id = 0);
  Tensor forward(const Tensor& ids);  // int64 [B, T] -> logits [B, classes]
  std::shared_ptr<nn::Linear> linear;
  int64_t vocab, pad_id;
};

// A classifier written by train_text_classifier, with its tokenizer.
struct TextClassifier {
  std::unique_ptr<Subword> subword;
  std::shared_ptr<models::Bert> bert;     // one of the two
  std::shared_ptr<BagOfWords> bow;
  int64_t max_len = 0;
  // P(spam) for each mail text (already mail_text'ed).
  std::vector<double> spam_probability(const std::vector<std::string>& texts);
};
TextClassifier load_text_classifier(const std::string& checkpoint_dir);

}  // namespace tapestry::apps
