#!/usr/bin/env bash
# GPU smoke test for a box with G >= 1 GPUs: what CI would run there. Builds with CUDA ON (unless
# BUILD already has it), then:
#   1. dstrain report: the GPUs, their memory, driver, CUDA runtime, NCCL version;
#   2. every `cuda` test (GPT-2's and Llama's kernels vs their CPU twins, bf16 matmul math, device
#      allocator, GPT-2 and a Llama on one GPU vs the CPU run, NCCL collectives over all GPUs);
#   3. training through `dstrain launch --nproc-per-node G` on the GPUs (bf16 storage: bf16
#      buffers and GEMMs, gradients over NCCL as bf16), compared step by step with the same job on
#      the CPU (bf16 storage too) with the same
#      number of ranks (processes): configs/gpu-smoke-zero2.json (ZeRO-2 data parallel over all G)
#      and, where G >= 2, configs/gpu-smoke-tp2.json (tp=2 x dp G/2, over the largest even number
#      of GPUs), against their *-cpu.json twins, which must differ in training.device only;
#   4. bench/gpu_bench: tokens/s and MFU of GPT-2 training steps on GPU 0: 124M with bf16 storage
#      (what bf16.enabled trains with), 124M and 350M with bf16 matmul math over fp32 buffers (MFU
#      against the 790 TFLOP/s bf16 peak), and 124M with fp32 math for reference.
#
# Tolerances (bf16), per step: |loss_gpu - loss_cpu| <= 2% of loss_cpu for steps 1-10 and 5%
# after; the gradient norm (before clipping) within 10%. Both runs start from the same weights and
# read the same batches; they differ by summation order (cuBLAS and our kernels vs oneDNN and the
# CPU loops, each bf16 output rounded from a slightly different fp32 value; NCCL's bf16 sums vs
# the shm backend's), and Adam's normalisation amplifies
# differences in near-zero gradients as steps go on. For scale, on the CPU the same zero2 job with
# bf16 on and off (2 ranks, 20 steps, loss 5.57 -> 4.09) differs by at most 6.5e-4 in the loss and
# 4.8e-3 in the gradient norm; a real bug shows up as a wrong first loss, NaN, a loss that stops
# falling, or a gradient norm off by a factor (which Adam would hide from the loss). Knobs:
# SMOKE_TOL_EARLY, SMOKE_TOL_LATE, SMOKE_EARLY_STEPS, SMOKE_TOL_GRAD_NORM.
#
#   tests/gpu/smoke.sh [BUILD_DIR]        (default: build-gpu-smoke)
#   SMOKE_PART=gpu tests/gpu/smoke.sh DIR
#       the GPU half without building or running the cuda tests: DIR/bin holds dstrain, gpu_bench
#       and libdstrain_cuda.so already (tests/gpu/device-run.sh, which runs the tests itself).
#   SMOKE_PART=cpu SMOKE_NPROC=N tests/gpu/smoke.sh BUILD_DIR
#       the CPU half only, on any machine: the CPU reference runs with N ranks (default 2) through
#       BUILD_DIR/bin/dstrain (built with or without CUDA); the zero2 reference compared with the
#       same job with bf16 off (the size of bf16 noise, which must pass); and checks that the
#       comparison rejects losses 3% off and gradient norms 20% off. No GPU, no CUDA build.
# Other knobs: SMOKE_STEPS (training steps, default 20), SMOKE_GPUS (G, default: nvidia-smi -L),
# SMOKE_TIMEOUT (seconds per training job, default 600).
# Exit status: non-zero when the build, a cuda test, a training job, a loss comparison or the
# benchmark fails; 0 otherwise. Metrics files are kept under BUILD_DIR/gpu-smoke/.
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
build="$(realpath -m "${1:-$here/build-gpu-smoke}")"
part="${SMOKE_PART:-all}"
steps="${SMOKE_STEPS:-20}"
job_timeout="${SMOKE_TIMEOUT:-600}"
tol_early="${SMOKE_TOL_EARLY:-0.02}"
tol_late="${SMOKE_TOL_LATE:-0.05}"
early_steps="${SMOKE_EARLY_STEPS:-10}"
tol_grad="${SMOKE_TOL_GRAD_NORM:-0.10}"
jobs="$(nproc)"
out="$build/gpu-smoke"

