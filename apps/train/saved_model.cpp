// Reading a task's saved model (see saved_model.h).
#include "apps/train/saved_model.h"

#include <algorithm>
#include <stdexcept>

#include "apps/train/run_dir.h"
#include "tapestry/ops/error.h"

namespace tapestry::apps {

std::string SavedModel::meta(const char* key) const {
  auto it = file.metadata.find(key);
  TP_CHECK(it != file.metadata.end(), "{} records no '{}' (not {} written by tapestry train)", path, key, kind);
  return it->second;
}

int64_t SavedModel::num(const char* key) const {
  const std::string text = meta(key);
  try {
    size_t used = 0;
    const int64_t v = std::stoll(text, &used);
    if (used == text.size()) return v;
  } catch (const std::logic_error&) {
  }
  TP_CHECK(false, "{}: metadata '{}' is not a number: '{}'", path, key, text);
  return 0;
}

double SavedModel::real(const char* key) const {
  const std::string text = meta(key);
  try {
    size_t used = 0;
    const double v = std::stod(text, &used);
    if (used == text.size()) return v;
  } catch (const std::logic_error&) {
  }
  TP_CHECK(false, "{}: metadata '{}' is not a number: '{}'", path, key, text);
  return 0;
}

SavedModel read_saved_model(const std::string& dir, const std::vector<std::string>& tasks, const std::string& kind,
                            const std::string& train_command) {
  SavedModel s;
  s.path = dir + "/model.safetensors";
  s.kind = kind;
  TP_CHECK(file_exists(s.path), "{} not found (train with `{} --out {}`)", s.path, train_command, dir);
  s.file = nn::load_safetensors(s.path);
  const std::string task = s.meta("task");
  TP_CHECK(std::find(tasks.begin(), tasks.end(), task) != tasks.end(), "{} is not {} (task '{}')", s.path, kind, task);
  return s;
}

}  // namespace tapestry::apps
