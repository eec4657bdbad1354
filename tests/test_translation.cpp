// Subwords and the translation training loop, end to end on a small synthetic corpus (a
// word-for-word "German to English" dictionary), so the test needs no data files.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "apps/data/subword.h"
#include "apps/tasks/translation.h"
#include "tapestry/nn/safetensors.h"
#include "tests/helpers.h"

using namespace tapestry;
using namespace tapestry::testing;

namespace {
const std::vector<std::pair<std::string, std::string>> kWords = {
    {"ein", "a"},      {"Hund", "dog"},   {"Mann", "man"},       {"Frau", "woman"}, {"läuft", "runs"},
    {"springt", "jumps"}, {"rot", "red"}, {"blau", "blue"},      {"im", "in the"},  {"Park", "park"},
    {"Schnee", "snow"}, {"Wasser", "water"}, {"groß", "big"},    {"klein", "small"}, {"Kind", "child"},
    {"spielt", "plays"}, {"Ball", "ball"}, {"mit", "with"},      {"und", "and"},    {"sitzt", "sits"}};

// n sentence pairs of 3 to 8 words, translated word by word.
void write_corpus(const std::string& dir, const std::string& split, int n, uint64_t seed) {
  Generator gen(seed);
  std::ofstream de(dir + "/" + split + ".de"), en(dir + "/" + split + ".en");
  for (int i = 0; i < n; ++i) {
    int64_t len = randint(3, 9, {1}, kInt64, &gen).item<int64_t>();
    std::vector<int64_t> w = randint(0, static_cast<int64_t>(kWords.size()), {len}, kInt64, &gen).to_vector<int64_t>();
    std::string s, t;
    for (int64_t k : w) {
      s += (s.empty() ? "" : " ") + kWords[k].first;
      t += (t.empty() ? "" : " ") + kWords[k].second;
    }
    de << s << " .\n";
    en << t << " .\n";
  }
}
// A fresh directory holding a synthetic train/val/test corpus, and tiny-model options for it.
apps::TranslationOptions synthetic_task(const std::string& name, int train, int val, int test, uint64_t seed) {
  std::string dir = fmt::format("/tmp/tapestry_test_{}_{}", ::getpid(), name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  write_corpus(dir, "train", train, seed);
  write_corpus(dir, "val", val, seed + 1);
  write_corpus(dir, "test_2016_flickr", test, seed + 2);
  apps::TranslationOptions o;
  o.data_dir = dir;
  o.trainer.out_dir = dir + "/run";
  o.config = "tiny";
  o.vocab_size = 80;
  o.max_tokens = 512;
  o.trainer.epochs = 2;
  o.trainer.average = 0;
  o.trainer.progress = false;
  return o;
}
}  // namespace

TEST_CASE("subwords: train, encode, decode round trip") {
  std::string dir = fmt::format("/tmp/tapestry_test_{}_spm", ::getpid());
  ::mkdir(dir.c_str(), 0755);
  std::vector<std::string> text;
  for (int i = 0; i < 200; ++i) text.push_back(i % 2 ? "Ein Hund läuft im Park ." : "A dog runs in the park .");
  apps::Subword::train(text, dir + "/m.model", 40);
  apps::Subword sp(dir + "/m.model");
  CHECK(sp.vocab_size() <= 40);
  auto ids = sp.encode("Ein Hund läuft.");
  CHECK(!ids.empty());
  for (int64_t id : ids) CHECK(id > apps::Subword::kEos);
  CHECK(sp.decode(ids) == "Ein Hund läuft.");
  CHECK(sp.decode({apps::Subword::kBos, ids[0], apps::Subword::kEos}) == sp.decode({ids[0]}));
  CHECK(error_of([&] { apps::Subword("/nonexistent/x.model"); }).find("subword: cannot load /nonexistent/x.model") !=
        std::string::npos);
  std::remove((dir + "/m.model").c_str());
  ::rmdir(dir.c_str());
}

TEST_CASE("two epochs on a 1000-pair corpus: the loss falls, checkpoints are written") {
  apps::TranslationOptions o = synthetic_task("mt", 1000, 60, 40, 1);
  const std::string dir = o.data_dir;
  o.warmup = 50;
  o.beam = 2;
  auto r = apps::train_translation(o);
  REQUIRE(r.epochs.size() == 2);
  MESSAGE("train loss ", r.epochs[0].train_loss, " -> ", r.epochs[1].train_loss, ", val loss ", r.epochs[0].val_loss,
          " -> ", r.epochs[1].val_loss, ", test BLEU ", r.test_bleu);
  CHECK(r.epochs[1].train_loss < r.epochs[0].train_loss);
  CHECK(r.epochs[1].val_loss < r.epochs[0].val_loss);
  CHECK(std::ifstream(dir + "/run/model.safetensors").good());
  CHECK(std::ifstream(dir + "/run/checkpoint.safetensors").good());
  CHECK(std::ifstream(dir + "/run/spm.model").good());
  {
    std::ifstream svg(dir + "/run/curves.svg");
    std::string text((std::istreambuf_iterator<char>(svg)), std::istreambuf_iterator<char>());
    CHECK(text.rfind("<svg", 0) == 0);
    CHECK(text.find("val BLEU (greedy)") != std::string::npos);
    CHECK(text.find("<polyline") != std::string::npos);
  }
  CHECK(r.test_bleu_line.rfind("BLEU = ", 0) == 0);
  // The checkpoint translates on its own, and greedy equals beam 1.
  std::vector<std::string> src = {"ein Hund läuft im Park .", "ein Mann spielt mit Ball ."};
  auto translator = apps::load_translator(dir + "/run");
  CHECK(translator.weights_path == dir + "/run/model.safetensors");
  auto beam = apps::translate(translator, src, 3);
  auto greedy = apps::translate(translator, src, 1);
  CHECK(beam.size() == 2);
  CHECK(greedy.size() == 2);
  MESSAGE("translations: '", beam[0], "', '", beam[1], "'");
  // One sentence at a time gives what a batch gives (padding is masked).
  CHECK(apps::translate(translator, src, 3, 0.6, 1) == beam);
  CHECK(apps::translate(translator, src, 1, 0.6, 1) == greedy);
  CHECK(error_of([&] { apps::translate(translator, src, 1, 0.6, 0); }).find("at least one sentence") !=
        std::string::npos);
  CHECK(error_of([&] { apps::load_translator(dir + "/nothing"); }).find("model.safetensors not found") !=
        std::string::npos);
  CHECK(error_of([&] { apps::load_translator(dir + "/run", "model.epoch9.safetensors"); })
            .find("run/model.epoch9.safetensors not found") != std::string::npos);
  // The options were printed and saved as TOML beside the checkpoints.
  std::ifstream toml(dir + "/run/config.toml");
  std::string config((std::istreambuf_iterator<char>(toml)), std::istreambuf_iterator<char>());
  CHECK(config == apps::options_to_toml(o));
  CHECK(config.find("\nmax-tokens = 512\n") != std::string::npos);
  CHECK(config.find("\nconfig = \"tiny\"\n") != std::string::npos);
  CHECK(config.find("\nlabel-smoothing = 0.1\n") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("gradient accumulation, clipping and pre-norm: fewer optimizer steps, the loss still falls") {
  apps::TranslationOptions o = synthetic_task("accumulate", 600, 30, 20, 2);
  const std::string dir = o.data_dir;
  o.warmup = 30;
  o.beam = 1;
  o.max_tokens = 256;
  auto single = apps::train_translation(o);
  o.trainer.out_dir = dir + "/nested/accumulated";  // parents are created as needed
  o.trainer.accumulate = 3;
  o.trainer.clip_norm = 1.0;
  o.pre_norm = true;
  auto accumulated = apps::train_translation(o);
  REQUIRE(accumulated.epochs.size() == 2);
  // Same batches, one optimizer step per three of them (the last group of an epoch may be short).
  const int64_t batches = single.epochs[0].steps;
  CHECK(accumulated.epochs[0].steps == (batches + 2) / 3);
  CHECK(accumulated.epochs[1].train_loss < accumulated.epochs[0].train_loss);
  auto t = apps::load_translator(o.trainer.out_dir);
  CHECK(t.model->config.pre_norm);
  o.trainer.accumulate = 0;
  CHECK(error_of([&] { apps::train_translation(o); }).find("train: --accumulate: must be a positive integer, got '0'") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("an interrupted run resumed from its checkpoint ends where an uninterrupted one does, to the bit") {
  apps::TranslationOptions o = synthetic_task("resume", 600, 30, 20, 4);
  const std::string dir = o.data_dir;
  o.warmup = 30;
  o.beam = 1;
  o.max_tokens = 256;
  o.trainer.accumulate = 2;  // the checkpoint falls between groups of batches
  o.trainer.clip_norm = 1.0;

  o.trainer.out_dir = dir + "/straight";
  auto straight = apps::train_translation(o);

  o.trainer.out_dir = dir + "/interrupted";
  o.trainer.stop_after = 7;  // mid-way through the first epoch
  auto first = apps::train_translation(o);
  CHECK(first.stopped);
  o.trainer.stop_after = 0;
  o.trainer.resume = true;
  auto resumed = apps::train_translation(o);
  REQUIRE(resumed.epochs.size() == 2);
  CHECK(resumed.epochs[1].train_loss == straight.epochs[1].train_loss);  // exactly
  CHECK(resumed.epochs[0].train_loss == straight.epochs[0].train_loss);
  CHECK(resumed.epochs[1].val_loss == straight.epochs[1].val_loss);
  auto a = nn::load_safetensors(dir + "/straight/model.safetensors").as_map();
  auto b = nn::load_safetensors(dir + "/interrupted/model.safetensors").as_map();
  REQUIRE(a.size() == b.size());
  for (auto& [name, t] : a) {
    INFO(name);
    CHECK(values(t) == values(b.at(name)));
  }
  // Interrupted right after the last batch of epoch 1: the resumed run still validates epoch 1
  // and writes its copy before going on, and ends in the same place.
  o.trainer.out_dir = dir + "/epoch_end";
  o.trainer.resume = false;
  o.trainer.stop_after = straight.epochs[0].steps;
  CHECK(apps::train_translation(o).stopped);
  CHECK_FALSE(std::ifstream(dir + "/epoch_end/model.epoch1.safetensors").good());
  o.trainer.stop_after = 0;
  o.trainer.resume = true;
  auto at_end = apps::train_translation(o);
  REQUIRE(at_end.epochs.size() == 2);
  CHECK(at_end.epochs[0].val_loss == straight.epochs[0].val_loss);
  CHECK(at_end.epochs[1].train_loss == straight.epochs[1].train_loss);
  CHECK(std::ifstream(dir + "/epoch_end/model.epoch1.safetensors").good());
  CHECK(at_end.test_bleu == straight.test_bleu);
  // Resuming with a recipe that changes the batch plan is refused, naming the option.
  o.max_tokens = 300;
  CHECK(error_of([&] { apps::train_translation(o); }).find("was trained with max_tokens = 256, but this run has "
                                                             "max_tokens = 300") != std::string::npos);
  o.max_tokens = 256;
  // Keep the last K epoch checkpoints, the best one, and average the last N for the test.
  CHECK(std::ifstream(dir + "/straight/model.epoch1.safetensors").good());
  CHECK(std::ifstream(dir + "/straight/model.best.safetensors").good());
  auto avg = apps::average_checkpoints({dir + "/straight/model.epoch1.safetensors", dir + "/straight/model.epoch2.safetensors"});
  auto e1 = nn::load_safetensors(dir + "/straight/model.epoch1.safetensors").as_map();
  auto e2 = nn::load_safetensors(dir + "/straight/model.epoch2.safetensors").as_map();
  for (auto& [name, t] : avg) {
    INFO(name);
    CHECK(allclose(t, (e1.at(name) + e2.at(name)) * 0.5, 1e-6, 1e-7));
  }
  CHECK(error_of([&] { apps::average_checkpoints({dir + "/straight/model.epoch1.safetensors", dir + "/straight/checkpoint.safetensors"}); })
            .find("average_checkpoints:") != std::string::npos);
  {
    apps::TranslationOptions k = o;
    k.trainer.out_dir = dir + "/keep";
    k.trainer.epochs = 3;
    k.trainer.keep = 2;
    k.trainer.average = 2;
    k.trainer.resume = false;
    auto r = apps::train_translation(k);
    CHECK(r.averaged == 2);
    CHECK_FALSE(std::ifstream(dir + "/keep/model.epoch1.safetensors").good());
    CHECK(std::ifstream(dir + "/keep/model.epoch2.safetensors").good());
    CHECK(std::ifstream(dir + "/keep/model.epoch3.safetensors").good());
    CHECK(std::ifstream(dir + "/keep/model.avg.safetensors").good());
    CHECK(r.best_epoch >= 1);
  }
  // A checkpoint of another config is refused with a clear message.
  o.trainer.out_dir = dir + "/interrupted";
  o.config = "small";
  CHECK(error_of([&] { apps::train_translation(o); }).find("was trained with config = tiny, but this run has config "
                                                             "= small") != std::string::npos);
  std::filesystem::remove_all(dir);
}
