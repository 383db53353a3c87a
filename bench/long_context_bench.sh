#!/usr/bin/env bash
# The long-context row: the longest sequence that trains under one memory limit per rank, on 2
# ranks, without context parallelism (cp 1 x dp 2: each rank a whole sequence) and with it
# (cp 2 ring and cp 2 Ulysses: each rank half of every sequence), on the tiny Llama
# (configs/llama-tiny-cpu.json: L=4, NH=4, KV=2, C=128, byte-level KJV), micro-batch 1, ZeRO 1,
# one OpenMP thread per rank.
#
#   bench/long_context_bench.sh [build-dir]      env: LIMIT_MIB=96 STEPS=4 STEP_T=512 MAX_T=32768
#
# For each layout `dstrain plan --json` finds the longest seq_len (a multiple of STEP_T) whose
# largest rank fits LIMIT_MIB; then the layout trains STEPS steps at that length under the real
# launcher. Printed per layout: the sequence, the plan's peak and the largest measured peak per
# rank (the allocator's, over the run), tokens/s and ms per step, and the share of the step rank 0
# spent blocked on the cp group (the wall-clock breakdown's context_wait: the ring's transfers
# not hidden behind its compute, Ulysses' all-to-alls), medians of the steps after the first.
# Not part of the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
BIN="$BUILD/bin/dstrain"
CONFIG=configs/llama-tiny-cpu.json
LIMIT_MIB=${LIMIT_MIB:-96}
STEPS=${STEPS:-4}
STEP_T=${STEP_T:-512}
MAX_T=${MAX_T:-32768}
[ -x "$BIN" ] || { echo "long_context_bench: no $BIN (build dstrain first, or pass the build dir)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

. bench/corpus.sh
train=$(bench_corpus "$CONFIG" "$BIN" "$tmp")

# config NAME CP METHOD T: writes $tmp/NAME.json (2 ranks: dp = 2 / cp).
config() {
  local name=$1 cp=$2 method=$3 T=$4
  jq --arg train "$train" --argjson cp "$cp" --arg method "$method" --argjson T "$T" --argjson steps "$STEPS" '
      .train_micro_batch_size_per_gpu = 1 | .train_batch_size = 2 | del(.gradient_accumulation_steps) |
      .zero_optimization = {stage: 1} | .context_parallel = {size: $cp, method: $method} |
      .model.seq_len = $T | .data = {train: $train} | .training.steps = $steps |
      .training.eval_interval = 0 | .training.log_interval = 1 | .wall_clock_breakdown = true |
      del(.scheduler)' "$CONFIG" > "$tmp/$name.json"
}

# planned NAME: the largest rank's planned bytes.
planned() {
  "$BIN" plan --config "$tmp/$1.json" --world-size 2 --threads 1 --json | jq '[.ranks[].total] | max'
}

limit=$((LIMIT_MIB * 1048576))

# run NAME CP METHOD T: trains STEPS steps and prints the layout's row.
run() {
  local name=$1 cp=$2 method=$3 T=$4 plan_bytes
  config "$name" "$cp" "$method" "$T"
  plan_bytes=$(planned "$name")
  "$BIN" launch --nproc-per-node 2 --env OMP_NUM_THREADS=1 -- \
    "$BIN" train --config "$tmp/$name.json" --metrics "$tmp/$name.jsonl" --metrics-all-ranks \
    > "$tmp/$name.log" 2>&1 || { tail -20 "$tmp/$name.log" >&2; exit 1; }
  jq -r -s --arg name "$name" --argjson T "$T" --argjson plan "$plan_bytes" '
      (.[1:] | map(.tokens_per_s) | sort | .[length/2|floor]) as $tps |
      (.[1:] | map(.ms_per_step) | sort | .[length/2|floor]) as $ms |
      (.[1:] | map(.time_context_wait_ms / .ms_per_step) | sort | .[length/2|floor]) as $wait |
      .[-1] as $last | [$last["peak_bytes_total_rank0"], $last["peak_bytes_total_rank1"]] | max as $peak |
      "\($name)\t\($T)\t\($plan / 1048576 * 100 | round / 100)\t\($peak / 1048576 * 100 | round / 100)\t\($tps | round)\t\($ms | round)\t\($wait * 1000 | round / 10)%"' \
      "$tmp/$name.jsonl" | awk -F'\t' '{printf "%-22s %8s %12s %14s %10s %10s %10s\n", $1, $2, $3, $4, $5, $6, $7}'
}

printf "memory limit %d MiB per rank, 2 ranks, micro-batch 1\n" "$LIMIT_MIB"
printf "%-22s %8s %12s %14s %10s %10s %10s\n" layout seq_len "plan MiB" "measured MiB" tok/s ms/step "cp wait"
declare -A longest
for l in 1:ring 2:ring 2:ulysses; do
  IFS=: read -r cp method <<< "$l"
  name="cp${cp}_${method}"
  best=0
  for ((T = STEP_T; T <= MAX_T; T += STEP_T)); do
    config "$name" "$cp" "$method" "$T"
    [ "$(planned "$name")" -le "$limit" ] || break
    best=$T
  done
  longest[$name]=$best
  if [ "$best" -eq 0 ]; then
    printf "%-22s %8s\n" "$name" "none fits"
    continue
  fi
  run "$name" "$cp" "$method" "$best"
done
# The three at one length (the shortest longest), for the cost per token of each method.
T=${longest[cp1_ring]}
for v in "${longest[@]}"; do [ "$v" -gt 0 ] && [ "$v" -lt "$T" ] && T=$v; done
if [ "$T" -gt 0 ]; then
  echo "all at seq_len $T:"
  run "cp1@$T" 1 ring "$T"
  run "cp2_ring@$T" 2 ring "$T"
  run "cp2_ulysses@$T" 2 ulysses "$T"
fi
