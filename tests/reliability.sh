#!/usr/bin/env bash
# Bad inputs and hostile runs through the command line (issue 9), one case per function. Each
# case states what a user does and checks what they see: one clear line and a non-zero exit, or a
# run that resumes. docs/reliability.md lists them all.
#   tests/reliability.sh TAPESTRY_BINARY CASE   # CASE: a function name below, or "all"
set -uo pipefail
bin=$1
case_name=${2:-all}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

fail() { echo "FAIL [$current]: $*"; failures=$((failures + 1)); }

# A small deterministic German/English corpus: train, val and test splits in DIR.
make_corpus() {
  local dir=$1 n=${2:-240}
  mkdir -p "$dir"
  local de=(Hund Katze Mann Frau Kind Vogel) en=(dog cat man woman child bird)
  local vde=(läuft schläft spielt singt) ven=(runs sleeps plays sings)
  for split in train val test_2016_flickr; do
    local count=$n
    [[ $split != train ]] && count=20
    : > "$dir/$split.de"
    : > "$dir/$split.en"
    for ((i = 0; i < count; i++)); do
      local a=$(((i * 7 + ${#split}) % 6)) b=$(((i * 5 + 1) % 4)) c=$((i % 9))
      echo "ein ${de[$a]} ${vde[$b]} $c mal ." >> "$dir/$split.de"
      echo "a ${en[$a]} ${ven[$b]} $c times ." >> "$dir/$split.en"
    done
  done
}

# The tiny recipe every case trains with: seconds per run.
tiny_args=(train --task multi30k --config tiny --vocab-size 60 --max-tokens 256 --epochs 2 --warmup 20 --eval-limit 10
  --beam 1 --average 0 --threads 1)
tiny() { "$bin" "${tiny_args[@]}" "$@"; }
# The same in a background job: `exec` makes $! the tapestry process itself, so that signals
# and kill -9 reach it rather than a subshell around it.
tiny_bg() { exec "$bin" "${tiny_args[@]}" "$@"; }

# expect_error "TEXT" CMD...: CMD exits non-zero and says TEXT on stderr, in one line, not an abort.
expect_error() {
  local text=$1
  shift
  "$@" > "$work/out" 2> "$work/err"
  local rc=$?
  if [[ $rc -eq 0 ]]; then fail "expected an error containing '$text', got exit 0"; return; fi
  if [[ $rc -ge 128 ]]; then fail "crashed (exit $rc): $(tail -3 "$work/err")"; return; fi
  grep -qF -- "$text" "$work/err" || fail "expected '$text' in: $(tail -3 "$work/err")"
}

truncated_gz_corpus() {  # A train.de.gz cut in half was read as a shorter corpus.
  make_corpus "$work/gz" 2000
  gzip -9 "$work/gz/train.de"
  local size
  size=$(stat -c %s "$work/gz/train.de.gz")
  head -c $((size / 2)) "$work/gz/train.de.gz" > "$work/gz/cut" && mv "$work/gz/cut" "$work/gz/train.de.gz"
  expect_error "train.de.gz: the compressed file is truncated" tiny --data "$work/gz" --out "$work/gz/run"
}

truncated_gz_bleu_reference() {  # `tapestry bleu` on a truncated reference scored 99.44 with exit 0.
  seq 1 3000 | sed 's/^/a sentence number /' > "$work/ref"
  cp "$work/ref" "$work/hyp"
  gzip -9 "$work/ref"
  local size
  size=$(stat -c %s "$work/ref.gz")
  head -c $((size / 2)) "$work/ref.gz" > "$work/ref_cut.gz"
  expect_error "truncated or damaged" "$bin" bleu --ref "$work/ref_cut.gz" --hyp "$work/hyp"
}

dev_zero_corpus() {  # train.de -> /dev/zero gave an uncaught bad_alloc.
  make_corpus "$work/zero"
  rm "$work/zero/train.de"
  ln -s /dev/zero "$work/zero/train.de"
  expect_error "train.de:1: line longer than" tiny --data "$work/zero" --out "$work/zero/run"
}

megabyte_line() {  # A 1 MB line failed only after training started, naming no file or line.
  make_corpus "$work/long"
  { for _ in $(seq 42000); do printf 'ein Hund läuft 3 mal . '; done; echo; } > "$work/long/line"  # ~1 MB
  # Line 6 becomes the long one; the line counts stay aligned.
  awk -v f="$work/long/line" 'NR == 6 { getline l < f; print l; next } { print }' "$work/long/train.de" > "$work/long/x"
  mv "$work/long/x" "$work/long/train.de"
  expect_error "train.de:6: the sentence is" tiny --data "$work/long" --out "$work/long/run"
  [[ ! -e "$work/long/run/checkpoint.safetensors" ]] || fail "a checkpoint was written"
}

full_disk_subwords() {  # A full disk during subword training left a torn spm.model that broke every later run.
  make_corpus "$work/full"
  # A file-size limit stands in for a full disk: writes past 64 KiB fail (EFBIG; SIGXFSZ ignored).
  (trap '' XFSZ; ulimit -f 64; tiny_bg --epochs 1 --data "$work/full" --out "$work/full/run") > "$work/out" 2> "$work/err"
  local rc=$?
  [[ $rc -ne 0 && $rc -lt 128 ]] || fail "expected a clean error on a full disk, got exit $rc"
  grep -qE "subword|save" "$work/err" || fail "no word of the failed write: $(tail -2 "$work/err")"
  echo "full disk: $(tail -1 "$work/err")"
  [[ ! -e "$work/full/run/spm.recipe" ]] || fail "spm.recipe written for a failed subword model"
  tiny --data "$work/full" --out "$work/full/run" --epochs 1 --resume > "$work/out" 2>&1 ||
    fail "the next run in that folder failed: $(tail -2 "$work/out")"
}

nan_learning_rate_flags() {  # --lr-factor nan, --lr-factor -1 and --alpha nan passed the command line.
  expect_error "--lr-factor: must be a number > 0, got 'nan'" tiny --lr-factor nan --print-config
  expect_error "--lr-factor: must be a number > 0, got '-1'" tiny --lr-factor -1 --print-config
  expect_error "--alpha: must be a number >= 0, got 'nan'" tiny --alpha nan --print-config
  expect_error "--dropout: must be a number in [0, 1), got 'nan'" tiny --dropout nan --print-config
  expect_error "--clip-norm: must be a number >= 0, got 'inf'" tiny --clip-norm inf --print-config
  expect_error "--on-nan" tiny --on-nan maybe --print-config
}

diverging_run_stops() {  # --lr-factor 1e30 trained to the end with exit 0 and NaN checkpoints.
  make_corpus "$work/nan"
  expect_error "non-finite loss" tiny --data "$work/nan" --out "$work/nan/run" --lr-factor 1e30
  grep -q "stopped before saving anything" "$work/err" || fail "no word that nothing was saved"
  [[ ! -e "$work/nan/run/checkpoint.safetensors" && ! -e "$work/nan/run/model.safetensors" ]] ||
    fail "a diverged run saved weights"
  # --on-nan skip: the steps are skipped and counted, and the run goes on.
  tiny --data "$work/nan" --out "$work/nan/skip" --lr-factor 1e30 --on-nan skip --epochs 1 > "$work/out" 2> "$work/err" ||
    fail "--on-nan skip: exit $?"
  grep -q "train: skipped a non-finite loss" "$work/err" || fail "--on-nan skip: no skipped step reported"
  grep -q "steps skipped so far" "$work/out" || fail "--on-nan skip: the epoch line does not count them"
}

detect_anomaly_names_the_op() {  # --detect-anomaly names the op where NaN/inf first appear.
  make_corpus "$work/anom"
  expect_error "detect_anomaly: " tiny --data "$work/anom" --out "$work/anom/run" --lr-factor 1e30 --detect-anomaly
  grep -qE "detect_anomaly: (the forward of the op recorded as [A-Za-z]+Backward|[A-Za-z]+Backward returned)" "$work/err" ||
    fail "no op named: $(cat "$work/err")"
}

existing_run_folder() {  # Training into a run folder without --resume overwrote its checkpoints.
  make_corpus "$work/folder"
  tiny --data "$work/folder" --out "$work/folder/run" --epochs 1 > /dev/null 2>&1 || fail "first run failed"
  local before
  before=$(md5sum < "$work/folder/run/checkpoint.safetensors")
  expect_error "already holds a run; pass --resume to continue it, or --overwrite" \
    tiny --data "$work/folder" --out "$work/folder/run" --epochs 1
  [[ $(md5sum < "$work/folder/run/checkpoint.safetensors") == "$before" ]] || fail "the refused run touched the checkpoint"
  expect_error "contradict" tiny --data "$work/folder" --out "$work/folder/run" --resume --overwrite
  # --overwrite starts over, with a new subword model for the new --vocab-size.
  tiny --data "$work/folder" --out "$work/folder/run" --epochs 1 --overwrite --vocab-size 50 > "$work/out" 2>&1 ||
    fail "--overwrite failed: $(tail -2 "$work/out")"
  grep -q "vocab_size = 50" "$work/folder/run/spm.recipe" || fail "spm.model was not retrained for --vocab-size 50"
}

two_runs_one_folder() {  # Two trainings into one folder at once both "succeeded", files mixed.
  make_corpus "$work/lock" 2000
  tiny_bg --data "$work/lock" --out "$work/lock/run" --epochs 50 > "$work/first.log" 2>&1 &
  local first=$!
  for _ in $(seq 300); do grep -q "^epoch  1 \[" "$work/first.log" 2>/dev/null && break; sleep 0.1; done
  expect_error "is in use by another run (pid $first)" tiny --data "$work/lock" --out "$work/lock/run" --resume
  kill -INT $first
  wait $first
  local rc=$?
  [[ $rc -eq 130 ]] || fail "SIGINT: expected exit 130, got $rc: $(tail -2 "$work/first.log")"
  grep -q "SIGINT: stopped after step" "$work/first.log" || fail "SIGINT: no message"
  grep -q '\.tmp\.' < <(ls "$work/lock/run") && fail "temp files left behind"
  tiny --data "$work/lock" --out "$work/lock/run" --epochs 1 --resume > "$work/out" 2>&1 ||
    fail "resume after SIGINT failed: $(tail -2 "$work/out")"
  grep -q "^resume: from" "$work/out" || fail "did not resume"
}

sigterm_saves() {  # No signal handler: SIGTERM lost the work since the last epoch.
  make_corpus "$work/term" 2000
  tiny_bg --data "$work/term" --out "$work/term/run" --epochs 50 > "$work/term.log" 2>&1 &
  local pid=$!
  for _ in $(seq 300); do grep -q "^epoch  1 \[" "$work/term.log" 2>/dev/null && break; sleep 0.1; done
  kill -TERM $pid
  wait $pid
  local rc=$?
  [[ $rc -eq 143 ]] || fail "SIGTERM: expected exit 143, got $rc"
  [[ -e "$work/term/run/checkpoint.safetensors" ]] || fail "SIGTERM: no checkpoint"
}

damaged_checkpoint_metadata() {  # step/epoch that do not parse gave an uncaught std::invalid_argument.
  make_corpus "$work/meta"
  tiny --data "$work/meta" --out "$work/meta/run" --epochs 1 > /dev/null 2>&1 || fail "run failed"
  # Same length, so the header stays valid JSON of the same size: only the value is bad.
  sed -i 's/"step":"\([0-9]\)/"step":"x/' "$work/meta/run/checkpoint.safetensors"
  expect_error "'step' is 'x" tiny --data "$work/meta" --out "$work/meta/run" --resume
}

flipped_checkpoint_byte() {  # Flipped data bytes were loaded.
  make_corpus "$work/flip"
  tiny --data "$work/flip" --out "$work/flip/run" --epochs 1 > /dev/null 2>&1 || fail "run failed"
  local f="$work/flip/run/checkpoint.safetensors" size
  size=$(stat -c %s "$f")
  printf '\x55' | dd of="$f" bs=1 seek=$((size - 100)) conv=notrunc 2> /dev/null
  expect_error "checksum mismatch" tiny --data "$work/flip" --out "$work/flip/run" --resume
}

directory_as_weights() {  # A directory named model.safetensors gave an uncaught std::ios_failure.
  mkdir -p "$work/dir/run/model.safetensors"
  echo x > "$work/dir/run/spm.model"
  expect_error "model.safetensors is not a regular file" "$bin" translate --checkpoint "$work/dir/run" --input /dev/null
}

stale_temp_files() {  # *.tmp.PID files were left behind for good.
  make_corpus "$work/stale"
  mkdir -p "$work/stale/run"
  echo partial > "$work/stale/run/checkpoint.safetensors.tmp.99999"
  tiny --data "$work/stale" --out "$work/stale/run" --epochs 1 --resume > "$work/out" 2>&1 || fail "run failed"
  grep -q "removed .*checkpoint.safetensors.tmp.99999" "$work/out" || fail "no word of the removed temp file"
  [[ ! -e "$work/stale/run/checkpoint.safetensors.tmp.99999" ]] || fail "stale temp file still there"
}

# Random kill -9s (--save-every 1: a save at every step, so many land mid-write), each followed
# by --resume, until the run finishes: every resume must work, and the final weights must equal
# an uninterrupted run's to the bit. KILLS (default 50) sets how many kills.
kill_loop() {
  make_corpus "$work/kill" 400
  local args=(--data "$work/kill" --save-every 1 --epochs 40)  # about 25 s of training: room for 50 kills
  tiny "${args[@]}" --out "$work/kill/straight" > /dev/null 2>&1 || { fail "uninterrupted run failed"; return; }
  local kills=0 resumes=0 target=${KILLS:-50} done=0
  RANDOM=7
  while [[ $done -eq 0 ]]; do
    tiny_bg "${args[@]}" --out "$work/kill/killed" --resume > "$work/kill.log" 2>&1 &
    local pid=$!
    if [[ $kills -lt $target ]]; then
      sleep "0.$(printf '%03d' $((RANDOM % 500 + 150)))"  # 0.15-0.65 s: past start-up, into the steps
      if kill -9 $pid 2> /dev/null; then kills=$((kills + 1)); fi
    fi
    wait $pid
    local rc=$?
    if [[ $rc -eq 0 ]]; then
      done=1
    elif [[ $rc -ne 137 ]]; then
      fail "run after $kills kills exited $rc: $(tail -3 "$work/kill.log")"
      return
    fi
    grep -q "^resume: from" "$work/kill.log" && resumes=$((resumes + 1))
  done
  cmp -s "$work/kill/straight/model.safetensors" "$work/kill/killed/model.safetensors" ||
    fail "after $kills kills the final weights differ from the uninterrupted run's"
  cmp -s "$work/kill/straight/checkpoint.safetensors" "$work/kill/killed/checkpoint.safetensors" ||
    fail "after $kills kills the final checkpoint differs from the uninterrupted run's"
  [[ $kills -ge $target ]] || fail "only $kills of $target kills landed before the run finished"
  echo "kill loop: $kills kill -9s, $resumes resumes from a checkpoint, final weights identical to the bit"
}

all_cases=(truncated_gz_corpus truncated_gz_bleu_reference dev_zero_corpus megabyte_line full_disk_subwords nan_learning_rate_flags
  diverging_run_stops detect_anomaly_names_the_op existing_run_folder two_runs_one_folder sigterm_saves
  damaged_checkpoint_metadata flipped_checkpoint_byte directory_as_weights stale_temp_files kill_loop)
cases=("$case_name")
[[ $case_name == all ]] && cases=("${all_cases[@]}")
for current in "${cases[@]}"; do
  before=$failures
  "$current"
  [[ $failures -eq $before ]] && echo "ok: $current"
done
[[ $failures -eq 0 ]] || { echo "$failures failure(s)"; exit 1; }
