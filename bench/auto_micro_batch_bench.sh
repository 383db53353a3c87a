#!/usr/bin/env bash
# train_micro_batch_size_per_gpu "auto" against the micro-batches measured, on issue 4's S config
# (GPT-2, L=4, H=4, C=256, V=4096, T=128; the step_bench S shape) as a job config with the
# micro-batch "auto" and no train_batch_size (so accumulation 1 and a batch of one micro-batch):
#   1. the pick, as `dstrain config check` makes it (the same function `dstrain train` runs):
#      the largest micro-batch that fits MEM per rank, and, with CALIBRATE=1, the fastest by the
#      step-time model of this machine (`dstrain plan --calibrate` first);
#   2. every power-of-two micro-batch from 1 up to the largest that fits (at most MAX_MB), trained
#      for STEPS steps with `dstrain train` (one rank, THREADS OpenMP threads): the median ms/step
#      and tokens/s over the steps after the first, the fastest of PASSES runs;
#   3. each pick's tokens/s against the best measured: auto / best.
#
#   bench/auto_micro_batch_bench.sh [build-dir]
#     env: MEM=1GiB (the memory the plan is held to) STEPS=8 THREADS=2 MAX_MB=64 CALIBRATE=1
#          PASSES=2 (runs per micro-batch, the fastest kept)
#
# Prints figures, never pass/fail. On a shared machine the figures move with the load; the
# largest-that-fits rule does not look at time at all, so its ratio says how much the
# memory-bound pick leaves on the table on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
BIN="$BUILD/bin/dstrain"
MEM=${MEM:-1GiB}
STEPS=${STEPS:-8}
THREADS=${THREADS:-2}
MAX_MB=${MAX_MB:-64}
CALIBRATE=${CALIBRATE:-1}
PASSES=${PASSES:-2}
[ -x "$BIN" ] || { echo "auto_micro_batch_bench: no $BIN (build dstrain first, or pass the build dir)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

. bench/corpus.sh
train=$(bench_corpus configs/gpt2-tiny-cpu.json "$BIN" "$tmp")

# The S config: the tiny config's optimizer and data, issue 4's S shape, micro-batch "auto".
jq --arg train "$train" --argjson steps "$STEPS" '
    .train_micro_batch_size_per_gpu = "auto" | del(.train_batch_size) | del(.gradient_accumulation_steps) |
    .model = {type: "gpt2", n_layer: 4, n_head: 4, n_embd: 256, vocab_size: 4096, seq_len: 128} |
    .data = {train: $train} | del(.scheduler) |
    .training.steps = $steps | .training.eval_interval = 0 | .training.log_interval = 1 |
    del(.training.checkpoint_dir) | .training.checkpoint_interval = 0' \
    configs/gpt2-tiny-cpu.json > "$tmp/s.json"

# pick [FLAGS...]: the micro-batch config check picks; its reason to $tmp/reason.
pick() {
  OMP_NUM_THREADS=$THREADS "$BIN" config check "$tmp/s.json" --gpu-mem "$MEM" "$@" > "$tmp/resolved.json" 2> "$tmp/err" ||
    { cat "$tmp/err" >&2; exit 1; }
  grep -o '"auto" -> .*' "$tmp/err" | head -1 > "$tmp/reason"
  jq '.train_micro_batch_size_per_gpu' "$tmp/resolved.json"
}

echo "S config (GPT-2 L=4 H=4 C=256 V=4096 T=128), 1 rank, $THREADS thread(s), memory per rank $MEM," \
     "$STEPS steps per run, fastest of $PASSES; load $(cut -d' ' -f1-3 /proc/loadavg) at $(date -u +%H:%M:%S)"
largest=$(pick)
echo "auto (no calibration): micro-batch $largest: $(cat "$tmp/reason")"
calibrated=""
if [ "$CALIBRATE" = 1 ]; then
  OMP_NUM_THREADS=$THREADS "$BIN" plan --calibrate --config "$tmp/s.json" --threads "$THREADS" -o "$tmp/cal.json" \
      > "$tmp/cal.log" 2>&1 || { cat "$tmp/cal.log" >&2; exit 1; }
  calibrated=$(pick --calibration "$tmp/cal.json")
  echo "auto (calibrated):     micro-batch $calibrated: $(cat "$tmp/reason")"
fi
echo

# measure MB: the median ms/step and tokens/s after the first step of a run, "ms tok/s"; of PASSES
# runs, the fastest (the one other load on the machine disturbed least).
measure() {
  local mb=$1 best="" p
  for ((p = 0; p < PASSES; p++)); do
    rm -f "$tmp/m$mb.jsonl"
    OMP_NUM_THREADS=$THREADS "$BIN" train --config "$tmp/s.json" --set train_micro_batch_size_per_gpu="$mb" \
        --metrics "$tmp/m$mb.jsonl" > "$tmp/train$mb.log" 2>&1 || { tail -20 "$tmp/train$mb.log" >&2; exit 1; }
    local r
    r=$(jq -r -s '(.[1:] | map(.ms_per_step) | sort | .[length/2|floor]) as $ms |
                  (.[1:] | map(.tokens_per_s) | sort | .[length/2|floor]) as $t | "\($ms) \($t)"' "$tmp/m$mb.jsonl")
    if [ -z "$best" ] || awk -v a="${r%% *}" -v b="${best%% *}" 'BEGIN {exit !(a < b)}'; then best=$r; fi
  done
  echo "$best"
}

top=$largest
[ "$top" -le "$MAX_MB" ] || top=$MAX_MB
printf "%-12s %12s %12s %12s\n" micro-batch "plan peak" ms/step tokens/s
best_tps=0 best_mb=0
declare -A tps
for ((mb = 1; mb <= top; mb *= 2)); do
  read -r ms t <<< "$(measure "$mb")"
  tps[$mb]=$t
  peak=$(OMP_NUM_THREADS=$THREADS "$BIN" plan --config "$tmp/s.json" --world-size 1 --threads "$THREADS" \
           --set train_micro_batch_size_per_gpu="$mb" --json | jq '.peak.total / 1048576 * 10 | round / 10')
  printf "%-12s %9s MiB %12.1f %12.0f\n" "$mb" "$peak" "$ms" "$t"
  if awk -v a="$t" -v b="$best_tps" 'BEGIN {exit !(a > b)}'; then best_tps=$t best_mb=$mb; fi
done
echo
for name in largest calibrated; do
  mb=${!name}
  [ -n "$mb" ] || continue
  if [ -z "${tps[$mb]:-}" ]; then
    read -r ms t <<< "$(measure "$mb")"
    tps[$mb]=$t
    printf "%-12s %12s %12.1f %12.0f   (the pick, above MAX_MB)\n" "$mb" "" "$ms" "$t"
  fi
  awk -v n="$name" -v mb="$mb" -v a="${tps[$mb]}" -v b="$best_tps" -v bm="$best_mb" \
    'BEGIN {printf "auto (%s) = %d: %.0f tokens/s; best measured = %d: %.0f tokens/s; auto / best = %.3f\n", n, mb, a, bm, b, a / b}'
done
echo "done: load $(cut -d' ' -f1-3 /proc/loadavg) at $(date -u +%H:%M:%S)"
