#!/usr/bin/env bash
# GPU smoke test for a box with G >= 1 GPUs: what CI would run there, as far as the GPU path goes
# today (docs/gpu.md). Builds with CUDA ON (unless BUILD already has it), then:
#   1. dstrain report: the GPUs, their memory, driver, CUDA runtime, NCCL version;
#   2. every `cuda` test (kernels vs their CPU twins, device allocator, GPT-2 on one GPU vs the
#      CPU run: first losses, gradients, AdamW steps; NCCL collectives over all visible GPUs);
#   3. bench/gpu_bench: tokens/s and MFU of GPT-2 124M and 350M training steps on GPU 0.
# Not yet here, because the trainer refuses training.device "cuda" (docs/gpu.md, "What GPU
# training still needs"): `dstrain launch` over all G GPUs with ZeRO-2 and tp=2 against the CPU
# run's losses. The script says so at the end instead of pretending.
#
#   tests/gpu/smoke.sh [BUILD_DIR]        (default: build-gpu-smoke)
# Exit status: non-zero when the build, a cuda test or the benchmark fails; 0 otherwise.
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-$here/build-gpu-smoke}"
jobs="$(nproc)"

echo "== configure and build ($build, CUDA ON)"
cmake -S "$here" -B "$build" -G Ninja -DDSTRAIN_CUDA=ON >/dev/null
cmake --build "$build" -j "$jobs" --target dstrain test_cuda_kernels test_cuda_allocator \
  test_gpt2_cuda test_comm_nccl test_block_cache gpu_bench

echo "== dstrain report"
"$build/bin/dstrain" report

gpus="$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)"
echo "== cuda tests ($gpus GPU(s) listed by nvidia-smi)"
log="$build/cuda-tests.log"
ctest --test-dir "$build" -L cuda --output-on-failure 2>&1 | tee "$log"
if [[ "$gpus" -gt 0 ]] && grep -q "(Skipped)" "$log"; then
  echo "smoke: cuda tests were SKIPPED although nvidia-smi lists GPUs: the build does not see them" >&2
  exit 1
fi

echo "== gpu_bench (one GPU, fp32 model)"
"$build/bin/gpu_bench" --model 124m --batch 8 --seq 1024 --steps 5 --warmup 2
"$build/bin/gpu_bench" --model 350m --batch 4 --seq 1024 --steps 5 --warmup 2

echo "== not run: dstrain launch over $gpus GPU(s) (ZeRO-2, tp=2) vs the CPU losses:"
echo "   the trainer does not accept training.device \"cuda\" yet (docs/gpu.md)."
