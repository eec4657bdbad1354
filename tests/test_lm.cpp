// The language-model task end to end on a small generated text (no data files needed): the byte
// tokenizer and UTF-8 prefixes, stream_loss against a hand computation, train_language_model
// (metrics, the run folder, load_language_model and sampling from it), an interrupted run
// resumed to the bit, the Trainer's time_limit, and the errors.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>

#include "apps/data/lm_tokenizer.h"
#include "apps/data/text.h"
#include "apps/tasks/language_model.h"
#include "apps/train/trainer.h"
#include "tapestry/models/gpt.h"
#include "tapestry/models/llama.h"
#include "tapestry/nn/safetensors.h"
#include "tests/helpers.h"

using namespace tapestry;
using namespace tapestry::testing;
using Ids = std::vector<int64_t>;

namespace {


std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

int64_t count_lines(const std::string& path) {
  const std::string s = read_file(path);
  return std::count(s.begin(), s.end(), '\n');
}

std::string first_line(const std::string& path) {
  const std::string s = read_file(path);
  return s.substr(0, s.find('\n'));
}

// 200 lines of simple sentences, in an order that repeats.
std::vector<std::string> corpus_lines() {
  const char* subjects[] = {"the cat", "a dog", "the bird", "my friend"};
  const char* verbs[] = {"sees", "likes", "finds", "follows"};
  const char* objects[] = {"the ball.", "a red box.", "the green tree.", "some water."};
  std::vector<std::string> lines;
  for (int i = 0; i < 200; ++i)
    lines.push_back(fmt::format("{} {} {}", subjects[i % 4], verbs[(i / 4) % 4], objects[(i / 16) % 4]));
  return lines;
}

std::string write_corpus(const std::string& dir) {
  const std::string path = dir + "/text.txt";
  std::ofstream out(path);
  for (const std::string& line : corpus_lines()) out << line << '\n';
  return path;
}

// The byte stream of the corpus's held-out lines (the last 10 of 200), as the LM task makes it.
std::vector<int32_t> held_out_bytes() {
  const std::vector<std::string> lines = corpus_lines();
  std::vector<int32_t> stream = {'\n'};
  for (size_t i = 190; i < lines.size(); ++i) {
    for (unsigned char ch : lines[i]) stream.push_back(ch);
    stream.push_back('\n');
  }
  return stream;
}

apps::LMOptions tiny_lm(const std::string& data, const std::string& out_dir) {
  apps::LMOptions o;
  o.train_path = data;
  o.trainer.out_dir = out_dir;
  o.tokenizer = "byte";
  o.config = "tiny";
  o.block = 16;
  o.batch = 8;
  o.trainer.epochs = 2;
  o.trainer.progress = false;
  return o;
}

}  // namespace

