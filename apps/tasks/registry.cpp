// The built-in training tasks, one line each, in the order `tapestry train --help` lists them.
// Each line names the function of a task's own file that makes it (apps/tasks/*.cpp, through
// make_task); a new task is that file and one line here.
#include <algorithm>

#include "apps/tasks/task.h"
#include "tapestry/ops/error.h"

#define TAPESTRY_BUILTIN_TASKS(X) \
  X(copy_task)                    \
  X(translation_task)             \
  X(language_model_task)          \
  X(image_task)                   \
  X(mlm_task)                     \
  X(classify_task)

namespace tapestry::apps {

#define TAPESTRY_DECLARE_TASK(make) Task make();
TAPESTRY_BUILTIN_TASKS(TAPESTRY_DECLARE_TASK)
#undef TAPESTRY_DECLARE_TASK

namespace {

std::deque<Task>& registry() {
  static std::deque<Task> all = [] {
    std::deque<Task> builtin;
#define TAPESTRY_ADD_TASK(make) builtin.push_back(make());
    TAPESTRY_BUILTIN_TASKS(TAPESTRY_ADD_TASK)
#undef TAPESTRY_ADD_TASK
    return builtin;
  }();
  return all;
}

}  // namespace

const std::deque<Task>& tasks() { return registry(); }

void register_task(Task task) {
  std::deque<Task>& all = registry();
  TP_CHECK(!task.name.empty() && task.make, "register_task: a task needs a name and a make function");
  TP_CHECK(std::none_of(all.begin(), all.end(), [&](const Task& t) { return t.name == task.name; }),
           "register_task: a task named '{}' is already registered", task.name);
  all.push_back(std::move(task));
}

}  // namespace tapestry::apps