if [[ "$part" != "all" && "$part" != "cpu" && "$part" != "gpu" ]]; then
  echo "smoke: SMOKE_PART must be all, gpu or cpu, got '$part'" >&2
  exit 2
fi

# compare_losses REF.jsonl GOT.jsonl LABEL: every step of REF present in GOT with a finite loss
# and gradient norm within the tolerances; prints one line per step. Exit 1 on any mismatch.
compare_losses() {
  python3 - "$1" "$2" "$3" "$tol_early" "$tol_late" "$early_steps" "$tol_grad" <<'PY'
import json, math, sys
ref_path, got_path, label = sys.argv[1:4]
tol_early, tol_late, early = float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
tol_grad = float(sys.argv[7])

def records(path):
    out = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                rec = json.loads(line)
                if not all(k in rec for k in ("step", "loss", "grad_norm")):
                    sys.exit(f"smoke: {path}:{n}: no step/loss/grad_norm in {line.strip()[:80]}")
                out[int(rec["step"])] = (float(rec["loss"]), float(rec["grad_norm"]))
    return out

def rel(got, ref):
    return abs(got - ref) / abs(ref) if ref != 0 else abs(got - ref)

ref, got = records(ref_path), records(got_path)
if not ref:
    sys.exit(f"smoke: {label}: no steps in the reference {ref_path}")
missing = sorted(set(ref) - set(got))
if missing:
    sys.exit(f"smoke: {label}: steps {missing} missing from {got_path}")
bad, worst_loss, worst_grad = [], 0.0, 0.0
print(f"   {label}: step  loss(ref)   loss(run)   rel.diff  tol    |g|(ref)   |g|(run)   rel.diff")
for s in sorted(ref):
    (rl, rg), (gl, gg) = ref[s], got[s]
    tol = tol_early if s <= early else tol_late
    dl, dg = rel(gl, rl), rel(gg, rg)
    ok = all(math.isfinite(x) for x in (rl, rg, gl, gg)) and dl <= tol and dg <= tol_grad
    worst_loss = max(worst_loss, dl if math.isfinite(dl) else math.inf)
    worst_grad = max(worst_grad, dg if math.isfinite(dg) else math.inf)
    print(f"   {label}: {s:4d}  {rl:9.5f}  {gl:10.5f}  {dl:9.2e}  {tol:.0e}  {rg:9.4f}  {gg:9.4f}"
          f"  {dg:9.2e}{'' if ok else '  MISMATCH'}")
    if not ok:
        bad.append(s)
if bad:
    sys.exit(f"smoke: {label}: loss or gradient norm beyond tolerance (loss {tol_early:g} to step "
             f"{early}, {tol_late:g} after; gradient norm {tol_grad:g}) at steps {bad} "
             f"({got_path} against {ref_path})")
print(f"   {label}: {len(ref)} steps agree; worst relative difference: loss {worst_loss:.2e}, "
      f"gradient norm {worst_grad:.2e}")
PY
}

# same_but_device GPU.json CPU.json: the two configs are identical except training.device.
same_but_device() {
  python3 - "$1" "$2" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
da, db = a.get("training", {}).pop("device", None), b.get("training", {}).pop("device", None)
if (da, db) != ("cuda", "cpu") or a != b:
    sys.exit(f"smoke: {sys.argv[1]} and {sys.argv[2]} must differ in training.device only "
             f"(cuda vs cpu); devices {da!r} vs {db!r}")
PY
}

# mean_tokens_per_s METRICS.jsonl: mean tokens/s over the steps after the first two (warm-up).
mean_tokens_per_s() {
  python3 - "$1" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
vals = [r["tokens_per_s"] for r in recs[2:]] or [r["tokens_per_s"] for r in recs]
print(f"{sum(vals) / len(vals):.0f}")
PY
}

