// The option tables (apps/train/option_table.h): each task's flags, checks, config.toml and
// resume recipe come from one row per option.
#include <doctest/doctest.h>

#include <set>

#include "apps/tasks/copy_task.h"
#include "apps/tasks/language_model.h"
#include "apps/tasks/translation.h"
#include "tests/helpers.h"

using namespace tapestry;
using tapestry::testing::error_of;

TEST_CASE("option rows: values are parsed whole and checked, errors name the flag") {
  int64_t n = 3;
  uint64_t seed = 1;
  double rate = 0.5;
  std::string mode = "stop";
  bool pre = false, progress = true, resume = false;
  apps::OptionTable t("test");
  t.add("n", n, "a count").positive();
  t.add("seed", seed, "a seed");
  t.add("rate", rate, "a rate").at_least(0).below(1);
  t.add("mode", mode, "a mode").one_of({"stop", "skip"});
  t.add("norm", pre, "layer norm").one_of({"post", "pre"});
  t.add("no-progress", progress, "quiet").clears = true;
  t.add("resume", resume, "go on");

  t.row("n").set("12");
  CHECK(n == 12);
  for (const char* bad : {"0", "-3", "12abc", "", "1.5", "x"}) {
    INFO(bad);
    CHECK(error_of([&] { t.row("n").set(bad); }) == fmt::format("train: --n: must be a positive integer, got '{}'", bad));
  }
  CHECK(n == 12);  // a refused value changes nothing
  t.row("seed").set("18446744073709551615");
  CHECK(seed == UINT64_MAX);
  CHECK(error_of([&] { t.row("seed").set("-1"); }).find("--seed: must be an integer, got '-1'") != std::string::npos);
  for (const char* bad : {" -1", " 5", "+5", "1e3"}) {  // std::stoull alone skips spaces and wraps " -1" around
    INFO(bad);
    CHECK(error_of([&] { t.row("seed").set(bad); }).find("--seed: must be an integer") != std::string::npos);
  }
  CHECK(seed == UINT64_MAX);
  t.row("rate").set("0");
  CHECK(rate == 0);
  for (const char* bad : {"1", "nan", "inf", "-0.1", "0.5x"}) {
    INFO(bad);
    CHECK(error_of([&] { t.row("rate").set(bad); }) == fmt::format("train: --rate: must be a number in [0, 1), got '{}'", bad));
  }
  t.row("mode").set("skip");
  CHECK(mode == "skip");
  CHECK(error_of([&] { t.row("mode").set("maybe"); }) == "train: --mode: must be stop or skip, got 'maybe'");
  t.row("norm").set("pre");
  CHECK(pre);
  CHECK(t.row("norm").text() == "pre");
  CHECK(t.row("norm").takes_value());
  CHECK_FALSE(t.row("no-progress").takes_value());
  t.row("no-progress").set("true");
  CHECK_FALSE(progress);
  CHECK(t.row("no-progress").text() == "true");
  t.row("no-progress").set("false");  // `no-progress = false` in a config file
  CHECK(progress);
  CHECK(t.row("no-progress").text() == "false");
  t.row("resume").set("true");
  CHECK(resume);
  CHECK(t.find("nope") == nullptr);
  CHECK(error_of([&] { t.row("nope"); }).find("no row --nope") != std::string::npos);

  // check() holds what a library caller set to the same rules.
  t.check();
  rate = std::nan("");
  CHECK(error_of([&] { t.check(); }) == "train: --rate: must be a number in [0, 1), got 'nan'");
}

TEST_CASE("option tables: config.toml and the recipe come from the rows") {
  int64_t n = 3;
  double rate = 1;
  std::string path = "runs/x";
  bool pre = true, resume = true;
  apps::OptionTable t("test");
  t.add("n", n, "a count").positive().recipe();
  t.add("rate", rate, "a rate").recipe("learning_rate");
  t.add("out", path, "a folder");
  t.add("norm", pre, "layer norm").one_of({"post", "pre"}).recipe("pre_norm");
  t.add("resume", resume, "go on").this_run_only();
  CHECK(t.to_toml() ==
        "# tapestry train: read back with `tapestry train --config-file FILE`; flags override it\n"
        "task = \"test\"\nn = 3\nrate = 1.0\nout = \"runs/x\"\nnorm = \"pre\"\n");
  CHECK(t.recipe() == std::map<std::string, std::string>{{"n", "3"}, {"learning_rate", "1"}, {"pre_norm", "1"}});
  for (const char* bad : {"a\"b", "a\\b", "a#b", "a\nb"}) {  // CLI11's reader unescapes nothing; '#' starts a comment
    path = bad;
    CHECK(error_of([&] { t.to_toml(); }).find("which config.toml cannot hold") != std::string::npos);
  }
  path = "";  // an empty text is a value: `out = ""`
  CHECK(t.to_toml().find("out = \"\"\n") != std::string::npos);
}

TEST_CASE("the tasks' tables: one row per flag, each with help - the recipes resume compares") {
  apps::CopyTaskOptions copy;
  apps::TranslationOptions mt;
  apps::LMOptions lm;
  for (const apps::OptionTable& t : {apps::options_table(copy), apps::options_table(mt), apps::options_table(lm)}) {
    INFO(t.task());
    std::set<std::string> flags;
    for (const apps::OptionRow& row : t.rows()) {
      INFO(row.flag);
      CHECK(flags.insert(row.flag).second);
      CHECK_FALSE(row.help.empty());
      row.check_value();  // the defaults are values the rows take
    }
  }
  // The keys older checkpoints recorded (a resumed run compares them).
  auto mt_recipe = apps::options_table(mt).recipe();
  CHECK(mt_recipe == std::map<std::string, std::string>{{"config", "small"}, {"pre_norm", "0"}, {"max_tokens", "2048"},
                                                        {"accumulate", "1"}, {"seed", "1"}, {"limit", "0"}});
  auto lm_recipe = apps::options_table(lm).recipe();
  // ... and "model", which older LM checkpoints lack: the task's recipe_defaults reads them as "gpt";
  // and the fine-tuning keys, which older checkpoints lack too (an absent key passes).
  CHECK(lm_recipe == std::map<std::string, std::string>{{"config", "mini"}, {"block", "64"}, {"batch", "32"},
                                                        {"epochs", "8"}, {"seed", "1"}, {"limit", "0"},
                                                        {"model", "gpt"}, {"base", ""}, {"lora_rank", "0"},
                                                        {"lora_alpha", "16"}, {"lora_targets", "q,v"}});
  // A Trainer option set through a task's table lands in the task's TrainerOptions.
  apps::OptionTable mt_table = apps::options_table(mt);
  mt_table.row("epochs").set("3");
  mt_table.row("out").set("/tmp/run");
  mt_table.row("no-progress").set("true");
  CHECK(mt.trainer.epochs == 3);
  CHECK(mt.trainer.out_dir == "/tmp/run");
  CHECK_FALSE(mt.trainer.progress);
  // The quick recipe changes defaults only.
  apps::TranslationOptions quick = apps::quick_translation_options();
  CHECK(quick.trainer.epochs == 2);
  CHECK(quick.trainer.average == 0);
  CHECK(quick.trainer.out_dir == "runs/multi30k-quick");
  CHECK(quick.eval_limit == 300);
  CHECK(quick.beam == 1);
  CHECK(quick.config == mt.config);
}
