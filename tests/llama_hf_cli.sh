#!/usr/bin/env bash
# `tapestry generate --hf DIR` end to end on a Hugging Face Llama directory: a tiny random Llama
# (tools/reference/llama_ref.py write-hf, 400 tokens, three bfloat16 shards) with the SentencePiece
# fixture tests/data/llama_spm/tokenizer.model (Llama 2's layout: unk 0, bos 1, eos 2):
# 1. greedy generation streams the prompt and a continuation, exit 0, and is the same twice;
# 2. a tokenizer of another size than config.json's vocab_size, a missing shard, no tokenizer:
#    one line naming the file, exit status 1;
# 3. LoRA fine-tuning from the directory (train --task lm --base DIR --lora-rank R --merge): the
#    adapters saved alone, the base's files unchanged, the adapter run and its merged Hugging Face
#    directory generating the same text, and the peak memory of LoRA below full fine-tuning's on a
#    larger random Llama (12M parameters).
#   tests/llama_hf_cli.sh TAPESTRY_BINARY [sanitized]   (sanitized: skip the peak-RSS check, which
#   AddressSanitizer's shadow memory and quarantine would decide)
set -euo pipefail
bin="$1"
sanitized="${2:-}"
here="$(cd "$(dirname "$0")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "llama_hf_cli: FAIL: $*"; exit 1; }
ref="$here/tools/reference/llama_ref.py"
OMP_NUM_THREADS=1 /usr/bin/python3 "$ref" write-hf "$tmp/llama" --vocab 400 --dtype BF16 --shards 3 --seed 4
cp "$here/tests/data/llama_spm/tokenizer.model" "$tmp/llama/"

out="$("$bin" generate --hf "$tmp/llama" --prompt "A man in a" --max-new 12 --greedy --threads 1)"
[ "${out#A man in a}" != "$out" ] || fail "the output does not start with the prompt: $out"
[ "${#out}" -gt 10 ] || fail "nothing was generated: $out"
again="$("$bin" generate --hf "$tmp/llama" --prompt "A man in a" --max-new 12 --greedy --threads 1)"
[ "$out" = "$again" ] || fail "greedy generation differs between runs: '$out' vs '$again'"
echo "llama_hf_cli: generated: $out"