# train_job NAME CONFIG NPROC THREADS: `dstrain launch` of NPROC ranks training CONFIG for $steps
# steps; rank 0's metrics in $out/NAME.jsonl, the job's output in $out/NAME.log.
train_job() {
  local name="$1" cfg="$2" n="$3" threads="$4"
  local bin="$build/bin/dstrain"
  rm -f "$out/$name.jsonl"
  echo "-- $name: $n rank(s), $cfg, $steps steps"
  local t0=$SECONDS
  if ! timeout "$job_timeout" "$bin" launch --nproc-per-node "$n" --env "OMP_NUM_THREADS=$threads" \
      --kill-timeout 5 -- "$bin" train --config "$cfg" --metrics "$out/$name.jsonl" \
      --max-steps "$steps" >"$out/$name.log" 2>&1; then
    tail -n 30 "$out/$name.log" >&2
    echo "smoke: training job $name failed (log: $out/$name.log)" >&2
    return 1
  fi
  echo "   done in $((SECONDS - t0)) s; tokens/s after warm-up (rank 0 metrics): $(mean_tokens_per_s "$out/$name.jsonl")"
}

# The CPU reference runs: N ranks, the zero2 config and (N >= 2) the tp2 one over N rounded down
# to even. Sets cpu_zero2_n / cpu_tp2_n for the comparisons.
cpu_references() {
  local n="$1" threads
  threads=$(( jobs / n > 0 ? jobs / n : 1 ))
  echo "== CPU reference runs ($n rank(s), $threads OpenMP thread(s) each)"
  train_job cpu-zero2 "$here/configs/gpu-smoke-zero2-cpu.json" "$n" "$threads"
  cpu_tp2_n=$(( n / 2 * 2 ))
  if (( cpu_tp2_n >= 2 )); then
    threads=$(( jobs / cpu_tp2_n > 0 ? jobs / cpu_tp2_n : 1 ))
    train_job cpu-tp2 "$here/configs/gpu-smoke-tp2-cpu.json" "$cpu_tp2_n" "$threads"
  fi
}

ensure_data() {
  if [[ ! -f "$here/data/kjv/train.bin" ]]; then
    "$here/scripts/prepare-kjv.sh" "$build/bin/dstrain"
  fi
}

same_but_device "$here/configs/gpu-smoke-zero2.json" "$here/configs/gpu-smoke-zero2-cpu.json"
same_but_device "$here/configs/gpu-smoke-tp2.json" "$here/configs/gpu-smoke-tp2-cpu.json"

if [[ "$part" == "cpu" ]]; then
  n="${SMOKE_NPROC:-2}"
  if [[ ! -x "$build/bin/dstrain" ]]; then
    echo "smoke: $build/bin/dstrain is missing: build the dstrain target first" >&2
    exit 2
  fi
  mkdir -p "$out"
  ensure_data
  cpu_references "$n"
  echo "== the same zero2 job with bf16 off, against the bf16 reference (bf16 noise must pass)"
  python3 - "$here/configs/gpu-smoke-zero2-cpu.json" "$out/cpu-zero2-fp32.json" <<'PY'
import json, os, sys
src, dst = sys.argv[1:3]
cfg = json.load(open(src))
cfg["bf16"]["enabled"] = False
for k in ("train", "val"):  # data paths are relative to the config's folder: make them absolute
    if k in cfg.get("data", {}):
        cfg["data"][k] = os.path.normpath(os.path.join(os.path.dirname(src), cfg["data"][k]))
json.dump(cfg, open(dst, "w"), indent=2)
PY
  train_job cpu-zero2-fp32 "$out/cpu-zero2-fp32.json" "$n" $(( jobs / n > 0 ? jobs / n : 1 ))
  compare_losses "$out/cpu-zero2.jsonl" "$out/cpu-zero2-fp32.jsonl" "fp32 vs bf16"
  echo "== the comparison rejects real differences"
  for off in loss:1.03 grad_norm:1.2; do
    python3 - "$out/cpu-zero2.jsonl" "$out/cpu-zero2-off.jsonl" "${off%%:*}" "${off##*:}" <<'PY'
