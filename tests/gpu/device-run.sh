#!/usr/bin/env bash
# The device run: what a session does first whenever the device tool lends it a GPU.
# IT FITS IN 8 MINUTES OF DEVICE TIME: every stage runs under a deadline of DEVICE_BUDGET_S
# seconds (default 420) from the start of `device`, so the call returns its logs before a
# run(timeout_s=480) would cut it; stages that no longer fit are skipped and say so.
#
# Two halves:
#   tests/gpu/device-run.sh pack [BUILD]      HERE (no GPU needed): builds the CUDA targets in
#       BUILD (default build/, configured with CUDA ON if it is not), strips them, copies the
#       non-CUDA shared libraries they link, prepares the data (the KJV as bytes and as GPT-2 BPE
#       tokens) and the training configs, and writes ONE archive, .device/pack.tar.xz (at most
#       60 MiB; .device/ is git-ignored).
#   tests/gpu/device-run.sh device            THERE, through the device tool:
#       run(command="tests/gpu/device-run.sh device", carry=[".device/pack.tar.xz"], timeout_s=480)
#       It unpacks to /tmp/dstrain-device, finds the device's own CUDA runtime, cuBLAS and NCCL
#       (CUDA toolkit or PyTorch's NVIDIA wheels), and runs, each stage logged:
#         env     nvidia-smi, the libraries the module resolves, `dstrain report`
#         tests   every cuda-labelled test binary (gtest), one by one
#         bench   gpu_bench: GPT-2 124M and 350M, a 1.1B Llama and a 0.9B Mixtral (8 experts, top 2)
#                 at bf16 storage (flash attention; 124M also with the exact attention) and at fp32
#                 (fp32 math); 124M at both also as a CUDA graph (--cuda-graph)
#         train   200 steps of GPT-2 124M (bf16, ZeRO-2, one rank) on the KJV as GPT-2 BPE
#                 tokens, through `dstrain launch`; the CPU twin's first steps run HERE
#                 (`tests/gpu/device-run.sh cpu-twin`) and are compared afterwards; then 10
#                 steps of the same job with Lion (its state offloaded to the host); then 4 x 12
#                 steps at 4 micro-batches per step with training.sync_loss_once/sync_norm_once
#                 on and off, and with training.cuda_graph, 6 x 12 steps alternated (what one
#                 synchronisation per step and one graph launch per step save)
#         smoke   tests/gpu/smoke.sh at one GPU without building (SMOKE_PART=gpu): the ZeRO-2 smoke
#                 job against its CPU twin on the device's cores
#         calibrate  `dstrain plan --calibrate` of that config on the GPU (calibration-gpu.json in
#                 $OUT: keep it as configs/calibration/h200.json) and `--recommend` with it
#         ncu     where ncu exists: one 124M bf16 step's kernels, time per kernel name
#       Everything lands in $OUT: summary.txt (one line per stage, then the figures), device.log
#       (all output), logs.tar.gz (every stage's log and metrics file) and the calibration file.
#   tests/gpu/device-run.sh cpu-twin [BUILD]  HERE: the 200-step job's first DEVICE_TWIN_STEPS
#       (default 3) steps on the CPU (same config, training.device cpu) into
#       .device/cpu-twin.jsonl; `compare FILE.jsonl` compares the device's metrics with it.
#
# Knobs: DEVICE_BUDGET_S (420), DEVICE_TRAIN_STEPS (200), DEVICE_STAGES (default
# "env tests bench train smoke calibrate ncu": a subset reruns only those, in that order).
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
cmd="${1:-}"
pack_dir="$here/.device"
stage_dir="$pack_dir/stage"
archive="$pack_dir/pack.tar.xz"
train_steps="${DEVICE_TRAIN_STEPS:-200}"

