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

namespace {

// The whole of `text` as a number by `parse` (std::stoll or std::stod), else an Error naming the key.
template <class Parse>
auto parse_all(const std::string& path, const char* key, const std::string& text, Parse parse) {
  try {
    size_t used = 0;
    const auto v = parse(text, &used);
    if (used == text.size()) return v;
  } catch (const std::logic_error&) {
  }
  throw Error(fmt::format("{}: metadata '{}' is not a number: '{}'", path, key, text));
}

}  // namespace

int64_t SavedModel::num(const char* key) const {
  return parse_all(path, key, meta(key), [](const std::string& t, size_t* used) { return std::stoll(t, used); });
}

double SavedModel::real(const char* key) const {
  return parse_all(path, key, meta(key), [](const std::string& t, size_t* used) { return std::stod(t, used); });
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
