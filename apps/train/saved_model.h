// A model a task saved (DIR/model.safetensors, written by the Trainer with the task's metadata),
// read back for inference or fine-tuning: the metadata's keys checked and parsed, every error
// one line naming the file. The loaders of the tasks (load_language_model,
// load_image_classifier, load_text_classifier) read through it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tapestry/nn/safetensors.h"

namespace tapestry::apps {

struct SavedModel {
  std::string path;          // DIR/model.safetensors
  nn::SafetensorsFile file;  // its tensors and metadata
  std::string kind;          // what it should be, for errors: "a language model"
  std::string meta(const char* key) const;  // throws when the key is absent
  int64_t num(const char* key) const;       // ... or not an integer
  double real(const char* key) const;       // ... or not a number
};

// DIR/model.safetensors, whose metadata "task" must be one of `tasks`; `kind` names what it
// should be and `train_command` how to make one, for the errors.
SavedModel read_saved_model(const std::string& dir, const std::vector<std::string>& tasks, const std::string& kind,
                            const std::string& train_command);

}  // namespace tapestry::apps