# The cuda-labelled tests (every ds_add_test of tests/gpu/*/CMakeLists.txt, read from them so a new
# one is never left out) and the other binaries the device runs.
mapfile -t cuda_tests < <(sed -n 's/^ *ds_add_test(\(test_[a-z0-9_]*\) .*/\1/p' "$here"/tests/gpu/*/CMakeLists.txt)
binaries=(dstrain gpu_bench "${cuda_tests[@]}")

# make_train_config DEVICE OUT.json: configs/gpt2-124m-gpu.json on the KJV's GPT-2 BPE tokens,
# DEVICE cuda or cpu, paths relative to the config (data/ beside configs/ in the pack).
make_train_config() {
  python3 - "$here/configs/gpt2-124m-gpu.json" "$1" "$2" "$train_steps" <<'PY'
import json, sys
src, device, dst, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
cfg = json.load(open(src))
cfg["data"] = {"train": "../data/kjv-gpt2/train.bin", "val": "../data/kjv-gpt2/val.bin"}
t = cfg["training"]
t["device"], t["steps"], t["log_interval"] = device, steps, 1
t["eval_interval"] = 0
t["checkpoint_interval"] = 0
t.pop("checkpoint_dir", None)
json.dump(cfg, open(dst, "w"), indent=2)
PY
}

pack() {
  local build
  build="$(realpath -m "${1:-$here/build}")"
  if ! grep -qs '^DSTRAIN_HAVE_CUDA:INTERNAL=ON\|^DSTRAIN_CUDA:STRING=ON' "$build/CMakeCache.txt"; then
    echo "== configure $build with CUDA ON"
    cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDSTRAIN_CUDA=ON >/dev/null
  fi
  echo "== build the device targets ($build)"
  cmake --build "$build" -j "$(nproc)" --target dstrain_cuda "${binaries[@]}"

  echo "== data: the KJV as bytes and as GPT-2 BPE tokens"
  "$here/scripts/prepare-kjv.sh" "$build/bin/dstrain"
  if [[ ! -f "$here/data/kjv-gpt2/train.bin" ]]; then
    "$here/scripts/fetch-gpt2-tokenizer.sh"
    local txt
    txt="$(mktemp)"
    bible -f 'Genesis 1:1-Revelation 22:21' | sed -E 's/^[1-3]?[A-Za-z]+[0-9]+:[0-9]+ //' >"$txt"
    "$build/bin/dstrain" data prepare --input "$txt" --output "$here/data/kjv-gpt2" --tokenizer gpt2 \
      --vocab "$here/data/gpt2" --val-fraction 0.1
    rm -f "$txt"
  fi

  echo "== stage $stage_dir"
  rm -rf "$stage_dir"
  mkdir -p "$stage_dir/bin" "$stage_dir/lib" "$stage_dir/data" "$stage_dir/configs"
  local f
  for f in "${binaries[@]}" libdstrain_cuda.so; do
    strip --strip-unneeded -o "$stage_dir/bin/$f" "$build/bin/$f"
  done
  # Every shared library they link, except the C/C++ runtime (the device's own is newer) and
  # CUDA's (the device's driver, runtime, cuBLAS and NCCL must be used).
  local skip='linux-vdso|ld-linux|/libc\.so|/libm\.so|/libpthread|/libdl\.so|/librt\.so|libstdc\+\+|libgcc_s|libcuda\.so|libcudart|libcublas|libnccl|libnvidia|libcudnn'
  ldd "$stage_dir"/bin/* 2>/dev/null | awk '/=> \//{print $3}' | grep -Ev "$skip" | sort -u |
    while read -r lib; do
      cp -L "$lib" "$stage_dir/lib/"
      strip --strip-unneeded "$stage_dir/lib/$(basename "$lib")" 2>/dev/null || true
    done
  cp -r "$here/data/kjv" "$here/data/kjv-gpt2" "$stage_dir/data/"
  make_train_config cuda "$stage_dir/configs/device-train-124m.json"
  # The same job with Lion: the optimizers beside Adam run offloaded to the host on a GPU run.
  python3 - "$stage_dir/configs/device-train-124m.json" "$stage_dir/configs/device-train-124m-lion.json" <<'PY'
import json, sys
cfg = json.load(open(sys.argv[1]))
cfg["optimizer"] = {"type": "Lion", "params": {"lr": 1e-4, "betas": [0.9, 0.99], "weight_decay": 0.1}}
json.dump(cfg, open(sys.argv[2], "w"), indent=2)
PY
  # What a step synchronises on (training.sync_loss_once, sync_norm_once), measured off and on,
  # and the step as a CUDA graph (training.cuda_graph): the same job with 4 micro-batches per step
  # (a loss copy each when off).
  python3 - "$stage_dir/configs/device-train-124m.json" "$stage_dir/configs" <<'PY'
import json, sys
for name in ("once", "each", "graph"):
    cfg = json.load(open(sys.argv[1]))
    cfg["gradient_accumulation_steps"] = 4
    cfg["training"]["sync_loss_once"] = cfg["training"]["sync_norm_once"] = name != "each"
    cfg["training"]["cuda_graph"] = name == "graph"  # the step's 4 micro-batches as one CUDA graph
    json.dump(cfg, open(f"{sys.argv[2]}/device-syncs-{name}.json", "w"), indent=2)
PY
  git -C "$here" rev-parse --short HEAD >"$stage_dir/commit"
  git -C "$here" status --short >>"$stage_dir/commit"

  echo "== archive"
  tar -C "$stage_dir" -cf - . | xz -T0 -6 >"$archive"
  local bytes
  bytes=$(stat -c %s "$archive")
  du -sh "$stage_dir"/bin "$stage_dir"/lib "$stage_dir"/data | sed 's/^/   /'
  echo "   $archive: $((bytes / 1048576)) MiB"
  if ((bytes > 60 * 1048576)); then
    echo "device-run: the archive is over 60 MiB; the device tool carries at most 64 MiB in all" >&2
    exit 1
  fi
  echo "device-run: packed. On the device: run(command=\"tests/gpu/device-run.sh device\"," \
       "carry=[\".device/pack.tar.xz\"], timeout_s=480)"
}

# The CPU twin of the 200-step job's first steps, here (the device's time is for the GPU).
cpu_twin() {
  local build
  build="$(realpath -m "${1:-$here/build}")"
  local steps="${DEVICE_TWIN_STEPS:-3}" cfg="$stage_dir/configs/device-train-124m-cpu.json"
  [[ -d "$stage_dir/configs" ]] || { echo "device-run: run pack first" >&2; exit 2; }
  make_train_config cpu "$cfg"
  "$build/bin/dstrain" launch --nproc-per-node 1 -- "$build/bin/dstrain" train --config "$cfg" \
    --metrics "$pack_dir/cpu-twin.jsonl" --max-steps "$steps"
}

compare() {
  python3 - "$pack_dir/cpu-twin.jsonl" "$1" <<'PY'
import json, sys
def recs(p):
    return {int(r["step"]): r for r in (json.loads(l) for l in open(p) if l.strip())}
cpu, gpu = recs(sys.argv[1]), recs(sys.argv[2])
print("step  loss(cpu)  loss(gpu)  rel.diff   |g|(cpu)  |g|(gpu)  rel.diff")
for s in sorted(cpu):
    if s not in gpu:
        sys.exit(f"step {s} missing from {sys.argv[2]}")
    c, g = cpu[s], gpu[s]
    print(f"{s:4d}  {c['loss']:9.5f}  {g['loss']:9.5f}  {abs(g['loss'] - c['loss']) / c['loss']:9.2e}  "
          f"{c['grad_norm']:8.4f}  {g['grad_norm']:8.4f}  {abs(g['grad_norm'] - c['grad_norm']) / c['grad_norm']:9.2e}")
PY
}

# ---- the device half ----

device() {
  local out="${OUT:-$here/device-out}" root=/tmp/dstrain-device
  local budget="${DEVICE_BUDGET_S:-420}" stages="${DEVICE_STAGES:-env tests bench train smoke calibrate ncu}"
  mkdir -p "$out"
  local logs="$root/logs" summary="$out/summary.txt"
  exec > >(tee "$out/device.log") 2>&1
  local t_start=$SECONDS
  echo "== unpack $archive -> $root"
  rm -rf "$root" && mkdir -p "$root"
  if command -v xz >/dev/null 2>&1; then
    xz -dc "$archive" | tar -C "$root" -xf -
  else
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$archive" "$root"
  fi
  mkdir -p "$logs"
  echo "pack of $(head -1 "$root/commit")" >"$summary"

  # The device's CUDA libraries: the toolkit's, else PyTorch's NVIDIA wheels.
  local libdirs="$root/lib" name found
  for name in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
    found="$(find /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets /usr/lib /opt /usr/local/lib \
             -name "$name" 2>/dev/null | head -1 || true)"
    if [[ -n "$found" ]]; then
      libdirs="$libdirs:$(dirname "$found")"
    else
      echo "device-run: $name not found on this machine" | tee -a "$summary"
    fi
  done
  export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export OMP_WAIT_POLICY=PASSIVE
  local bin="$root/bin"

  # stage NAME LIMIT CMD...: runs CMD under min(LIMIT, what the budget has left), logged.
  stage() {
    local name="$1" limit="$2"
    shift 2
    local left=$((budget - (SECONDS - t_start)))
    if ((left < 15)); then
      echo "$(printf '%-28s' "$name") SKIPPED (budget spent)" >>"$summary"
      return 0
    fi
    ((limit > left)) && limit=$left
    echo "== $name (limit ${limit} s)"
    local t0=$SECONDS rc=0
    timeout -k 5 "$limit" "$@" >"$logs/$name.log" 2>&1 || rc=$?
    cat "$logs/$name.log"
    local verdict="ok"
    ((rc == 124 || rc == 137)) && verdict="TIMED OUT" || { ((rc != 0)) && verdict="FAILED rc=$rc"; }
    echo "$(printf '%-28s' "$name") $verdict in $((SECONDS - t0)) s" >>"$summary"
    return 0
  }

  local s
  for s in $stages; do
    case "$s" in
      env)
        stage env 30 bash -c "nvidia-smi; echo; ldd '$bin/libdstrain_cuda.so' | grep -E 'cuda|cublas|nccl|not found'; \
                              echo; find / -xdev -name 'libcudnn.so.9*' 2>/dev/null | head -3; \
                              echo; '$bin/dstrain' report"
        ;;
      tests)
        local t
        for t in "${cuda_tests[@]}"; do stage "test:$t" 90 "$bin/$t" --gtest_color=no; done
        ;;
      bench)
        local m
        for m in "124m-bf16:--model 124m --batch 8 --seq 1024 --storage bf16" \
                 "124m-bf16-graph:--model 124m --batch 8 --seq 1024 --storage bf16 --cuda-graph" \
                 "124m-bf16-b16:--model 124m --batch 16 --seq 1024 --storage bf16" \
                 "124m-bf16-exact-attention:--model 124m --batch 8 --seq 1024 --storage bf16 --attention exact" \
                 "124m-fp32:--model 124m --batch 8 --seq 1024 --math fp32" \
                 "124m-fp32-graph:--model 124m --batch 8 --seq 1024 --math fp32 --cuda-graph" \
                 "350m-bf16:--model 350m --batch 4 --seq 1024 --storage bf16" \
                 "350m-fp32:--model 350m --batch 4 --seq 1024 --math fp32" \
                 "llama-1b-bf16:--model llama-1b --batch 4 --seq 2048 --storage bf16" \
                 "llama-1b-fp32:--model llama-1b --batch 2 --seq 2048 --math fp32 --steps 2 --warmup 1" \
                 "mixtral-0.9b-bf16:--model mixtral-0.9b --batch 4 --seq 2048 --storage bf16" \
                 "mixtral-0.9b-fp32:--model mixtral-0.9b --batch 2 --seq 2048 --math fp32 --steps 2 --warmup 1"; do
          # shellcheck disable=SC2086
          stage "bench:${m%%:*}" 60 "$bin/gpu_bench" --steps 5 --warmup 2 ${m#*:}
        done
        ;;
      train)
        stage "train:124m-kjv-gpt2" 180 "$bin/dstrain" launch --nproc-per-node 1 --kill-timeout 5 -- \
          "$bin/dstrain" train --config "$root/configs/device-train-124m.json" \
          --metrics "$logs/train-124m.jsonl" --max-steps "$train_steps"
        stage "train:124m-lion-offloaded" 60 "$bin/dstrain" launch --nproc-per-node 1 --kill-timeout 5 -- \
          "$bin/dstrain" train --config "$root/configs/device-train-124m-lion.json" \
          --metrics "$logs/train-124m-lion.jsonl" --max-steps 10
        local sync
        for sync in once graph each each graph once; do  # alternated: the machine's drift hits all alike
          stage "train:124m-g4-syncs-$sync" 45 "$bin/dstrain" launch --nproc-per-node 1 --kill-timeout 5 -- \
            "$bin/dstrain" train --config "$root/configs/device-syncs-$sync.json" \
            --metrics "$logs/syncs-$sync-$SECONDS.jsonl" --max-steps 12
        done
        ;;
      smoke)
        mkdir -p "$here/data"
        [[ -f "$here/data/kjv/train.bin" ]] || cp -r "$root/data/kjv" "$here/data/"
        stage "smoke:zero2-x1" 90 env SMOKE_PART=gpu SMOKE_GPUS=1 "$here/tests/gpu/smoke.sh" "$root"
        cp "$root"/gpu-smoke/*.jsonl "$logs/" 2>/dev/null || true
        ;;
      calibrate)
        # The H200 profile for `dstrain plan --recommend --calibration` (configs/calibration/), and
        # the recommendation it gives for the training config's model on one GPU.
        stage "calibrate:124m-bf16" 150 "$bin/dstrain" plan --calibrate --config "$root/configs/device-train-124m.json" \
          --nproc-per-node 1 -o "$out/calibration-gpu.json"
        stage "recommend:124m-1gpu" 60 "$bin/dstrain" plan --recommend --config "$root/configs/device-train-124m.json" \
          --world-size 1 --gpu-mem 139GiB --calibration "$out/calibration-gpu.json" --top 5
        ;;
      ncu)
        if command -v ncu >/dev/null 2>&1; then
          stage "ncu:124m-bf16-step" 90 ncu --metrics gpu__time_duration.sum --print-summary per-kernel \
            "$bin/gpu_bench" --model 124m --batch 8 --seq 1024 --steps 1 --warmup 0 --storage bf16
        else
          echo "$(printf '%-28s' ncu) SKIPPED (no ncu on this machine)" >>"$summary"
        fi
        ;;
      *) echo "device-run: unknown stage '$s'" >&2; exit 2 ;;
    esac
  done

  {
    echo
    echo "-- test results"
    local tl
    for tl in "$logs"/test:*.log; do
      [[ -f "$tl" ]] || continue
      echo "  $(basename "$tl" .log): $(grep -hE '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?' "$tl" | tr -s ' ' | tr '\n' ' ')"
      grep -hE '^\[  FAILED  \] [A-Za-z]' "$tl" | sort -u | sed 's/^/    /' || true
    done
    echo "-- gpu_bench"
    grep -hE '^(124m|350m|llama-1b|mixtral-0.9b) math' "$logs"/bench:*.log 2>/dev/null || true
    echo "-- training (rank 0 metrics: step loss grad_norm ms)"
    if [[ -f "$logs/train-124m.jsonl" ]]; then
      python3 - "$logs/train-124m.jsonl" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for r in recs:
    if r["step"] <= 5 or r["step"] % 25 == 0 or r is recs[-1]:
        print(f"  step {r['step']:4d}  loss {r['loss']:.4f}  |g| {r['grad_norm']:.4f}  "
              f"{r['ms_per_step']:.1f} ms  {r['tokens_per_s']:.0f} tok/s  mfu {r.get('mfu', float('nan'))}")
PY
    fi
    echo "-- step syncs and CUDA graph (124M, 4 micro-batches per step: median ms/step of steps 4-12 and the last loss, per run)"
    python3 - "$logs" <<'PY' || true
import glob, json, statistics, sys
for f in sorted(glob.glob(sys.argv[1] + "/syncs-*.jsonl")):
    recs = [json.loads(l) for l in open(f) if l.strip()]
    ms = [r["ms_per_step"] for r in recs][3:]
    if ms:
        print(f"  {f.split('/')[-1]}: {statistics.median(ms):.1f} ms ({len(ms)} steps), "
              f"step {recs[-1]['step']} loss {recs[-1]['loss']:.6f}")
PY
    echo "-- calibration"
    grep -h 'wrote\|compute samples' "$logs"/calibrate:*.log 2>/dev/null || true
    echo "-- smoke"
    grep -h 'agree\|MISMATCH\|smoke:' "$logs"/smoke:*.log 2>/dev/null | tail -5 || true
    echo "total $((SECONDS - t_start)) s of a ${budget} s budget"
  } >>"$summary"
  tar -C "$root" -czf "$out/logs.tar.gz" logs
  cp "$logs/train-124m.jsonl" "$out/" 2>/dev/null || true
  echo
  cat "$summary"
  sleep 1  # let tee write device.log out
}

case "$cmd" in
  pack) pack "${2:-}" ;;
  device) device ;;
  cpu-twin) cpu_twin "${2:-}" ;;
  compare) compare "$2" ;;
  *)
    sed -n '2,36p' "$0" >&2
    exit 2
    ;;
esac