TEST_CASE("lm_tokenizer: bytes round trip - complete_utf8_prefix stops before a cut character") {
  std::unique_ptr<apps::LMTokenizer> tok = apps::byte_tokenizer();
  CHECK(tok->name() == "byte");
  CHECK(tok->vocab_size() == 256);
  CHECK(tok->separator() == '\n');
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  Ids ids = tok->encode(all);
  REQUIRE(ids.size() == 256);
  for (int64_t i = 0; i < 256; ++i) CHECK(ids[static_cast<size_t>(i)] == i);
  CHECK(tok->decode(ids) == all);
  const std::string text = "h\xC3\xA9llo, w\xC3\xB6rld \xE2\x82\xAC \xF0\x9F\x98\x80\nnext line";
  CHECK(tok->encode(text).size() == text.size());
  CHECK(tok->decode(tok->encode(text)) == text);
  CHECK(tok->encode("").empty());
  CHECK(tok->decode({}).empty());
  CHECK_THROWS_AS(tok->decode({256}), Error);
  CHECK_THROWS_AS(tok->decode({-1}), Error);

  using apps::complete_utf8_prefix;
  CHECK(complete_utf8_prefix("") == 0);
  CHECK(complete_utf8_prefix("abc") == 3);
  CHECK(complete_utf8_prefix("abc\n") == 4);
  // 2 bytes: é = C3 A9
  CHECK(complete_utf8_prefix("a\xC3\xA9") == 3);
  CHECK(complete_utf8_prefix("a\xC3") == 1);
  CHECK(complete_utf8_prefix("\xC3") == 0);
  // 3 bytes: € = E2 82 AC
  CHECK(complete_utf8_prefix("a\xE2\x82\xAC") == 4);
  CHECK(complete_utf8_prefix("a\xE2\x82") == 1);
  CHECK(complete_utf8_prefix("a\xE2") == 1);
  CHECK(complete_utf8_prefix(std::string("\xE2\x82\xAC") + "x") == 4);
  // 4 bytes: U+1F600 = F0 9F 98 80
  CHECK(complete_utf8_prefix("ab\xF0\x9F\x98\x80") == 6);
  CHECK(complete_utf8_prefix("ab\xF0\x9F\x98") == 2);
  CHECK(complete_utf8_prefix("ab\xF0\x9F") == 2);
  CHECK(complete_utf8_prefix("ab\xF0") == 2);
  CHECK(complete_utf8_prefix("\xF0\x9F\x98") == 0);
  // A whole character before the cut one is kept.
  CHECK(complete_utf8_prefix(std::string("\xC3\xA9") + "\xE2\x82") == 2);
}

TEST_CASE("stream_loss: every token after the first predicted once, in windows of block + 1") {
  manual_seed(21);
  models::GPTConfig c;
  c.vocab = 20, c.block_size = 8, c.layers = 2, c.heads = 2, c.d_model = 16, c.dropout = 0.1;
  models::GPT model(c);
  const int64_t block = 8;
  for (int64_t n : {45, 41, 9, 5, 2}) {
    INFO("stream of ", n, " tokens");
    Generator g(static_cast<uint64_t>(n));
    std::vector<int32_t> stream;
    for (int64_t id : randint(0, 20, {n}, kInt64, &g).to_vector<int64_t>()) stream.push_back(static_cast<int32_t>(id));
    // By hand: windows starting at 0, block, 2 block, ..., the last one shorter; summed losses.
    double total = 0;
    int64_t count = 0;
    model.eval();
    {
      NoGradGuard no_grad;
      for (int64_t s = 0; s + 1 < n; s += block) {
        const int64_t len = std::min(block, n - 1 - s);
        Ids x, y;
        for (int64_t t = 0; t < len; ++t) {
          x.push_back(stream[static_cast<size_t>(s + t)]);
          y.push_back(stream[static_cast<size_t>(s + t + 1)]);
        }
        Tensor logits = model.forward(tensor(x, {1, len}));
        total += cross_entropy(logits.reshape({-1, 20}), tensor(y, {len}), 0.0, -100, Reduction::Sum).item<double>();
        count += len;
      }
    }
    CHECK(count == n - 1);
    model.train();
    const double want = total / static_cast<double>(count);
    CHECK(apps::stream_loss(model, stream, block, 3) == doctest::Approx(want).epsilon(1e-5));
    CHECK(model.is_training());  // restored
    CHECK(apps::stream_loss(model, stream, block, 1) == doctest::Approx(want).epsilon(1e-5));
    CHECK(apps::stream_loss(model, stream, block, 100) == doctest::Approx(want).epsilon(1e-5));
    // Shorter windows predict the same tokens with less context: a different loss, same count.
    CHECK(std::isfinite(apps::stream_loss(model, stream, 3, 2)));
  }
  CHECK(apps::stream_loss(model, std::vector<int32_t>{4}, block, 3) == 0.0);
  CHECK(apps::stream_loss(model, std::vector<int32_t>{}, block, 3) == 0.0);
}

