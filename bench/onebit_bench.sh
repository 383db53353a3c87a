#!/usr/bin/env bash
# 1-bit Adam against Adam on N ranks (default 4) over Gloo on loopback (DSTRAIN_COMM_BACKEND=gloo),
# the same run back to back: bytes sent per step (rank 0's comm_bytes_sent, median of the steps
# after the warm-up), step time (median ms_per_step over the same steps), and the loss (mean of
# the last 10 of STEPS steps). The model is the README's byte-level GPT-2 on the KJV at 4 layers
# of width 256 (3.4M parameters, so the gradient exchange is a visible part of a step), micro-batch
# 2 of 64 tokens, one OpenMP thread per rank. Both share a linear warm-up to lr 3e-3 over 100
# steps; 1-bit Adam's freeze_step is 100 (its warm-up Adam has no bias correction, as DeepSpeed's).
# Prints figures; not a test.
#
#   bench/onebit_bench.sh [build-dir]     env: NPROC=4 STEPS=300
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
BIN="$BUILD/bin/dstrain"
NPROC=${NPROC:-4}
STEPS=${STEPS:-300}
[ -x "$BIN" ] || { echo "onebit_bench: no $BIN (build dstrain first)" >&2; exit 2; }
[ -f data/kjv/train.bin ] || { echo "onebit_bench: data/kjv/train.bin missing (scripts/prepare-kjv.sh)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

write_config() {  # NAME OPTIMIZER_JSON
  cat >"$tmp/$1.json" <<JSON
{
  "train_batch_size": $((2 * NPROC)),
  "train_micro_batch_size_per_gpu": 2,
  "gradient_clipping": 1.0,
  "optimizer": $2,
  "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 100, "warmup_type": "linear", "warmup_max_lr": 0.003}},
  "zero_optimization": {"stage": 0},
  "model": {"type": "gpt2", "n_layer": 4, "n_head": 4, "n_embd": 256, "vocab_size": 256, "seq_len": 64},
  "data": {"train": "$PWD/data/kjv/train.bin"},
  "training": {"steps": $STEPS, "seed": 1, "log_interval": 1, "device": "cpu"}
}
JSON
}
write_config adam '{"type": "Adam", "params": {"lr": 0.003, "betas": [0.9, 0.99], "weight_decay": 0.0}}'
write_config onebit '{"type": "OneBitAdam", "params": {"lr": 0.003, "betas": [0.9, 0.99], "freeze_step": 100}}'

echo "onebit_bench: $NPROC ranks over gloo (loopback), $STEPS steps, $(nproc) cores"
printf '%-11s %14s %12s %10s %9s\n' optimizer "bytes/step" "ms/step" "loss" "wall s"
for name in adam onebit; do
  t0=$(date +%s.%N)
  DSTRAIN_COMM_BACKEND=gloo "$BIN" launch --nproc-per-node "$NPROC" --master-port 0 --env OMP_NUM_THREADS=1 \
    --env DSTRAIN_COMM_BACKEND=gloo -- "$BIN" train --config "$tmp/$name.json" --metrics "$tmp/$name.jsonl" \
    >"$tmp/$name.log" 2>&1 || { tail -20 "$tmp/$name.log" >&2; exit 1; }
  t1=$(date +%s.%N)
  python3 - "$tmp/$name.jsonl" "$name" "$t0" "$t1" <<'PY'
import json, statistics, sys
m = [json.loads(l) for l in open(sys.argv[1])]
after = [r for r in m if r["step"] > 100]
print(f'{sys.argv[2]:<11} {statistics.median(r["comm_bytes_sent"] for r in after):>14.0f} '
      f'{statistics.median(r["ms_per_step"] for r in after):>12.1f} '
      f'{sum(r["loss"] for r in m[-10:]) / 10:>10.4f} {float(sys.argv[4]) - float(sys.argv[3]):>9.1f}')
PY
done
