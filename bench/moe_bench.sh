#!/usr/bin/env bash
# Tokens/s of one mixture of experts on this machine's cores three ways: one process (ep 1, every
# expert, 2 OpenMP threads), two data-parallel ranks (dp 2: every rank every expert) and two
# expert-parallel ranks (ep 2 over dp 2: 4 experts a rank, tokens exchanged by all-to-all), one
# thread per rank; the same global batch (16 sequences of 128 bytes) and model
# (configs/mixtral-tiny-cpu.json: L=4, NH=4, KV=2, C=128, 8 experts of I=176, top 2, byte-level KJV).
#
#   bench/moe_bench.sh [build-dir]      env: STEPS=12
#
# Printed per layout: tokens/s, ms per step and rank 0's ms in the token all-to-alls (the wall-clock
# breakdown's expert_wait; medians of the steps after the first), the largest rank's measured
# peak, the final loss. Not part of the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
BIN="$BUILD/bin/dstrain"
CONFIG=configs/mixtral-tiny-cpu.json
STEPS=${STEPS:-12}
[ -x "$BIN" ] || { echo "moe_bench: no $BIN (build dstrain first, or pass the build dir)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

. bench/corpus.sh
train=$(bench_corpus "$CONFIG" "$BIN" "$tmp")

# run NAME RANKS EP THREADS: trains STEPS steps and prints the layout's row.
run() {
  local name=$1 ranks=$2 ep=$3 threads=$4
  jq --arg train "$train" --argjson ep "$ep" --argjson steps "$STEPS" '
      .train_batch_size = 16 | .train_micro_batch_size_per_gpu = 8 | del(.gradient_accumulation_steps) |
      .expert_parallel = {size: $ep} | .data = {train: $train} | .training.steps = $steps |
      .training.eval_interval = 0 | .training.log_interval = 1 | .wall_clock_breakdown = true | del(.scheduler)' "$CONFIG" > "$tmp/$name.json"
  local cmd=("$BIN" train --config "$tmp/$name.json" --metrics "$tmp/$name.jsonl" --metrics-all-ranks)
  if [ "$ranks" -gt 1 ]; then
    "$BIN" launch --nproc-per-node "$ranks" --env "OMP_NUM_THREADS=$threads" -- "${cmd[@]}" > "$tmp/$name.log" 2>&1 ||
      { tail -20 "$tmp/$name.log" >&2; exit 1; }
  else
    OMP_NUM_THREADS=$threads "${cmd[@]}" > "$tmp/$name.log" 2>&1 || { tail -20 "$tmp/$name.log" >&2; exit 1; }
  fi
  jq -r -s --arg name "$name" '
      (.[1:] | map(.tokens_per_s) | sort | .[length/2|floor]) as $tps |
      (.[1:] | map(.ms_per_step) | sort | .[length/2|floor]) as $ms |
      (.[1:] | map(.time_expert_wait_ms) | sort | .[length/2|floor]) as $a2a |
      .[-1] as $last | ([$last | to_entries[] | select(.key | test("^peak_bytes_total_rank")) | .value] + [$last.peak_bytes_total]) | max as $peak |
      "\($name)\t\($tps | round)\t\($ms | round)\t\($a2a * 10 | round / 10)\t\($peak / 1048576 * 100 | round / 100)\t\($last.loss * 10000 | round / 10000)"' \
      "$tmp/$name.jsonl" | awk -F'\t' '{printf "%-26s %10s %10s %12s %14s %10s\n", $1, $2, $3, $4, $5, $6}'
}

printf "%-26s %10s %10s %12s %14s %10s\n" layout tok/s ms/step "a2a ms" "peak MiB/rank" loss
run "ep1 (1 rank x 2 threads)" 1 1 2
run "dp2 (2 ranks x 1 thread)" 2 1 1
run "ep2 (2 ranks x 1 thread)" 2 2 1
