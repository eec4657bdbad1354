#!/bin/bash
# The ctest `task_registry`: a task added as a user adds one (tests/toy_regression_task.cpp, one
# file and one register_task line) is a task of the command line like the built-in ones: listed
# in the help, its flags checked, its config printed, trained into a run folder, resumed.
# Usage: tests/task_registry.sh BUILD_DIR
set -u
tp="$1/toy_task_cli"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "task_registry: FAIL: $*"; exit 1; }
"$tp" train --help >"$work/help" 2>&1 || fail "train --help exited $?"
grep -q "or regression (least squares, the task a test adds)" "$work/help" || fail "--task's help does not list regression"
grep -q -- "--samples INT" "$work/help" || fail "the help has no --samples"
"$tp" train --task regression --print-config >"$work/config" 2>&1 || fail "--print-config exited $?"
grep -q '^task = "regression"' "$work/config" && grep -q '^samples = 512' "$work/config" || fail "--print-config: $(cat "$work/config")"
"$tp" train --task regression --beam 2 >"$work/bad" 2>&1 && fail "--beam was taken"
grep -q "train: --beam is not an option of --task regression" "$work/bad" || fail "--beam: $(cat "$work/bad")"
"$tp" train --task regression --lr -1 >"$work/bad" 2>&1 && fail "--lr -1 was taken"
grep -q "train: --lr: must be a number > 0, got '-1'" "$work/bad" || fail "--lr -1: $(cat "$work/bad")"
"$tp" train --task regression --quick >"$work/bad" 2>&1 && fail "--quick was taken"
grep -q "train: --quick is a recipe of --task multi30k" "$work/bad" || fail "--quick: $(cat "$work/bad")"
run=(train --task regression --out "$work/run" --threads 1 --no-progress)
"$tp" "${run[@]}" --epochs 4 >"$work/log" 2>&1 || fail "training exited $?: $(tail -3 "$work/log")"
grep -q "^final: val MSE" "$work/log" || fail "no final line: $(tail -3 "$work/log")"
for f in config.toml model.safetensors checkpoint.safetensors curves.svg; do
  [ -s "$work/run/$f" ] || fail "the run folder has no $f: $(ls "$work/run")"
done
"$tp" train --config-file "$work/run/config.toml" --out "$work/run" --threads 1 --no-progress --epochs 6 --resume \
  >"$work/resumed" 2>&1 || fail "resume exited $?: $(tail -3 "$work/resumed")"
grep -q "epoch 6" "$work/resumed" || fail "the resumed run did not reach epoch 6: $(tail -3 "$work/resumed")"
echo "task_registry: ok ($(grep '^final' "$work/resumed"))"