expect_error() {  # NAME PATTERN DIR
  set +e
  "$bin" generate --hf "$3" --prompt "A man" --max-new 3 > "$tmp/out" 2> "$tmp/err"
  local rc=$?
  set -e
  [ "$rc" -eq 1 ] || fail "$1: exit status $rc, expected 1 ($(cat "$tmp/err"))"
  [ "$(wc -l < "$tmp/err")" -eq 1 ] || fail "$1: expected one line on stderr, got: $(cat "$tmp/err")"
  grep -q -- "$2" "$tmp/err" || fail "$1: stderr does not match '$2': $(cat "$tmp/err")"
  echo "llama_hf_cli: $1: $(cat "$tmp/err")"
}
OMP_NUM_THREADS=1 /usr/bin/python3 "$ref" write-hf "$tmp/small" --vocab 300
cp "$here/tests/data/llama_spm/tokenizer.model" "$tmp/small/"
expect_error "vocabulary mismatch" "has 400 tokens but config.json's vocab_size is 300" "$tmp/small"
# Weights holding a NaN printed garbage and exited 0 (issue 44): refused, naming the tensor.
OMP_NUM_THREADS=1 /usr/bin/python3 "$ref" write-hf "$tmp/nan" --vocab 400 --dtype F32 --seed 4
cp "$here/tests/data/llama_spm/tokenizer.model" "$tmp/nan/"
/usr/bin/python3 - "$tmp/nan" <<'PY'
import glob, json, math, struct, sys
path = sorted(glob.glob(sys.argv[1] + "/*.safetensors"))[0]
with open(path, "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    name = sorted(k for k, v in header.items() if k != "__metadata__" and "q_proj" in k and v["dtype"] == "F32")[0]
    f.seek(8 + n + header[name]["data_offsets"][0])
    f.write(struct.pack("<f", math.nan))
PY
expect_error "NaN weights" "the weights hold NaN or inf in '.*q_proj.weight' (1 of its" "$tmp/nan"
expect_error_prompt() {  # invalid UTF-8 in --prompt (issue 44)
  set +e
  "$bin" generate --hf "$tmp/llama" --prompt "$(printf 'A \xff man')" --max-new 3 > "$tmp/out" 2> "$tmp/err"
  local rc=$?
  set -e
  [ "$rc" -eq 1 ] && grep -q -- "--prompt is not valid UTF-8 (at byte 3)" "$tmp/err" ||
    fail "invalid UTF-8 prompt: exit $rc: $(cat "$tmp/err")"
  echo "llama_hf_cli: invalid UTF-8 prompt: $(cat "$tmp/err")"
}
expect_error_prompt
cp -r "$tmp/llama" "$tmp/noshard" && rm "$tmp/noshard/model-00002-of-00003.safetensors"
expect_error "missing shard" "model-00002-of-00003.safetensors is missing" "$tmp/noshard"
cp -r "$tmp/llama" "$tmp/notok" && rm "$tmp/notok/tokenizer.model"
expect_error "no tokenizer" "no tokenizer.json or tokenizer.model" "$tmp/notok"

# 3. LoRA fine-tuning.
zcat "$here/../shared/data/multi30k/train.en.gz" 2>/dev/null | head -300 > "$tmp/text.txt" || true
[ -s "$tmp/text.txt" ] || for i in $(seq 300); do echo "A man in a blue shirt is playing guitar number $i."; done > "$tmp/text.txt"
sums="$(cd "$tmp/llama" && sha256sum *)"
"$bin" train --task lm --base "$tmp/llama" --lora-rank 4 --lora-targets q,k,v,o,gate,up,down --data "$tmp/text.txt" \
  --epochs 2 --block 32 --batch 8 --merge --out "$tmp/ft" --threads 1 > "$tmp/ft.log" 2>&1 || fail "LoRA run: $(tail -3 "$tmp/ft.log")"
[ -f "$tmp/ft/adapter.safetensors" ] || fail "no adapter.safetensors"
[ ! -e "$tmp/ft/model.safetensors" ] || fail "a LoRA run wrote model.safetensors"
[ "$(cd "$tmp/llama" && sha256sum *)" = "$sums" ] || fail "the base's files changed"
grep -q "3904 trainable" "$tmp/ft.log" || fail "the adapters' parameter count: $(grep LoRA "$tmp/ft.log")"
adapted="$("$bin" generate --checkpoint "$tmp/ft" --prompt "A man in a" --max-new 12 --greedy --threads 1)"
merged="$("$bin" generate --hf "$tmp/ft/merged" --prompt "A man in a" --max-new 12 --greedy --threads 1)"
[ "$adapted" = "$merged" ] || fail "the merged model generates '$merged', the adapters '$adapted'"
[ "$adapted" != "$out" ] || fail "the fine-tuned model generates what the base does: '$out'"
echo "llama_hf_cli: LoRA: the adapters and the merged model generate: $adapted"

if [ "$sanitized" = sanitized ]; then
  echo "llama_hf_cli: peak RSS not compared (a sanitized build)"
  echo "llama_hf_cli: OK"
  exit 0
fi
OMP_NUM_THREADS=1 /usr/bin/python3 "$ref" write-hf "$tmp/big" --vocab 400 --hidden 512 --intermediate 1408 --layers 4
cp "$here/tests/data/llama_spm/tokenizer.model" "$tmp/big/"
peak() {  # the peak RSS (MiB) a 1-epoch fine-tuning run reports; extra flags in $@
  "$bin" train --task lm --base "$tmp/big" "$@" --data "$tmp/text.txt" --limit 60 --epochs 1 --block 32 --batch 8 \
    --out "$tmp/peak" --overwrite --threads 1 2>&1 | sed -n 's/^final:.*peak RSS \([0-9]*\) MiB$/\1/p' || true
}
lora_mib="$(peak --lora-rank 8)"
full_mib="$(peak)"
[ -n "$lora_mib" ] && [ -n "$full_mib" ] || fail "no peak RSS reported (LoRA '$lora_mib', full '$full_mib')"
[ "$((2 * lora_mib))" -lt "$full_mib" ] || fail "LoRA's peak RSS $lora_mib MiB is not below half of full fine-tuning's $full_mib MiB"
echo "llama_hf_cli: peak RSS: LoRA $lora_mib MiB, full fine-tuning $full_mib MiB"
echo "llama_hf_cli: OK"
