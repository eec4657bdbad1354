#!/usr/bin/env bash
# The GPU window in one call: run on a lent GPU machine, from the repository root, with the kit
# that tools/gpu-kit.sh pack made here (.gpu-kit, carried beside the tree). It answers, in one
# run of about 6 minutes: is the CUDA backend right, is it clean under the sanitizers, how fast is
# it against PyTorch on the same card.
#
#   device run, carry [".gpu-kit"]:  bash tools/gpu-window.sh     (docs/cuda.md, "On a GPU")
#
# Stages, each with its own time limit, cut to what is left of GPU_WINDOW_SECONDS (default 340):
#   probe        (~10 s)  nvidia-smi, driver, nvcc, cuBLAS found, `import torch`, ldd of every binary
#                         (nothing "not found"), the binaries start; if one does not, the fallback
#                         builds them there from the kit's .deb files (dpkg -x into /tmp, never /)
#   device_check (<=120 s) the whole device-generic suite on the GPU; exit 77 (no GPU) is a failure
#   sanitizers   (<=60 s) compute-sanitizer memcheck (both attention kernels, optimizers, decoding,
#                         bf16) and racecheck (the tiled attention kernels)
#   race         (<=90 s) tapestry bench vs tools/reference/bench_torch.py, small and base,
#                         float32 (TF32 off), TF32, bf16 autocast, alternated: ms/step, tokens/s,
#                         peak memory, syncs and launches per step on both sides
#   attention    (<=30 s) causal attention at 256, 1024, 4096 (head 64): gemm vs tiled vs torch's
#                         scaled_dot_product_attention, forward and forward + backward; ncu on
#                         a tiled kernel if time is left
#   train        (the rest, >=45 s) a short Multi30k training with --device cuda: its tokens/s
# Everything goes to $OUT (default gpu-window-out), at most 8 files: summary.txt (the table,
# printed last), probe.txt, device_check.txt, sanitizer.txt, race.txt, attention.txt, train.txt.
# The kit's libraries go on LD_LIBRARY_PATH for tapestry's own binaries only (`kitenv`), never for
# this machine's python3, nvidia-smi or profilers.
set -uo pipefail
cd "$(dirname "$0")/.."

kit="${TAPESTRY_KIT:-.gpu-kit}"
out="${OUT:-gpu-window-out}"
budget="${GPU_WINDOW_SECONDS:-340}"
mkdir -p "$out"
start=$SECONDS
: >"$out/summary.txt"
failures=0

row() {  # STAGE STATUS SECONDS NOTE
  printf '%-13s %-8s %4ss  %s\n' "$1" "$2" "$3" "$4" >>"$out/summary.txt"
  case "$2" in FAIL|cut) failures=$((failures + 1)) ;; esac
}
left() { echo $((budget - (SECONDS - start))); }
cap() {  # the seconds a stage may take: its own limit, or what is left less RESERVE for later stages
  local want=$1 reserve=${2:-0} l
  l=$(($(left) - reserve))
  [ "$l" -lt "$want" ] && want=$l
  [ "$want" -lt 1 ] && want=1
  echo "$want"
}

# The kit's binaries and libraries, unpacked outside the tree (xz by tar, else Python's lzma).
run=/tmp/tapestry-kit
rm -rf "$run" && mkdir -p "$run/bin"
tar -C "$run" -xJf "$kit/kit.tar.xz" 2>/dev/null ||
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$kit/kit.tar.xz" "$run" ||
  echo "gpu-window: cannot unpack $kit/kit.tar.xz" >&2
bin="$run/bin"
# The CUDA libraries come from this machine: the toolkit's, else PyTorch's wheels.
cuda_lib=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-*/lib64; do
  [ -e "$d/libcublas.so.13" ] && { cuda_lib="$d"; break; }
done
if [ -z "$cuda_lib" ]; then
  found="$(find /usr/local /opt -maxdepth 9 -name 'libcublas.so.13' 2>/dev/null | head -1)"
  [ -n "$found" ] && cuda_lib="$(dirname "$found")"
