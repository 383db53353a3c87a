#!/usr/bin/env bash
# SFT throughput, packed against padded, in one run: the same JSONL examples prepared by
# `dstrain data prepare --format sft` twice, packed (examples back to back in seq_len windows, as
# the token file naturally is) and with --pad-to SEQ (each example alone in its row, the padding
# masked out), then trained for the same steps on the same model. Prints, per layout, the median
# over the steps after the first 3 of tokens/s (every position the model computes) and counted
# tokens/s (targets that count in the loss, the metrics' counted_tokens_per_s), and the tokens
# the epoch holds. Synthetic examples: a random prompt of 10-120 characters and a random
# completion of 10-110 (byte tokenizer, plain template), so every example fits SEQ = 256.
#
#   bench/sft_bench.sh [BUILD_DIR] [STEPS] [EXAMPLES]      (default build, 30, 4000)
#
# Needs build/bin/dstrain and /usr/bin/python3. The machine may be shared: read the ratio
# between the two rows of one run, not the absolute figures.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
build=$(cd "${1:-$here/build}" && pwd)
steps=${2:-30}
examples=${3:-4000}
seq=256
dstrain="$build/bin/dstrain"
[[ -x "$dstrain" ]] || { echo "missing $dstrain: build the dstrain target" >&2; exit 2; }
work=$(mktemp -d /tmp/sft_bench.XXXXXX)
trap 'rm -rf "$work"' EXIT

/usr/bin/python3 - "$work/sft.jsonl" "$examples" <<'PY'
import json, random, string, sys
random.seed(1)
chars = string.ascii_letters + string.digits + " .,"
with open(sys.argv[1], "w") as f:
    for _ in range(int(sys.argv[2])):
        p = "".join(random.choice(chars) for _ in range(random.randint(10, 120)))
        c = "".join(random.choice(chars) for _ in range(random.randint(10, 110)))
        f.write(json.dumps({"prompt": p, "completion": c}) + "\n")
PY
"$dstrain" data prepare --format sft --input "$work/sft.jsonl" --output "$work/packed" --val-fraction 0 | tail -1
"$dstrain" data prepare --format sft --input "$work/sft.jsonl" --output "$work/padded" --val-fraction 0 \
  --pad-to "$seq" | tail -1

for layout in packed padded; do
  cat > "$work/$layout.json" <<JSON
{"train_micro_batch_size_per_gpu": 8,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
 "model": {"type": "gpt2", "n_layer": 4, "n_head": 4, "n_embd": 256, "vocab_size": 256, "seq_len": $seq},
 "data": {"train": "$work/$layout/train.bin"},
 "training": {"steps": $steps, "seed": 1, "log_interval": 1}}
JSON
  "$dstrain" train --config "$work/$layout.json" --metrics "$work/$layout.jsonl" > "$work/$layout.out" 2>&1 \
    || { tail -20 "$work/$layout.out" >&2; exit 1; }
done

/usr/bin/python3 - "$work" <<'PY'
import json, statistics, sys, os
work = sys.argv[1]
print(f"{'layout':8} {'tokens/s':>10} {'counted tokens/s':>17} {'counted share':>14} {'epoch tokens':>13}")
for layout in ("packed", "padded"):
    rows = [json.loads(l) for l in open(os.path.join(work, layout + ".jsonl")) if l.strip()][3:]
    tps = statistics.median(r["tokens_per_s"] for r in rows)
    cps = statistics.median(r["counted_tokens_per_s"] for r in rows)
    share = sum(r["counted_tokens"] for r in rows) / sum(r["tokens_per_s"] * r["ms_per_step"] / 1000 for r in rows)
    n = (os.path.getsize(os.path.join(work, layout, "train.bin")) - 1024) // 2
    print(f"{layout:8} {tps:10.0f} {cps:17.0f} {share:14.3f} {n:13d}")
PY