TEST_CASE("train_language_model --model llama: learns, saves, loads with its config, samples - resumed to the bit") {
  const std::string dir = fresh_temp_dir("lm_llama");
  const std::string data = write_corpus(dir);
  apps::LMOptions o = tiny_lm(data, dir + "/a");
  o.model = "llama";
  o.trainer.step_log = dir + "/a.steps.tsv";
  apps::LMResult a = apps::train_language_model(o);
  REQUIRE(a.steps > 0);
  REQUIRE(std::isfinite(a.val_loss));
  CHECK(a.val_loss < std::log(256.0));  // better than uniform over bytes
  // tiny Llama at 256 bytes: embedding and head 2 x 256 x 64; per layer q, o 64 x 64, k, v 64 x 32,
  // gate, up, down 64 x 176, two norms of 64; the final norm.
  CHECK(a.parameters == 2 * 256 * 64 + 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 176 + 2 * 64) + 64);

  apps::LanguageModel lm = apps::load_language_model(o.trainer.out_dir);
  auto* llama = dynamic_cast<models::Llama*>(lm.model.get());
  REQUIRE(llama);
  CHECK(llama->config.max_positions == 16);
  CHECK(llama->config.kv_heads == 2);
  CHECK(llama->config.d_ff == 176);
  CHECK(llama->config.rms_eps == 1e-5);
  CHECK_FALSE(lm.model->is_training());
  CHECK(apps::stream_loss(*lm.model, held_out_bytes(), 16, 8) == doctest::Approx(a.val_loss).epsilon(1e-9));
  // Sampling past the 16-position context (the window slides), with and without the cache.
  models::SampleOptions so;
  so.greedy = true;
  so.max_new = 30;
  std::vector<Ids> cached = models::generate(*lm.model, {lm.tokenizer->encode("the "), lm.tokenizer->encode("a")}, so);
  so.use_cache = false;
  CHECK(models::generate(*lm.model, {lm.tokenizer->encode("the "), lm.tokenizer->encode("a")}, so) == cached);

  // Interrupted and resumed: the same steps to the bit.
  apps::LMOptions b = o;
  b.trainer.out_dir = dir + "/b", b.trainer.step_log = dir + "/b.steps.tsv";
  b.trainer.stop_after = a.steps / 2;
  CHECK(apps::train_language_model(b).stopped);
  b.trainer.stop_after = 0, b.trainer.resume = true;
  CHECK(apps::train_language_model(b).val_loss == a.val_loss);
  CHECK(read_file(b.trainer.step_log) == read_file(o.trainer.step_log));
  std::filesystem::remove_all(dir);
}

