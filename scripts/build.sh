#!/usr/bin/env bash
# Configures and builds dstrain into build/ (the binary is build/bin/dstrain): the `dstrain`
# target, plus the CUDA module (build/bin/libdstrain_cuda.so) where nvidia-smi lists a GPU or
# DSTRAIN_CUDA=ON is asked for. The tests, benchmarks and fuzz targets are scripts/test.sh's.
#   scripts/build.sh [--all] [CMake configure arguments, e.g. -DDSTRAIN_CUDA=OFF]
#   --all builds every target (what scripts/test.sh builds).
set -euo pipefail
cd "$(dirname "$0")/.."
all=0
if [[ "${1:-}" == "--all" ]]; then
  all=1
  shift
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
if ((all)); then
  cmake --build build -j"$(nproc)"
  exit 0
fi
targets=(dstrain)
gpus="$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)"
if grep -qs '^DSTRAIN_HAVE_CUDA:INTERNAL=ON' build/CMakeCache.txt &&
   { [[ "$gpus" -gt 0 ]] || grep -qs '^DSTRAIN_CUDA:STRING=ON' build/CMakeCache.txt; }; then
  targets+=(dstrain_cuda)
fi
cmake --build build -j"$(nproc)" --target "${targets[@]}"
