#!/usr/bin/env bash
# Step time and peak memory per rank for each ZeRO stage at N ranks (default 4), on the GPT-2
# small config (configs/gpt2-small-zero3.json: L=6, H=6, C=384, T=256, V=256), under the real
# launcher with one OpenMP thread per rank. Prints one table row per (stage, rank).
#
#   bench/zero_bench.sh [config] [build-dir]      env: NPROC=4 STEPS=6 THREADS=1 PRECISION=fp32|bf16|fp16
#
# The step time is the median ms_per_step of the steps after the first (rank 0's clock: every
# rank waits for the others in the collectives). Peak bytes are each rank's allocator peaks per
# tag over the run (params, grads, optimizer, comm, total). sent/step is the bytes rank 0 sends per
# step through the collectives (the metrics' comm_bytes_sent: the ring algorithm's count, median
# of the steps after the first). PRECISION=bf16 (or fp16) trains with 16-bit storage and
# communication. Not part of the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=${1:-configs/gpt2-small-zero3.json}
BUILD=${2:-build}
BIN="$BUILD/bin/dstrain"
NPROC=${NPROC:-4}
STEPS=${STEPS:-6}
THREADS=${THREADS:-1}
PRECISION=${PRECISION:-fp32}
[ -x "$BIN" ] || { echo "zero_bench: no $BIN (build dstrain first, or pass the build dir)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

. bench/corpus.sh
train=$(bench_corpus "$CONFIG" "$BIN" "$tmp")

echo "zero_bench: $CONFIG, $NPROC ranks, $PRECISION"
printf "%-6s %-5s %10s %12s %12s %12s %12s %12s %14s\n" stage rank ms/step params grads optimizer comm total sent/step
for stage in 0 1 2 3; do
  jq --arg train "$train" --argjson stage "$stage" --argjson steps "$STEPS" --arg prec "$PRECISION" '
      .zero_optimization.stage = $stage | .data = {train: $train} |
      .training.steps = $steps | .training.eval_interval = 0 | del(.training.checkpoint_dir) |
      .training.checkpoint_interval = 0 | .scheduler = null | del(.scheduler) |
      del(.bf16) | del(.fp16) | if $prec == "fp32" then . else .[$prec] = {enabled: true} end' \
      "$CONFIG" > "$tmp/cfg$stage.json"
  "$BIN" launch --nproc-per-node "$NPROC" --env "OMP_NUM_THREADS=$THREADS" -- \
    "$BIN" train --config "$tmp/cfg$stage.json" --metrics "$tmp/m$stage.jsonl" --metrics-all-ranks \
    > "$tmp/log$stage.txt" 2>&1 || { cat "$tmp/log$stage.txt" >&2; exit 1; }
  ms=$(jq -s '[.[1:][] | .ms_per_step] | sort | .[length/2|floor]' "$tmp/m$stage.jsonl")
  sent=$(jq -s '[.[1:][] | .comm_bytes_sent] | sort | .[length/2|floor] / 1048576 * 100 | round / 100' "$tmp/m$stage.jsonl")
  for ((r = 0; r < NPROC; r++)); do
    jq -r -s --argjson r "$r" --arg stage "$stage" --arg ms "$ms" --arg sent "$sent" '
        .[-1] as $m | def mib(t): ($m["peak_bytes_\(t)_rank\($r)"] / 1048576 * 100 | round / 100 | tostring) + " MiB";
        "\($stage)\t\($r)\t\($ms | tonumber | . * 10 | round / 10)\t\(mib("params"))\t\(mib("grads"))\t\(mib("optimizer"))\t\(mib("comm"))\t\(mib("total"))\t\(if $r == 0 then $sent + " MiB" else "-" end)"' \
        "$tmp/m$stage.jsonl" | awk -F'\t' '{printf "%-6s %-5s %10s %12s %12s %12s %12s %12s %14s\n", $1, $2, $3, $4, $5, $6, $7, $8, $9}'
  done
done