fi
kit_libs="$run/lib${cuda_lib:+:$cuda_lib}"
kit_path() { echo "$kit_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; }
kitenv() { env LD_LIBRARY_PATH="$(kit_path)" "$@"; }  # also as `timeout N env LD_LIBRARY_PATH="$(kit_path)" ...`
export PYTHONUNBUFFERED=1
[ -x /usr/local/cuda/bin/compute-sanitizer ] && export PATH="$PATH:/usr/local/cuda/bin"

# ---- 1. probe
t0=$SECONDS
have_gpu=0
{
  echo "== $(date -u +%FT%TZ) $(uname -srm); $(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2)"
  echo "== kit"; cat "$kit/MANIFEST" 2>/dev/null | head -6 || echo "no $kit/MANIFEST"
  echo "== nvidia-smi"; timeout 15 nvidia-smi 2>&1 || echo "nvidia-smi: not available"
  echo "== nvcc"; (nvcc --version || /usr/local/cuda/bin/nvcc --version) 2>&1 | tail -2
  echo "== cuBLAS: ${cuda_lib:-not found on this machine}"
  echo "== python3"; timeout 60 python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else "")' 2>&1 | tail -3
  echo "== tools"; for t in compute-sanitizer ncu; do command -v "$t" >/dev/null && echo "$t: $("$t" --version 2>&1 | tail -1)" || echo "$t: not found"; done
} >"$out/probe.txt" 2>&1
# Output captured first: `cmd | grep -q` under pipefail fails when grep stops reading early.
gpus="$(nvidia-smi -L 2>/dev/null || true)"
case "$gpus" in *GPU*) have_gpu=1 ;; esac

probe_binaries() {  # ldd and a start of each binary; prints what is wrong, returns non-zero if anything is
  local bad=0
  for b in "$bin/tapestry" "$bin/device_check"; do
    [ -x "$b" ] || { echo "$b: missing"; bad=1; continue; }
    local libs
    libs="$(kitenv ldd "$b" 2>&1)"
    echo "== ldd $b"; echo "$libs"
    case "$libs" in *"not found"*) echo "$b: a library is not found"; bad=1 ;; esac
  done
  kitenv "$bin/tapestry" --version 2>&1 || { echo "tapestry --version: does not start"; bad=1; }
  kitenv "$bin/device_check" >/dev/null 2>&1; [ $? -eq 2 ] || { echo "device_check: does not start (its usage exits 2)"; bad=1; }
  return $bad
}

