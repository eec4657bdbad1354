#!/usr/bin/env bash
# Sourced by the command-line tests (tests/image_cli.sh, tests/text_cli.sh), which set `bin` (the
# tapestry binary), `tmp` (their scratch folder) and `name` (for messages) first.
fail() { echo "$name: FAIL: $*"; exit 1; }

# expect_refused CASE PATTERN ARGS...: `tapestry train ARGS` into a fresh run folder must exit 1
# with one line on stderr matching PATTERN, and write no run folder.
expect_refused() {
  local case="$1" pattern="$2"
  shift 2
  set +e
  "$bin" train "$@" --out "$tmp/run_$case" --no-progress > "$tmp/out" 2> "$tmp/err"
  local rc=$?
  set -e
  [ "$rc" -eq 1 ] || fail "$case: exit status $rc, expected 1 ($(cat "$tmp/err"))"
  [ "$(wc -l < "$tmp/err")" -eq 1 ] || fail "$case: expected one line on stderr, got: $(cat "$tmp/err")"
  grep -q -- "$pattern" "$tmp/err" || fail "$case: stderr does not match '$pattern': $(cat "$tmp/err")"
  [ ! -e "$tmp/run_$case" ] || fail "$case: a run folder was written"
  echo "$name: $case: $(cat "$tmp/err")"
}
