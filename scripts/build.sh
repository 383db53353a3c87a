#!/usr/bin/env bash
# Configures and builds dstrain into build/ (the binary is build/bin/dstrain).
# Extra arguments go to CMake's configure step, e.g. scripts/build.sh -DDSTRAIN_CUDA=OFF
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
cmake --build build -j"$(nproc)"