TEST_CASE("train_language_model: metrics, the run folder, loading and sampling - resumed to the bit - time_limit") {
  const std::string dir = fresh_temp_dir("lm");
  const std::string data = write_corpus(dir);
  const std::vector<std::string> lines = corpus_lines();

  apps::LMOptions o = tiny_lm(data, dir + "/a");
  o.trainer.step_log = dir + "/a.steps.tsv";
  apps::LMResult a = apps::train_language_model(o);
  CHECK_FALSE(a.stopped);
  CHECK(a.interrupted == 0);
  REQUIRE(a.steps > 0);
  CHECK(count_lines(o.trainer.step_log) == a.steps);
  CHECK(a.parameters == 117504);  // tiny with 256 bytes and block 16
  // The held-out validation text: the last 5% of the lines (10), each with its newline.
  int64_t val_bytes = 0, train_bytes = 0;
  for (size_t i = 0; i < lines.size(); ++i)
    (i >= 190 ? val_bytes : train_bytes) += static_cast<int64_t>(lines[i].size()) + 1;
  CHECK(a.val_bytes == val_bytes);
  CHECK(a.val_tokens == val_bytes + 1);  // a separator first, then one token per byte
  CHECK(a.train_tokens == train_bytes + 1);
  // One epoch covers the stream in windows of 16 (from a random offset), 8 per batch.
  const int64_t windows = (a.train_tokens - 1) / 16;
  CHECK(a.steps >= 2 * ((windows - 1 + 7) / 8));
  CHECK(a.steps <= 2 * ((windows + 7) / 8));
  // The metrics.
  REQUIRE(std::isfinite(a.val_loss));
  CHECK(a.val_loss > 0);
  CHECK(a.val_loss < std::log(256.0));  // better than uniform over bytes
  CHECK(a.val_ppl == doctest::Approx(std::exp(a.val_loss)).epsilon(1e-12));
  CHECK(a.val_bpb == doctest::Approx(a.val_loss * static_cast<double>(a.val_tokens - 1) / std::log(2.0) /
                                     static_cast<double>(a.val_bytes))
                         .epsilon(1e-12));
  CHECK(a.val_bpb == doctest::Approx(a.val_loss / std::log(2.0)).epsilon(1e-12));  // bytes: one token each
  for (const char* f : {"model.safetensors", "checkpoint.safetensors"}) {
    INFO(f);
    CHECK(std::filesystem::exists(o.trainer.out_dir + "/" + f));
  }

  // The saved model, loaded with its tokenizer, gives the reported validation loss and samples.
  apps::LanguageModel lm = apps::load_language_model(o.trainer.out_dir);
  REQUIRE(lm.model);
  REQUIRE(lm.tokenizer);
  CHECK(lm.tokenizer->name() == "byte");
  auto* gpt = dynamic_cast<models::GPT*>(lm.model.get());
  REQUIRE(gpt);
  CHECK(gpt->config.vocab == 256);
  CHECK(gpt->config.block_size == 16);
  CHECK(gpt->config.layers == 2);
  CHECK(gpt->config.heads == 2);
  CHECK(gpt->config.d_model == 64);
  CHECK_FALSE(lm.model->is_training());
  CHECK(apps::stream_loss(*lm.model, held_out_bytes(), 16, 8) == doctest::Approx(a.val_loss).epsilon(1e-9));
  models::SampleOptions so;
  so.greedy = true;
  so.max_new = 10;
  std::vector<Ids> out = models::generate(*lm.model, {lm.tokenizer->encode("the ")}, so);
  REQUIRE(out.size() == 1);
  CHECK(out[0].size() == 10);
  for (int64_t t : out[0]) CHECK((t >= 0 && t < 256));
  CHECK(lm.tokenizer->decode(out[0]).size() == 10);
  so.greedy = false;
  so.seed = 3;
  CHECK(models::generate(*lm.model, {lm.tokenizer->encode("a dog")}, so) ==
        models::generate(*lm.model, {lm.tokenizer->encode("a dog")}, so));

  // Interrupted a third of the way and resumed: the same steps, to the bit, and the same model.
  apps::LMOptions b = tiny_lm(data, dir + "/b");
  b.trainer.step_log = dir + "/b.steps.tsv";
  b.trainer.stop_after = a.steps / 3;
  apps::LMResult b1 = apps::train_language_model(b);
  CHECK(b1.stopped);
  CHECK(b1.steps == a.steps / 3);
  CHECK(count_lines(b.trainer.step_log) == a.steps / 3);
  b.trainer.stop_after = 0;
  b.trainer.resume = true;
  apps::LMResult b2 = apps::train_language_model(b);
  CHECK_FALSE(b2.stopped);
  CHECK(b2.steps == a.steps);
  CHECK(read_file(b.trainer.step_log) == read_file(o.trainer.step_log));  // loss, lr and gradient norm as %.17g
  CHECK(b2.val_loss == a.val_loss);
  CHECK(b2.val_bpb == a.val_bpb);
  auto wa = nn::load_safetensors(o.trainer.out_dir + "/model.safetensors").as_map();
  auto wb = nn::load_safetensors(b.trainer.out_dir + "/model.safetensors").as_map();
  REQUIRE(wa.size() == wb.size());
  for (const auto& entry : wa) {
    const std::string name = entry.first;
    INFO(name);
    REQUIRE(wb.count(name) == 1);
    CHECK(values(entry.second) == values(wb.at(name)));
  }

  // time_limit: the run ends after the step that reaches it, evaluated and saved.
  apps::LMOptions t = tiny_lm(data, dir + "/t");
  t.trainer.step_log = dir + "/t.steps.tsv";
  t.trainer.time_limit = 1e-9;
  apps::LMResult r = apps::train_language_model(t);
  CHECK(r.steps == 1);
  CHECK_FALSE(r.stopped);
  CHECK(count_lines(t.trainer.step_log) == 1);
  CHECK(first_line(t.trainer.step_log) == first_line(o.trainer.step_log));  // the schedule still spans both epochs
  CHECK(std::isfinite(r.val_loss));
  CHECK(r.val_ppl == doctest::Approx(std::exp(r.val_loss)).epsilon(1e-12));
  CHECK(std::filesystem::exists(t.trainer.out_dir + "/model.safetensors"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("train_language_model --base --lora-rank: adapters saved alone, the base untouched, loaded, merged, resumed to the bit") {
  const std::string dir = fresh_temp_dir("lm_lora");
  const std::string data = write_corpus(dir);
  apps::LMOptions base = tiny_lm(data, dir + "/base");
  base.model = "llama", base.trainer.epochs = 1;
  const apps::LMResult base_result = apps::train_language_model(base);
  const std::string base_bytes = read_file(dir + "/base/model.safetensors");

  apps::LMOptions o = tiny_lm(data, dir + "/ft");
  o.base = dir + "/base";
  o.lora_rank = 4;
  o.lora_targets = "q, k,v,o,gate,up,down";
  o.adamw.lr = 1e-2;
  o.merge = true;
  o.trainer.step_log = dir + "/ft.steps.tsv";
  const apps::LMResult a = apps::train_language_model(o);
  REQUIRE(a.steps > 0);
  // rank x (in + out) for each of the seven layers of the two blocks (D 64, kv 32, d_ff 176).
  CHECK(a.trainable_parameters == 2 * 4 * ((64 + 64) + 2 * (64 + 32) + (64 + 64) + 3 * (64 + 176)));
  CHECK(a.parameters == base_result.parameters + a.trainable_parameters);
  CHECK(a.val_loss < base_result.val_loss);
  // The run folder holds the adapters alone; the base's file is byte for byte what it was.
  CHECK(read_file(dir + "/base/model.safetensors") == base_bytes);
  CHECK_FALSE(std::filesystem::exists(dir + "/ft/model.safetensors"));
  const nn::SafetensorsFile adapter = nn::load_safetensors(dir + "/ft/adapter.safetensors");
  CHECK(adapter.tensors.size() == 28);
  for (const auto& [name, t] : adapter.tensors) CHECK_MESSAGE(name.find(".lora_") != std::string::npos, name);
  CHECK(adapter.metadata.at("base") == std::filesystem::absolute(dir + "/base").lexically_normal().string());
  CHECK(adapter.metadata.at("lora_targets") == "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj");
  for (const auto& [name, t] : nn::load_safetensors(dir + "/ft/checkpoint.safetensors").tensors)
    CHECK_MESSAGE((name.find(".lora_") != std::string::npos || name.rfind("optimizer.", 0) == 0), name);

  // Loaded: the base with the adapters, as trained.
  apps::LanguageModel lm = apps::load_language_model(dir + "/ft");
  CHECK(apps::stream_loss(*lm.model, held_out_bytes(), 16, 8) == doctest::Approx(a.val_loss).epsilon(1e-9));
  // Merged (--merge): a plain run folder of the base's shape whose outputs are the adapted model's.
  apps::LanguageModel merged = apps::load_language_model(dir + "/ft/merged");
  CHECK(merged.model->num_parameters() == base_result.parameters);
  CHECK(apps::stream_loss(*merged.model, held_out_bytes(), 16, 8) == doctest::Approx(a.val_loss).epsilon(1e-5));
  CHECK(apps::merge_lora_run(dir + "/ft", dir + "/merged2") == base_result.parameters);
  // From the run folder afterwards, the same bytes as --merge wrote from the trained model in memory.
  CHECK(read_file(dir + "/merged2/model.safetensors") == read_file(dir + "/ft/merged/model.safetensors"));

  // Full fine-tuning of the same base: every weight trains, and the folder stands alone.
  apps::LMOptions full = tiny_lm(data, dir + "/full");
  full.base = dir + "/base", full.trainer.epochs = 1;
  const apps::LMResult f = apps::train_language_model(full);
  CHECK(f.trainable_parameters == base_result.parameters);
  CHECK(f.parameters == base_result.parameters);
  CHECK(dynamic_cast<models::Llama*>(apps::load_language_model(dir + "/full").model.get()));

  // Interrupted and resumed: the same steps to the bit.
  apps::LMOptions b = o;
  b.trainer.out_dir = dir + "/ft2", b.trainer.step_log = dir + "/ft2.steps.tsv", b.merge = false;
  b.trainer.stop_after = a.steps / 2;
  CHECK(apps::train_language_model(b).stopped);
  b.trainer.stop_after = 0, b.trainer.resume = true;
  CHECK(apps::train_language_model(b).val_loss == a.val_loss);
  CHECK(read_file(b.trainer.step_log) == read_file(o.trainer.step_log));
  b.lora_rank = 8;
  CHECK(error_of([&] { apps::train_language_model(b); }).find("lora_rank = 4, but this run has lora_rank = 8") !=
        std::string::npos);

  // Errors: one line each.
  auto error_with = [&](auto change) {
    apps::LMOptions e = tiny_lm(data, dir + "/bad");
    change(e);
    return error_of([&] { apps::train_language_model(e); });
  };
  CHECK(error_with([](apps::LMOptions& e) { e.lora_rank = 4; }).find("--lora-rank needs --base") != std::string::npos);
  CHECK(error_with([&](apps::LMOptions& e) { e.base = dir + "/base", e.merge = true; })
            .find("--merge needs --lora-rank") != std::string::npos);
  CHECK(error_with([&](apps::LMOptions& e) { e.base = dir + "/base", e.lora_rank = 2, e.lora_targets = "q,x"; })
            .find("train: --lora-targets: 'x' is not a layer: give some of q, k, v, o, gate, up or down") !=
        std::string::npos);
  CHECK(error_with([&](apps::LMOptions& e) { e.base = dir + "/nowhere", e.lora_rank = 2; })
            .find("--base " + dir + "/nowhere: no such directory") != std::string::npos);
  CHECK(error_with([&](apps::LMOptions& e) { e.base = dir + "/ft", e.lora_rank = 2; }).find("is a LoRA run") !=
        std::string::npos);
  // A GPT base: the same short names for its layers; it has no gate.
  apps::LMOptions gpt = tiny_lm(data, dir + "/gpt");
  gpt.trainer.epochs = 1;
  apps::train_language_model(gpt);
  CHECK(error_with([&](apps::LMOptions& e) { e.base = dir + "/gpt", e.lora_rank = 2, e.lora_targets = "q,gate"; })
            .find("train: --lora-targets: the GPT has no 'gate' layer (its MLP is up and down)") != std::string::npos);
  apps::LMOptions gpt_lora = tiny_lm(data, dir + "/gpt_lora");
  gpt_lora.base = dir + "/gpt", gpt_lora.lora_rank = 2, gpt_lora.lora_targets = "q,up", gpt_lora.trainer.epochs = 1;
  CHECK(apps::train_language_model(gpt_lora).trainable_parameters == 2 * 2 * ((64 + 64) + (64 + 256)));
  CHECK(dynamic_cast<models::GPT*>(apps::load_language_model(dir + "/gpt_lora").model.get()));
  // A base that changed after the adapters were trained is refused.
  base.trainer.seed = 2, base.trainer.overwrite = true;
  apps::train_language_model(base);
  CHECK(error_of([&] { apps::load_language_model(dir + "/ft"); }).find("has changed since the adapters were trained") !=
        std::string::npos);
  std::filesystem::remove_all(dir + "/base");
  CHECK(error_of([&] { apps::load_language_model(dir + "/ft"); }).find("is not there") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("train_language_model: errors name the option or the file") {
  const std::string dir = fresh_temp_dir("lm_errors");
  const std::string data = write_corpus(dir);
  auto error_with = [&](auto change) {
    apps::LMOptions o = tiny_lm(data, dir + "/run");
    change(o);
    return error_of([&] { apps::train_language_model(o); });
  };
  CHECK(error_with([](apps::LMOptions& o) {
          o.tokenizer = "words";
        }).find("train: --tokenizer: must be sentencepiece, byte or gpt2, got 'words'") != std::string::npos);
  // A library caller's bad value is refused as the flag would be (the task's option table).
  CHECK(error_with([](apps::LMOptions& o) { o.block = 0; }).find("train: --block: must be a positive integer, got '0'") !=
        std::string::npos);
  CHECK(error_with([](apps::LMOptions& o) { o.batch = 0; }).find("train: --batch: must be a positive integer, got '0'") !=
        std::string::npos);
  CHECK(error_with([](apps::LMOptions& o) { o.config = "huge"; })
            .find("train: --config: must be tiny, mini, small, medium or gpt2 for --model gpt, got 'huge'") != std::string::npos);
  CHECK(error_with([](apps::LMOptions& o) { o.model = "llama", o.config = "small"; })
            .find("train: --config: must be tiny or mini for --model llama, got 'small'") != std::string::npos);
  CHECK(error_with([](apps::LMOptions& o) { o.model = "mamba"; })
            .find("train: --model: must be gpt or llama, got 'mamba'") != std::string::npos);
  CHECK(error_with([](apps::LMOptions& o) { o.trainer.time_limit = -1; })
            .find("train: --time-limit: must be a number >= 0, got '-1.0'") != std::string::npos);
  CHECK(error_with([](apps::LMOptions& o) { o.trainer.epochs = 0; }).find("--epochs: must be a positive integer") !=
        std::string::npos);
  CHECK(error_with([](apps::LMOptions& o) { o.adamw.lr = std::nan(""); }).find("--lr: must be a number > 0, got 'nan'") !=
        std::string::npos);
  CHECK(error_with([](apps::LMOptions& o) { o.adamw.min_lr = 1.0; }).find("--min-lr 1 is above --lr 0.002") !=
        std::string::npos);
  CHECK(error_with([](apps::LMOptions& o) { o.trainer.device = "tpu"; }).find("train: --device: ") != std::string::npos);
  // A validation file with no text, and a --block that leaves less than a batch of windows: one
  // line at once, before any training.
  const std::string blank = dir + "/blank.txt";
  std::ofstream(blank) << "\n  \n";
  CHECK(error_with([&](apps::LMOptions& o) { o.val_path = blank; })
            .find("train: the validation text (" + blank + ") is empty: give --val a file with text") != std::string::npos);
  CHECK(error_with([](apps::LMOptions& o) { o.batch = 100000; })
            .find("window(s) of --block 16: fewer than one batch (--batch 100000 needs 1600001 tokens); lower --block "
                  "or --batch") != std::string::npos);
  const std::string missing = dir + "/no_such_file.txt";
  std::string msg = error_with([&](apps::LMOptions& o) { o.train_path = missing; });
  CHECK(msg.find(missing) != std::string::npos);
  apps::LMOptions no_data = tiny_lm(missing, dir + "/run");
  CHECK_THROWS_AS(apps::train_language_model(no_data), Error);
  // A text shorter than one window.
  const std::string short_text = dir + "/short.txt";
  std::ofstream(short_text) << "ab\ncd\nef\n";
  CHECK(error_with([&](apps::LMOptions& o) {
          o.train_path = short_text, o.trainer.out_dir = dir + "/short";
        }).find("fewer than one window") != std::string::npos);
  // A run folder without a model.
  CHECK(error_of([&] { apps::load_language_model(dir + "/nothing"); }).find("model.safetensors") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("hf_tokenizer: a Llama 2-style tokenizer.model gives python3-sentencepiece's ids - tokenizer.json's bos and eos") {
  // tests/data/llama_spm/tokenizer.model and these ids: tools/reference/spm_ref.py (the reference
  // implementation, Debian's python3-sentencepiece 0.1.97).
  const std::string dir = std::string(TAPESTRY_SOURCE_DIR) + "/tests/data/llama_spm";
  std::unique_ptr<apps::LMTokenizer> tok = apps::hf_tokenizer(dir);
  CHECK(tok->name() == "hf-sentencepiece");
  CHECK(tok->vocab_size() == 400);
  CHECK(tok->bos() == 1);
  CHECK(tok->eos() == 2);
  const std::vector<std::pair<std::string, Ids>> cases = {
      {"Hello world", {351, 398, 353, 360, 300, 263, 302, 301}},
      {"A man in a blue shirt is standing on a ladder.",
       {268, 291, 271, 259, 267, 360, 367, 353, 348, 294, 342, 261, 285, 259, 351, 293, 363, 363, 277, 369}},
      {"  two  spaces and 12345 digits",
       {351, 351, 264, 323, 351, 262, 368, 352, 365, 309, 295, 351, 52, 53, 54, 55, 56, 287, 355, 362, 272, 359}},
      {"caf\xc3\xa9 na\xc3\xafve \xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x99\x82",
       {275, 352, 371, 198, 172, 351, 354, 352, 198, 178, 375, 353, 351, 231, 187, 153, 234, 152, 143, 351, 243, 162, 156,
        133}},
      {"tabs\tand\nnewlines", {264, 352, 370, 359, 12, 310, 13, 354, 353, 364, 360, 260, 309}},
      {"", {}},
      {"zzzz qqq xyz!?", {351, 389, 389, 389, 389, 351, 391, 391, 391, 351, 379, 373, 389, 36, 66}},
  };
  for (const auto& [text, ids] : cases) {
    INFO("text: \"", text, "\"");
    CHECK(tok->encode(text) == ids);
    Ids framed{tok->bos()};
    framed.insert(framed.end(), ids.begin(), ids.end());
    framed.push_back(tok->eos());
    CHECK(tok->decode(framed) == text);  // bos and eos decode to nothing
  }
  CHECK(error_of([] { apps::hf_tokenizer("/nonexistent"); }) ==
        "/nonexistent: no tokenizer.json or tokenizer.model (the model's tokenizer)");

  // Llama 3's directory: tokenizer.json with the bos and eos of tokenizer_config.json.
  const char* env = std::getenv("TAPESTRY_LLAMA3_DIR");
  const std::string llama3 = env ? env : std::string(std::getenv("HOME") ? std::getenv("HOME") : ".") +
                                             "/.cache/tapestry/llama3";
  if (!std::ifstream(llama3 + "/tokenizer_config.json").good())
    FAIL("Llama 3's tokenizer is not in ", llama3, ": run tools/get-llama3-tokenizer.sh");
  std::unique_ptr<apps::LMTokenizer> bpe = apps::hf_tokenizer(llama3);
  CHECK(bpe->name() == "hf-bpe");
  CHECK(bpe->vocab_size() == 128256);
  CHECK(bpe->bos() == 128000);  // <|begin_of_text|>
  CHECK(bpe->eos() == 128001);  // <|end_of_text|>
  CHECK(bpe->encode("Hello world") == Ids{9906, 1917});
  CHECK(bpe->decode({128000, 9906, 1917, 128001}) == "Hello world");
}
