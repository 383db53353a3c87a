#!/usr/bin/env bash
# LoRA against full fine-tuning of the same Llama, same run: step time, and each rank's peak bytes
# per allocator tag, measured (the trainer's peaks) and planned (dstrain plan --json), side by side.
# The model is a Llama of L=8, NH=8, KV=4, C=512, I=1376, V=256 (byte-level KJV, seq_len 256,
# 27.5M parameters) so the weights dominate; LoRA r=16, alpha=32 on every linear layer (PEFT's
# "all-linear"); the same data, seed, micro-batch (4) and 2 OpenMP threads; fp32 and bf16.
#
#   bench/lora_bench.sh [build-dir]      env: STEPS=8
#
# Printed per run: the median ms per step after the first, then params/grads/optimizer/
# activations/workspace MiB measured and (in brackets) planned. Not part of the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
BIN="$BUILD/bin/dstrain"
BASE=configs/llama-tiny-cpu.json
STEPS=${STEPS:-8}
[ -x "$BIN" ] || { echo "lora_bench: no $BIN (build dstrain first, or pass the build dir)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. bench/corpus.sh
train=$(bench_corpus "$BASE" "$BIN" "$tmp")

# run NAME LORA(0|1) PRECISION
run() {
  local name=$1 lora=$2 prec=$3
  jq --arg train "$train" --argjson steps "$STEPS" --argjson lora "$lora" --arg prec "$prec" '
      .model = (.model + {n_layer: 8, n_head: 8, n_kv_head: 4, n_embd: 512, intermediate_size: 1376, seq_len: 256}) |
      .train_micro_batch_size_per_gpu = 4 | .gradient_accumulation_steps = 1 | .data = {train: $train} |
      .training.steps = $steps | .training.eval_interval = 0 | .training.log_interval = 1 | del(.scheduler) |
      (if $prec == "bf16" then .bf16 = {enabled: true} else . end) |
      (if $lora == 1 then .lora = {r: 16, alpha: 32, target_modules: "all-linear"} else . end)' "$BASE" > "$tmp/$name.json"
  OMP_NUM_THREADS=2 "$BIN" train --config "$tmp/$name.json" --metrics "$tmp/$name.jsonl" > "$tmp/$name.log" 2>&1 ||
    { tail -20 "$tmp/$name.log" >&2; exit 1; }
  OMP_NUM_THREADS=2 "$BIN" plan --config "$tmp/$name.json" --world-size 1 --json > "$tmp/$name.plan.json"
  jq -r -s --slurpfile plan "$tmp/$name.plan.json" --arg name "$name" '
      (.[1:] | map(.ms_per_step) | sort | .[length/2|floor]) as $ms | .[-1] as $last | $plan[0].ranks[0] as $p |
      def mib(x): (x / 1048576 * 10 | round / 10);
      "\($name)\t\($ms | round)" +
      ([ "params", "grads", "optimizer", "activations", "workspace" ] |
        map("\t\(mib($last["peak_bytes_" + .])) [\(mib($p[.]))]") | join(""))' "$tmp/$name.jsonl" |
    awk -F'\t' '{printf "%-12s %8s %18s %18s %18s %18s %18s\n", $1, $2, $3, $4, $5, $6, $7}'
}

printf "%-12s %8s %18s %18s %18s %18s %18s\n" run ms/step "params MiB" "grads MiB" "optimizer MiB" "activations MiB" \
  "workspace MiB"
for prec in fp32 bf16; do
  run "full-$prec" 0 "$prec"
  run "lora-$prec" 1 "$prec"
done
