// SentencePiece wrapper (see subword.h).
#include "apps/data/subword.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "tapestry/ops/file.h"
#include "tapestry/dist/dist.h"
#include "tapestry/ops/error.h"

namespace tapestry::apps {

std::string Subword::train_in_folder(const std::string& dir, int64_t vocab_size, int64_t limit, uint64_t seed,
                                     const std::string& data,
                                     const std::function<std::vector<std::string>()>& sentences) {
  const std::string path = dir + "/spm.model", recipe_path = dir + "/spm.recipe";
  const std::string recipe =
      fmt::format("vocab_size = {}\nlimit = {}\nseed = {}\ndata = {}\n", vocab_size, limit, seed, data);
  // Under mpirun rank 0 alone trains and writes the model; the others wait for it, then read it.
  if (dist::is_main()) {
    std::error_code ec;
    bool current = false;
    if (std::filesystem::is_regular_file(path, ec) && std::filesystem::is_regular_file(recipe_path, ec)) {
      std::ifstream in(recipe_path);
      const std::string recorded((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      current = recorded == recipe;
    }
    if (!current) {
      std::filesystem::remove(recipe_path, ec);
      train(sentences(), path, vocab_size, seed);
      write_file_atomic(recipe_path, recipe);
    }
  }
  dist::barrier();
  return path;
}

void Subword::train(const std::vector<std::string>& sentences, const std::string& model_path, int64_t vocab_size,
                    uint64_t seed) {
  TP_CHECK(!sentences.empty(), "subword: no sentences to train on");
  std::string prefix = model_path + ".tmp." + std::to_string(::getpid());
  std::string input = prefix + ".txt";
  {
    std::ofstream out(input);
    for (const auto& s : sentences) out << s << '\n';
    out.flush();
    if (!out.good()) {
      out.close();
      std::remove(input.c_str());
      throw Error(fmt::format("subword: cannot write {} (disk full?)", input));
    }
  }
  std::string args = fmt::format(
      "--input={} --model_prefix={} --vocab_size={} --model_type=unigram --character_coverage=1.0 "
      "--pad_id=0 --unk_id=1 --bos_id=2 --eos_id=3 --num_threads=2 --minloglevel=2 "
      "--hard_vocab_limit=false",
      input, prefix, vocab_size);
  (void)seed;  // 0.1.97 has no seed flag; its sampling is fixed, so the model is reproducible
  auto status = sentencepiece::SentencePieceTrainer::Train(args);
  std::remove(input.c_str());
  std::remove((prefix + ".vocab").c_str());
  const std::string trained = prefix + ".model";
  if (!status.ok()) {
    std::remove(trained.c_str());
    throw Error(fmt::format("subword: SentencePiece training failed: {}", status.ToString()));
  }
  // A full disk can leave a torn model file behind a successful status: the model must load
  // before it replaces model_path, which then happens in one rename (with fsync).
  std::string bytes;
  {
    std::ifstream in(trained, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  sentencepiece::SentencePieceProcessor check;
  auto loaded = check.LoadFromSerializedProto(bytes);
  std::remove(trained.c_str());
  TP_CHECK(loaded.ok(), "subword: the trained model does not load ({}); nothing was written to {}", loaded.ToString(),
           model_path);
  write_file_atomic(model_path, bytes);
}

Subword::Subword(const std::string& model_path) : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  auto status = sp_->Load(model_path);
  TP_CHECK(status.ok(), "subword: cannot load {}: {}", model_path, status.ToString());
}

Subword::~Subword() = default;

std::vector<int64_t> Subword::encode(const std::string& text) const {
  std::vector<int> ids;
  sp_->Encode(text, &ids);
  return std::vector<int64_t>(ids.begin(), ids.end());
}

std::string Subword::decode(const std::vector<int64_t>& ids) const {
  std::vector<int64_t> keep;
  for (int64_t id : ids)
    if (id > kEos && id < vocab_size()) keep.push_back(id);
  return decode_any(keep);
}

std::string Subword::decode_any(const std::vector<int64_t>& ids) const {
  std::vector<int> all;
  for (int64_t id : ids) {
    TP_CHECK(id >= 0 && id < vocab_size(), "subword: id {} is outside the vocabulary of {}", id, vocab_size());
    all.push_back(static_cast<int>(id));
  }
  std::string text;
  sp_->Decode(all, &text);
  return text;
}

int64_t Subword::bos_id() const { return sp_->bos_id(); }
int64_t Subword::eos_id() const { return sp_->eos_id(); }

std::vector<std::string> Subword::pieces(const std::string& text) const {
  std::vector<std::string> p;
  sp_->Encode(text, &p);
  return p;
}

std::string Subword::piece(int64_t id) const {
  TP_CHECK(id >= 0 && id < vocab_size(), "subword: id {} is outside the vocabulary of {}", id, vocab_size());
  return sp_->IdToPiece(static_cast<int>(id));
}

int64_t Subword::vocab_size() const { return sp_->GetPieceSize(); }

}  // namespace tapestry::apps
