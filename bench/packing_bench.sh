#!/usr/bin/env bash
# Document-aware packing's cost: step time with data.packing "document" against "none" on the same
# data, same model, same run of this script (docs/data.md, Document-aware packing).
#
#   bench/packing_bench.sh [build-dir]     env: STEPS=8 VERSES=8 SEQ=512 B=4 THREADS=1
#
# The corpus: data/kjv/kjv.txt (scripts/prepare-kjv.sh) cut into documents of VERSES verses each
# (about 35 GPT-2 tokens a verse, so 8 verses make documents of ~280 tokens and a 512-token window
# holds two or three), tokenized with GPT-2's BPE (data/gpt2, scripts/fetch-gpt2-tokenizer.sh),
# each document begun by <|endoftext|> (50256). Models: a small GPT-2 (learned positions) and a
# small Llama (RoPE, 2 kv heads), L=4, C=256, NH=4, V=50257, T=SEQ, micro-batch B, one process,
# THREADS OpenMP threads. Printed per model and packing: median ms per step and tokens/s over the
# steps after the first, CPU seconds per step, and the CPU ratio document / none. Not part of the test
# suite.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
BIN="$BUILD/bin/dstrain"
STEPS=${STEPS:-8}
VERSES=${VERSES:-8}
SEQ=${SEQ:-512}
B=${B:-4}
THREADS=${THREADS:-1}
[ -x "$BIN" ] || { echo "packing_bench: no $BIN (build dstrain first, or pass the build dir)" >&2; exit 2; }
[ -f data/kjv/kjv.txt ] || { echo "packing_bench: no data/kjv/kjv.txt (run scripts/prepare-kjv.sh)" >&2; exit 2; }
[ -f data/gpt2/encoder.json ] || [ -f data/gpt2/vocab.json ] ||
  { echo "packing_bench: no GPT-2 vocabulary in data/gpt2 (run scripts/fetch-gpt2-tokenizer.sh)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

mkdir -p "$tmp/docs"
split -l "$VERSES" -d -a 5 data/kjv/kjv.txt "$tmp/docs/doc_"
"$BIN" data prepare --tokenizer gpt2 --vocab data/gpt2 --input "$tmp"/docs/doc_* --output "$tmp/data" \
  --val-fraction 0 --no-progress > "$tmp/prepare.log"
ndocs=$(ls "$tmp/docs" | wc -l)

# config NAME FAMILY PACKING: writes $tmp/NAME.json.
config() {
  local name=$1 family=$2 packing=$3
  jq -n --arg train "$tmp/data/train.bin" --arg family "$family" --arg packing "$packing" \
      --argjson T "$SEQ" --argjson B "$B" --argjson steps "$STEPS" '
    {train_micro_batch_size_per_gpu: $B, gradient_accumulation_steps: 1,
     optimizer: {type: "AdamW", params: {lr: 0.0006}},
     model: ({type: $family, n_layer: 4, n_head: 4, n_embd: 256, vocab_size: 50257, seq_len: $T} +
             (if $family == "llama" then {n_kv_head: 2, intermediate_size: 704} else {} end)),
     data: ({train: $train, packing: $packing} + (if $packing == "document" then {document_token: 50256} else {} end)),
     training: {steps: $steps, seed: 1, eval_interval: 0, log_interval: 1, device: "cpu"}}' > "$tmp/$name.json"
}

# run NAME: trains and prints "median_ms tokens_per_s cpu_s_per_step": the wall-clock figures are the
# median over the steps after the first; the CPU seconds (user + system of the whole process,
# start-up included) divided by the steps are steadier on a busy machine.
run() {
  local cpu
  cpu=$( { TIMEFORMAT='%U %S'; time OMP_NUM_THREADS=$THREADS "$BIN" train --config "$tmp/$1.json" \
             --metrics "$tmp/$1.jsonl" > "$tmp/$1.log" 2>&1; } 2>&1 ) || { tail -20 "$tmp/$1.log" >&2; exit 1; }
  jq -r -s --arg cpu "$cpu" --argjson steps "$STEPS" '
      (.[1:] | map(.ms_per_step) | sort | .[length/2|floor]) as $ms |
      (.[1:] | map(.tokens_per_s) | sort | .[length/2|floor]) as $tps |
      ($cpu | split(" ") | map(tonumber) | add / $steps) as $c | "\($ms) \($tps) \($c)"' "$tmp/$1.jsonl"
}

printf "%d documents of %d verses, T=%d, B=%d, %d steps, %d threads\n" "$ndocs" "$VERSES" "$SEQ" "$B" "$STEPS" "$THREADS"
printf "%-8s %-10s %10s %10s %14s %12s\n" model packing "ms/step" "tokens/s" "CPU s/step" "CPU vs none"
for family in gpt2 llama; do
  # Interleaved, twice each, so a change in the machine's load hits both alike.
  for round in 1 2; do
    none_cpu=
    for packing in none document; do
      config "${family}_${packing}" "$family" "$packing"
      read -r m t c <<< "$(run "${family}_${packing}")"
      [ "$packing" = none ] && none_cpu=$c
      printf "%-8s %-10s %10.1f %10.0f %14.3f %12s\n" "$family" "$packing" "$m" "$t" "$c" \
        "$(awk -v a="$c" -v b="$none_cpu" 'BEGIN{printf "%.3f", a/b}')"
    done
  done
done