probe_note="every library resolves, both binaries start"
if ! probe_binaries >>"$out/probe.txt" 2>&1; then
  probe_note="carried binaries do not start"
  if ls "$kit"/debs/*.deb >/dev/null 2>&1 && [ "$(left)" -gt 200 ]; then
    echo "== fallback: building from $kit/debs" >>"$out/probe.txt"
    deps=/tmp/tapestry-deps/usr/lib/x86_64-linux-gnu
    if timeout "$(cap 180 120)" tools/gpu-fallback.sh "$kit" /tmp/tapestry-deps /tmp/tapestry-build >>"$out/probe.txt" 2>&1 &&
       mkdir -p "$bin" && cp /tmp/tapestry-build/tapestry /tmp/tapestry-build/device_check "$bin/" &&
       kit_libs="$deps:$deps/openblas-openmp:$kit_libs" && probe_binaries >>"$out/probe.txt" 2>&1; then
      probe_note="built there from the kit's .deb files (the carried binaries did not start)"
    fi
  fi
fi
if probe_binaries >/dev/null 2>&1; then
  row probe ok $((SECONDS - t0)) "$probe_note; GPU: $([ $have_gpu = 1 ] && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 || echo none)"
else
  row probe FAIL $((SECONDS - t0)) "$probe_note (probe.txt)"
fi

# ---- 2. device_check cuda: the whole suite
t0=$SECONDS
timeout "$(cap 120 100)" env LD_LIBRARY_PATH="$(kit_path)" "$bin/device_check" cuda >"$out/device_check.txt" 2>&1
rc=$?
fails=$(grep -c "FAIL:" "$out/device_check.txt")
case $rc in
  0) row device_check ok $((SECONDS - t0)) "$(tail -1 "$out/device_check.txt")" ;;
  77) row device_check FAIL $((SECONDS - t0)) "exit 77: skipped, no GPU: $(grep -m1 "skipped" "$out/device_check.txt")" ;;
  124) row device_check cut $((SECONDS - t0)) "stopped at its time limit, $fails failures so far" ;;
  *) row device_check FAIL $((SECONDS - t0)) "exit $rc, $fails failures (device_check.txt)" ;;
esac

no_gpu() {  # STAGE SECONDS WHY: the stage cannot run here
  row "$1" skipped "$2" "no GPU: $3"
}
why_cuda() { kitenv "$bin/tapestry" bench --device cuda --steps 1 --warmup 0 2>&1 | grep -v '^Run with' | head -1; }

# ---- 3. compute-sanitizer on sections chosen to fit
t0=$SECONDS
if [ $have_gpu = 0 ]; then
  no_gpu sanitizers 0 "$(tail -1 "$out/device_check.txt")"
elif ! command -v compute-sanitizer >/dev/null; then
  row sanitizers FAIL 0 "compute-sanitizer not found"
else
  mem=/tmp/gpu-window-memcheck.log race_log=/tmp/gpu-window-racecheck.log
  timeout "$(cap 35 150)" compute-sanitizer --tool memcheck --target-processes all --leak-check no --print-limit 20 \
    env LD_LIBRARY_PATH="$(kit_path)" "$bin/device_check" cuda attention-gemm attention-tiled optimizers decoding bf16 \
    >"$mem" 2>&1
  mem_rc=$?
  timeout "$(cap 25 125)" compute-sanitizer --tool racecheck --target-processes all --racecheck-report hazard --print-limit 20 \
    env LD_LIBRARY_PATH="$(kit_path)" "$bin/device_check" cuda attention-tiled >"$race_log" 2>&1
  race_rc=$?
  {
    echo "== memcheck: device_check cuda attention-gemm attention-tiled optimizers decoding bf16 (exit $mem_rc)"
    tail -40 "$mem"
    echo "== racecheck: device_check cuda attention-tiled (exit $race_rc)"
    tail -40 "$race_log"
  } >"$out/sanitizer.txt"
  # memcheck ends with "ERROR SUMMARY: 0 errors"; racecheck with "RACECHECK SUMMARY: 0 hazards
  # displayed (0 errors, 0 warnings)" (or an ERROR SUMMARY line, by version).
  mem_ok=0 race_ok=0
  grep -q "ERROR SUMMARY: 0 errors" "$mem" && [ $mem_rc = 0 ] && mem_ok=1
  grep -qE "RACECHECK SUMMARY: 0 hazards|ERROR SUMMARY: 0 errors" "$race_log" && [ $race_rc = 0 ] && race_ok=1
  summary="memcheck exit $mem_rc, racecheck exit $race_rc; $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' "$mem" "$race_log" | tr '\n' ' ')"
  if [ $mem_ok = 1 ] && [ $race_ok = 1 ]; then row sanitizers ok $((SECONDS - t0)) "$summary"
  elif [ $mem_rc = 124 ] || [ $race_rc = 124 ]; then row sanitizers cut $((SECONDS - t0)) "$summary"
  else row sanitizers FAIL $((SECONDS - t0)) "$summary"; fi
fi

# ---- 4. the race against PyTorch on this card: at most 90 s, and 90 s kept for the stages after it
t0=$SECONDS
race="$out/race.txt"
if [ $have_gpu = 0 ]; then
  { echo "tapestry bench --device cuda: $(why_cuda)"
    echo "bench_torch.py --device cuda: $(timeout 60 python3 tools/reference/bench_torch.py --device cuda --steps 1 --warmup 0 2>&1 | tail -1)"
  } >"$race"
  no_gpu race $((SECONDS - t0)) "$(head -1 "$race" | cut -c1-150)"
else
  : >"$race"
  race_end=$((SECONDS + $(cap 90 90)))
  planned=0
  for setting in "fp32" "tf32" "bf16"; do
    case $setting in
      fp32) flags=() ;;
      tf32) flags=(--tf32) ;;
      bf16) flags=(--precision bf16) ;;
    esac
    for w in small base; do
      planned=$((planned + 1))
      # A pair needs about 25 s (torch's import included); stop before one that cannot finish.
      [ $((race_end - SECONDS)) -gt 25 ] || break 2
      timeout $((race_end - SECONDS)) env LD_LIBRARY_PATH="$(kit_path)" "$bin/tapestry" bench --workload "$w" \
        --device cuda --json "${flags[@]}" >>"$race" 2>&1 ||
        echo "{\"impl\": \"tapestry\", \"workload\": \"$w\", \"setting\": \"$setting\", \"error\": true}" >>"$race"
      [ $((race_end - SECONDS)) -gt 5 ] || break 2
      timeout $((race_end - SECONDS)) python3 tools/reference/bench_torch.py --workload "$w" --device cuda --json \
        "${flags[@]}" >>"$race" 2>&1 ||
        echo "{\"impl\": \"torch\", \"workload\": \"$w\", \"setting\": \"$setting\", \"error\": true}" >>"$race"
    done
  done
  table=$(python3 - "$race" <<'PY'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if "train_ms_median" not in r:
        continue
    setting = "bf16" if r.get("precision") == "bf16" else ("tf32" if "tf32" in r.get("gemm", "") else "fp32")
    rows.setdefault((r["workload"], setting), {})[r["impl"]] = r
out = []
for (w, s), pair in sorted(rows.items()):
    ours, theirs = pair.get("tapestry"), pair.get("torch")
    if ours and theirs:
        out.append(f"{w}/{s} {theirs['train_ms_median'] / ours['train_ms_median']:.2f}x")
print(f"{len(out)} of 6 pairs: " + (", ".join(out) or "none finished"))
PY
)
  { echo; echo "== torch ms / tapestry ms per train step: $table"; } >>"$race"
  case "$table" in
    "6 of 6"*) row race ok $((SECONDS - t0)) "speed-up $table" ;;
    "0 of 6"*) row race FAIL $((SECONDS - t0)) "speed-up $table" ;;
    *) row race cut $((SECONDS - t0)) "speed-up $table" ;;
  esac
fi

# ---- 5. attention: gemm vs tiled vs torch
t0=$SECONDS
att="$out/attention.txt"
if [ $have_gpu = 0 ]; then
  echo "tapestry bench --workload attention --device cuda: $(why_cuda)" >"$att"
  no_gpu attention $((SECONDS - t0)) "$(cut -c1-150 "$att")"
else
  : >"$att"
  for k in gemm tiled; do
    timeout "$(cap 10 55)" env LD_LIBRARY_PATH="$(kit_path)" "$bin/tapestry" bench --workload attention --device cuda \
      --attention "$k" --json >>"$att" 2>&1
  done
  timeout "$(cap 15 45)" python3 tools/reference/bench_torch.py --workload attention --device cuda --json >>"$att" 2>&1
  if [ "$(left)" -gt 75 ] && command -v ncu >/dev/null; then
    # The first tiled kernel launch after the untimed call (T 256): a look at its occupancy and speed of light.
    echo "== ncu: a tiled attention kernel (T 256)" >>"$att"
    timeout 20 ncu --target-processes all --kernel-name regex:tiled_query_rows --launch-skip 1 --launch-count 1 --section SpeedOfLight \
      env LD_LIBRARY_PATH="$(kit_path)" "$bin/tapestry" bench --workload attention --device cuda --attention tiled \
      --steps 2 2>&1 | tail -25 >>"$att"
  fi
  timings=$(grep -c '"forward_ms"' "$att")
  row attention "$([ "$timings" -ge 9 ] && echo ok || echo FAIL)" $((SECONDS - t0)) "$timings of 9 timings (attention.txt)"
fi

# ---- 6. a short Multi30k training on the GPU
t0=$SECONDS
tr="$out/train.txt"
if [ $have_gpu = 0 ]; then
  echo "tapestry train --device cuda: $(kitenv "$bin/tapestry" train --task multi30k --device cuda --epochs 1 2>&1 | grep -v '^Run with' | head -1)" >"$tr"
  no_gpu train $((SECONDS - t0)) "$(cut -c1-150 "$tr")"
elif [ "$(left)" -lt 45 ]; then
  row train cut 0 "$(left) s left: too few for a run"
else
  limit=$(($(left) - 5))
  # The time limit leaves room for the epoch's end: evaluation on 100 sentences and the test set.
  timeout "$limit" env LD_LIBRARY_PATH="$(kit_path)" "$bin/tapestry" train --task multi30k --device cuda \
    --data "$kit/data/multi30k" --epochs 1 --time-limit $((limit - 30)) --eval-limit 100 --beam 1 --no-progress \
    --out /tmp/gpu-window-run --overwrite >"$tr" 2>&1
  rc=$?
  row train "$([ $rc = 0 ] && echo ok || echo FAIL)" $((SECONDS - t0)) "exit $rc; $(grep -o '[0-9,.]* tok/s' "$tr" | tail -1)"
fi

echo "== tools/gpu-window.sh: $((SECONDS - start)) s, $failures stage(s) failed or cut; files in $out" >>"$out/summary.txt"
cat "$out/summary.txt"
[ "$failures" -eq 0 ]
