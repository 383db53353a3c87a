#!/usr/bin/env bash
# 16-bit communication measured (issue 14): the README's model (configs/gpt2-tiny-cpu.json) on the
# King James Bible for STEPS steps at NPROC ranks of data parallelism, in fp32 and in bf16 over
# each backend: the shm backend (sums every rank's bf16 input in fp32, rounds once) and Gloo
# (dstrain's ring over Gloo's pairs: each hop adds in fp32 and rounds to bf16, n - 1 roundings
# per element), and fp32 over both. Prints per run the final loss, the worst relative gap of its
# loss curve to the fp32 shm run's, the median ms/step and rank 0's bytes sent per step (the
# metrics' comm_bytes_sent).
#
#   bench/precision_bench.sh [build-dir]     env: NPROC=4 STEPS=100 THREADS=1
#
# Needs data/kjv (scripts/prepare-kjv.sh) and jq. Not part of the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
BIN="$BUILD/bin/dstrain"
NPROC=${NPROC:-4}
STEPS=${STEPS:-100}
THREADS=${THREADS:-1}
[ -x "$BIN" ] || { echo "precision_bench: no $BIN (build dstrain first, or pass the build dir)" >&2; exit 2; }
[ -f data/kjv/train.bin ] || { echo "precision_bench: no data/kjv: run scripts/prepare-kjv.sh" >&2; exit 2; }
export OMP_WAIT_POLICY=PASSIVE
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

run() {  # name backend precision
  local name=$1 backend=$2 prec=$3
  jq --argjson steps "$STEPS" --arg prec "$prec" --arg root "$PWD" '
      .data = {train: ($root + "/data/kjv/train.bin")} | .training.steps = $steps |
      .training.eval_interval = 0 | if $prec == "fp32" then . else .[$prec] = {enabled: true} end' \
      configs/gpt2-tiny-cpu.json > "$tmp/$name.json"
  DSTRAIN_COMM_BACKEND=$backend "$BIN" launch --nproc-per-node "$NPROC" --master-port 0 \
    --env "OMP_NUM_THREADS=$THREADS" --env "DSTRAIN_COMM_BACKEND=$backend" -- \
    "$BIN" train --config "$tmp/$name.json" --metrics "$tmp/$name.jsonl" > "$tmp/$name.log" 2>&1 ||
    { cat "$tmp/$name.log" >&2; exit 1; }
}

run fp32-shm shm fp32
run bf16-shm shm bf16
run fp32-gloo gloo fp32
run bf16-gloo gloo bf16

echo "precision_bench: configs/gpt2-tiny-cpu.json, $STEPS steps, $NPROC ranks x $THREADS thread; load: $(cut -d' ' -f1-3 /proc/loadavg)"
printf "%-10s %12s %22s %10s %16s\n" run final_loss "worst gap to fp32-shm" ms/step sent/step
for name in fp32-shm bf16-shm fp32-gloo bf16-gloo; do
  jq -r -s --slurpfile ref "$tmp/fp32-shm.jsonl" --arg name "$name" '
      . as $m |
      ([range(0; length)] | map((($m[.].loss - $ref[.].loss) / $ref[.].loss) | fabs) | max * 10000 | round / 100) as $gap |
      ([.[1:][] | .ms_per_step] | sort | .[length/2|floor] | . * 10 | round / 10) as $ms |
      ([.[1:][] | .comm_bytes_sent] | sort | .[length/2|floor] / 1048576 * 100 | round / 100) as $sent |
      "\($name)\t\(.[-1].loss * 10000 | round / 10000)\t\($gap)%\t\($ms)\t\($sent) MiB"' "$tmp/$name.jsonl" |
    awk -F'\t' '{printf "%-10s %12s %22s %10s %16s\n", $1, $2, $3, $4, $5}'
done
