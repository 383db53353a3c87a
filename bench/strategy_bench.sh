#!/usr/bin/env bash
# The step-time model held to measured step times (issue 20's acceptance): for each world size in
# WORLDS, calibrate this machine (dstrain plan --calibrate) for the GPT-2 small model of
# configs/gpt2-small-zero2.json (L=6, H=6, C=384, T=256, V=256) at a global batch of BATCH
# sequences, predict every layout that fits (tp x pp x dp x ZeRO stage x micro-batch x
# checkpointing: dstrain plan --recommend), run every one of them for STEPS steps through
# dstrain launch (--recommend --measure --top ALL) and print per world size: the table, the
# median absolute error, whether the top pick is within 10% of the fastest measured layout, and
# Spearman's rank correlation (bench/strategy_stats.py). Each layout's figure is its fastest step
# after the first, as the calibration's are the fastest repetitions: on a shared machine that is
# what other load disturbs least.
#
#   bench/strategy_bench.sh [build-dir]    env: WORLDS="2 4" BATCH=4 STEPS=4 OUT=dir
#                                              THREADS=1 RECALIBRATE=1 LIMIT=N PASSES=2
#
# The layouts are measured in a shuffled order (--measure-shuffle), PASSES times (another order
# each pass), each keeping its fastest: a load change during the run then scatters over the
# ranking instead of lining up with it.
#
# OUT keeps calib<W>.json, measured<W>.json (the --measure JSON) and load<W>.txt (uptime before
# and after), so the figures can be re-analysed against a changed model without measuring again:
#   bench/strategy_stats.py OUT/measured4.json [predicted.json]
# The machine may be shared: load averages are printed with the figures. Not part of the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
BIN="$BUILD/bin/dstrain"
CONFIG=configs/gpt2-small-zero2.json
WORLDS=${WORLDS:-"2 4"}
BATCH=${BATCH:-4}
STEPS=${STEPS:-4}
THREADS=${THREADS:-1}
PASSES=${PASSES:-2}
RECALIBRATE=${RECALIBRATE:-1}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
[ -x "$BIN" ] || { echo "strategy_bench: no $BIN (build dstrain first, or pass the build dir)" >&2; exit 2; }
export OMP_WAIT_POLICY=PASSIVE
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

. bench/corpus.sh
train=$(bench_corpus "$CONFIG" "$BIN" "$tmp")

for w in $WORLDS; do
  cfg="$OUT/config$w.json"
  # Every rank data-parallel, BATCH / w sequences each: the global batch the search keeps.
  jq --arg train "$train" --argjson batch "$BATCH" --argjson mb $((BATCH / w)) '
      .train_batch_size = $batch | .train_micro_batch_size_per_gpu = $mb |
      del(.gradient_accumulation_steps) | .data = {train: $train} | .training.eval_interval = 0 |
      del(.training.checkpoint_dir) | .training.checkpoint_interval = 0 | del(.scheduler)' \
      "$CONFIG" > "$cfg"
  echo "== $w ranks: load $(cut -d' ' -f1-3 /proc/loadavg) at $(date -u +%H:%M:%S)" | tee "$OUT/load$w.txt"
  if [ "$RECALIBRATE" = 1 ] || [ ! -f "$OUT/calib$w.json" ]; then
    "$BIN" plan --calibrate --config "$cfg" --nproc-per-node "$w" --threads "$THREADS" -o "$OUT/calib$w.json"
  fi
  "$BIN" plan --recommend --config "$cfg" --world-size "$w" --gpu-mem 16GiB --threads "$THREADS" \
    --calibration "$OUT/calib$w.json" --measure --measure-steps "$STEPS" --measure-shuffle --measure-passes "$PASSES" --top "${LIMIT:-100000}" --json \
    > "$OUT/measured$w.json" 2> "$OUT/measure$w.log"
  echo "   done: load $(cut -d' ' -f1-3 /proc/loadavg) at $(date -u +%H:%M:%S)" | tee -a "$OUT/load$w.txt"
  /usr/bin/python3 bench/strategy_stats.py "$OUT/measured$w.json"
done
echo "results in $OUT"
