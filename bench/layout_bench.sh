#!/usr/bin/env bash
# Tokens/s and peak memory per rank for each 4-rank layout (tp x pp x dp) on the GPT-2 small config
# (configs/gpt2-small-zero2.json: L=6, H=6, C=384, T=256, V=256) with ZeRO stage 1, the same
# global batch of 32 sequences (micro-batch 4, so G = 8 / dp), under the real launcher with one
# OpenMP thread per rank; then the pipeline bubble of a 2-stage pipeline (2 ranks) for m = 1, 2, 4,
# 8 micro-batches, measured (1 - compute / schedule time on stage 0) beside the (pp-1)/(m+pp-1)
# of a balanced pipeline.
#
#   bench/layout_bench.sh [build-dir]      env: STEPS=4 LAYOUTS="tp:pp:dp ..." SWEEP=1
#
# Tokens/s and the bubble are medians over the steps after the first (rank 0's clock). Peak bytes
# are the allocator's per-rank peaks over the run: the smallest and the largest rank's total.
# 4 ranks share this machine's 2 cores, so the 4-rank times measure the layouts' CPU work and
# communication more than their parallel speed. Not part of the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
BIN="$BUILD/bin/dstrain"
CONFIG=configs/gpt2-small-zero2.json
STEPS=${STEPS:-4}
LAYOUTS=${LAYOUTS:-"1:1:4 2:1:2 1:2:2 2:2:1 1:4:1"}
SWEEP=${SWEEP:-1}
[ -x "$BIN" ] || { echo "layout_bench: no $BIN (build dstrain first, or pass the build dir)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

. bench/corpus.sh
train=$(bench_corpus "$CONFIG" "$BIN" "$tmp")

# run NAME TP PP DP BATCH: one training run; leaves $tmp/NAME.jsonl.
run() {
  local name=$1 tp=$2 pp=$3 dp=$4 batch=$5
  jq --arg train "$train" --argjson tp "$tp" --argjson pp "$pp" --argjson batch "$batch" \
     --argjson steps "$STEPS" '
      .zero_optimization.stage = 1 | .zero_optimization.reduce_bucket_size = 1e6 |
      .tensor_parallel = {size: $tp} | .pipeline = {stages: $pp} |
      .train_batch_size = $batch | del(.gradient_accumulation_steps) | .data = {train: $train} |
      .training.steps = $steps | .training.eval_interval = 0 | del(.training.checkpoint_dir) |
      .training.checkpoint_interval = 0 | del(.scheduler)' "$CONFIG" > "$tmp/$name.json"
  "$BIN" launch --nproc-per-node $((tp * pp * dp)) --env OMP_NUM_THREADS=1 -- \
    "$BIN" train --config "$tmp/$name.json" --metrics "$tmp/$name.jsonl" --metrics-all-ranks \
    > "$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log" >&2; exit 1; }
}
median() { jq -s "[.[1:][] | $1] | sort | .[length/2|floor]" "$2"; }

printf "%-16s %10s %10s %14s %14s %10s %10s\n" layout tok/s ms/step "min rank MiB" "max rank MiB" bubble model
for l in $LAYOUTS; do
  IFS=: read -r tp pp dp <<< "$l"
  name="tp${tp}_pp${pp}_dp${dp}"
  run "$name" "$tp" "$pp" "$dp" 32
  world=$((tp * pp * dp)) m=$((8 / dp))
  jq -r -s --argjson w "$world" --argjson pp "$pp" --argjson m "$m" --arg name "$name" '
      (.[1:] | map(.tokens_per_s) | sort | .[length/2|floor]) as $tps |
      (.[1:] | map(.ms_per_step) | sort | .[length/2|floor]) as $ms |
      (if $pp > 1 then (.[1:] | map(.pipeline_bubble) | sort | .[length/2|floor] * 1000 | round / 1000)
       else "-" end) as $bubble |
      (if $pp > 1 then (($pp - 1) / ($m + $pp - 1) * 1000 | round / 1000) else "-" end) as $model |
      .[-1] as $last | [range(0; $w) | $last["peak_bytes_total_rank\(.)"] / 1048576] as $t |
      "\($name)\t\($tps | round)\t\($ms | round)\t\($t | min * 100 | round / 100)\t\($t | max * 100 | round / 100)\t\($bubble)\t\($model)"' \
      "$tmp/$name.jsonl" | awk -F'\t' '{printf "%-16s %10s %10s %14s %14s %10s %10s\n", $1, $2, $3, $4, $5, $6, $7}'
done

[ "$SWEEP" = 1 ] || exit 0
echo
echo "pipeline bubble, 2 stages (2 ranks), micro-batch 4:"
printf "%-4s %10s %10s %10s\n" m tok/s measured "(pp-1)/(m+pp-1)"
for m in 1 2 4 8; do
  run "sweep$m" 1 2 1 $((4 * m))
  printf "%-4s %10s %10s %10s\n" "$m" "$(median .tokens_per_s "$tmp/sweep$m.jsonl" | jq round)" \
    "$(median .pipeline_bubble "$tmp/sweep$m.jsonl" | jq '. * 1000 | round / 1000')" \
    "$(jq -n "1 / ($m + 1) * 1000 | round / 1000")"
done