import json, sys
with open(sys.argv[2], "w") as o:
    for l in open(sys.argv[1]):
        if l.strip():
            r = json.loads(l)
            r[sys.argv[3]] *= float(sys.argv[4])
            o.write(json.dumps(r) + "\n")
PY
    if compare_losses "$out/cpu-zero2.jsonl" "$out/cpu-zero2-off.jsonl" "off" >/dev/null 2>&1; then
      echo "smoke: the comparison accepted ${off%%:*} x ${off##*:}; it must reject it" >&2
      exit 1
    fi
    echo "   ${off%%:*} x ${off##*:} on every step is rejected, as it must be"
  done
  echo "smoke: CPU half passed ($n rank(s)); the GPU half needs a GPU box (SMOKE_PART=all)"
  exit 0
fi

gpus="${SMOKE_GPUS:-$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)}"
if [[ "$part" == "all" ]]; then
  echo "== configure and build ($build, CUDA ON)"
  cmake -S "$here" -B "$build" -G Ninja -DDSTRAIN_CUDA=ON >/dev/null
  cmake --build "$build" -j "$jobs" --target dstrain dstrain_cuda test_cuda_kernels test_cuda_allocator \
    test_gpt2_cuda test_comm_nccl test_block_cache gpu_bench test_llama_cuda_kernels test_llama_cuda
fi
mkdir -p "$out"

echo "== dstrain report"
"$build/bin/dstrain" report

if [[ "$part" == "all" ]]; then
  echo "== cuda tests ($gpus GPU(s))"
  log="$build/cuda-tests.log"
  ctest --test-dir "$build" -L cuda --output-on-failure 2>&1 | tee "$log"
  if [[ "$gpus" -gt 0 ]] && grep -q "(Skipped)" "$log"; then
    echo "smoke: cuda tests were SKIPPED although nvidia-smi lists GPUs: the build does not see them" >&2
    exit 1
  fi
fi
if [[ "$gpus" -lt 1 ]]; then
  echo "smoke: no GPU listed by nvidia-smi: nothing more to run (SMOKE_PART=cpu runs the CPU half)" >&2
  exit 1
fi

echo "== training on $gpus GPU(s) against the CPU run with as many ranks"
ensure_data
cpu_references "$gpus"
train_job gpu-zero2 "$here/configs/gpu-smoke-zero2.json" "$gpus" 1
compare_losses "$out/cpu-zero2.jsonl" "$out/gpu-zero2.jsonl" "zero2 x$gpus"
if (( cpu_tp2_n >= 2 )); then
  train_job gpu-tp2 "$here/configs/gpu-smoke-tp2.json" "$cpu_tp2_n" 1
  compare_losses "$out/cpu-tp2.jsonl" "$out/gpu-tp2.jsonl" "tp2 x$cpu_tp2_n"
else
  echo "-- tp=2 not run: it needs at least 2 GPUs"
fi

if [[ "$part" == "gpu" ]]; then
  echo "smoke: training passed on $gpus GPU(s) (the benchmark is the device script's own stage)"
  exit 0
fi
echo "== gpu_bench (one GPU; bf16 storage, then fp32 storage with bf16 and fp32 matmul math)"
"$build/bin/gpu_bench" --model 124m --batch 8 --seq 1024 --steps 5 --warmup 2 --storage bf16
"$build/bin/gpu_bench" --model 124m --batch 8 --seq 1024 --steps 5 --warmup 2 --math bf16
"$build/bin/gpu_bench" --model 350m --batch 4 --seq 1024 --steps 5 --warmup 2 --math bf16
"$build/bin/gpu_bench" --model 124m --batch 8 --seq 1024 --steps 5 --warmup 2 --math fp32
echo "smoke: passed on $gpus GPU(s)"
