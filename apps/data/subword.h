// Subwords through SentencePiece (Debian's libsentencepiece): a joint unigram model trained on
// both sides of the training text, with fixed special ids pad 0, unk 1, bos 2, eos 3.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace tapestry::apps {

class Subword {
 public:
  static constexpr int64_t kPad = 0, kUnk = 1, kBos = 2, kEos = 3;
  // Trains a model of `vocab_size` pieces on `sentences` and writes it to model_path (through a
  // temp file and rename). Throws a tapestry::Error with SentencePiece's message on failure.
  static void train(const std::vector<std::string>& sentences, const std::string& model_path, int64_t vocab_size,
                    uint64_t seed = 1);
  // A run folder's subword model: trains DIR/spm.model from sentences() unless it is there with a
  // DIR/spm.recipe that records the same vocab_size, limit, seed and data, then writes that
  // recipe; a model trained from anything else is trained again. Returns the model's path.
  static std::string train_in_folder(const std::string& dir, int64_t vocab_size, int64_t limit, uint64_t seed,
                                     const std::string& data,
                                     const std::function<std::vector<std::string>()>& sentences);
  explicit Subword(const std::string& model_path);
  ~Subword();
  std::vector<int64_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int64_t>& ids) const;  // drops the special ids
  // Every id as the model itself decodes it (control ids such as bos and eos give nothing): for
  // models made elsewhere (a Llama's tokenizer.model), whose ids are not laid out as train() lays them.
  std::string decode_any(const std::vector<int64_t>& ids) const;
  int64_t bos_id() const;  // the model's own (-1: none)
  int64_t eos_id() const;
  std::vector<std::string> pieces(const std::string& text) const;
  std::string piece(int64_t id) const;  // the piece an id stands for ("<s>", "</s>" for bos, eos)
  int64_t vocab_size() const;

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
};

}  // namespace tapestry::apps
