#!/usr/bin/env bash
# Downstream-evaluation throughput (`dstrain eval --task hellaswag`), batched against one item at
# a time, with PyTorch as the peer, in one run: GPT-2 124M (12 layers, 768 wide, vocabulary 50257;
# its untrained initial weights, from a config alone: the cost does not depend on the weights)
# scores the same HellaSwag-format items. The items are synthetic (random words; contexts of
# 60-100 bytes, endings of 20-40, byte-level tokens: about the lengths of HellaSwag's validation
# rows in GPT-2 tokens), since the real file cannot be downloaded here. Prints items/s for
# dstrain --batch 1 (4 rows a forward) and --batch 8 (32 rows), and PyTorch 1.13's
# (bench/torch_hellaswag.py: batch 1 pads each item to its longest row as llm.c's hellaswag.py
# does; batch 8 uses dstrain's batch shape), fp32, no_grad.
#
#   bench/eval_bench.sh [BUILD_DIR] [ITEMS]      (default build, 32)
#
# Torch runs in its fastest environment here: OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset,
# glibc malloc. The machine may be shared: read the ratios within one run.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
build=$(cd "${1:-$here/build}" && pwd)
items=${2:-32}
dstrain="$build/bin/dstrain"
[[ -x "$dstrain" ]] || { echo "missing $dstrain: build the dstrain target" >&2; exit 2; }
work=$(mktemp -d /tmp/eval_bench.XXXXXX)
trap 'rm -rf "$work"' EXIT

/usr/bin/python3 - "$work/items.jsonl" "$items" <<'PY'
import json, random, sys
random.seed(1)
words = "the of and to in he that is it for his was with as they be at on but not had from by all".split()
def text(lo, hi):
    n = random.randint(lo, hi)
    s = ""
    while len(s) < n:
        s += random.choice(words) + " "
    return s[:n].strip()
with open(sys.argv[1], "w") as f:
    for i in range(int(sys.argv[2])):
        f.write(json.dumps({"ctx": text(60, 100), "endings": [text(20, 40) for _ in range(4)], "label": i % 4}) + "\n")
PY
cat > "$work/gpt2.json" <<JSON
{"train_micro_batch_size_per_gpu": 1,
 "model": {"type": "gpt2", "n_layer": 12, "n_head": 12, "n_embd": 768, "vocab_size": 50257, "seq_len": 1024},
 "training": {"seed": 1}}
JSON

run_dstrain() {  # items/s; the log (with the positions of a batch) stays in $work/err$1
  "$dstrain" eval --task hellaswag --data "$work/items.jsonl" --config "$work/gpt2.json" --tokenizer byte --batch "$1" \
    --limit "$items" > "$work/out$1" 2> "$work/err$1" || { cat "$work/err$1" >&2; exit 1; }
  sed -n 's/.*(\([0-9.]*\) items\/s).*/\1/p' "$work/err$1"
}
run_torch() {
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE -u LD_PRELOAD /usr/bin/python3 "$here/bench/torch_hellaswag.py" \
    --data "$work/items.jsonl" --limit "$items" --batch "$1" --positions "$2" | sed -n 's/.*items_per_s \([0-9.]*\).*/\1/p'
}
d1=$(run_dstrain 1)
d8=$(run_dstrain 8)
positions=$(sed -n 's/.* rows of \([0-9]*\) positions.*/\1/p' "$work/err8")
cmp -s "$work/out1" "$work/out8" || { echo "batch 1 and batch 8 scored differently:" >&2; cat "$work/out1" "$work/out8" >&2; }
t1=$(run_torch 1 0)
t8=$(run_torch 8 "$positions")
printf "GPT-2 124M, %s HellaSwag-format items, %s positions a row (dstrain, torch batch 8)\n" "$items" "$positions"
printf "%-22s %10s\n" "scorer" "items/s"
printf "%-22s %10s\n" "dstrain --batch 1" "$d1" "dstrain --batch 8" "$d8" "torch batch 1 (llm.c)" "$t1" "torch batch 8" "$t8"
/usr/bin/python3 -c "import sys; d1,d8,t1,t8=map(float,sys.argv[1:]); print(f'batched/one-at-a-time: dstrain {d8/d1:.2f}x, torch {t8/t1:.2f}x; dstrain/torch: batch 1 {d1/t1:.2f}x, batch 8 {d8/t8:.2f}x')" "$d1" "$d8" "$t1" "$t8"
