#!/usr/bin/env bash
# Hugging Face tokenizer.json encode throughput (MB/s and tokens/s, 1 and 2 threads) against the
# GPT-2 BPE path on the same text in the same run, and against Hugging Face's own JavaScript
# implementation (@huggingface/tokenizers under node, one thread) when npm can fetch it. The
# tokenizer.json files are GPT-2's vocabulary in GPT-2's, Llama-3's and Qwen2's layouts
# (tests/data/hf_tokenizer_make.py); the text is the King James Bible (data/kjv/kjv.txt, from
# scripts/prepare-kjv.sh, else `bible`).
#
#   bench/hf_tokenizer_bench.sh [BUILD_DIR] [REPS]      (default build, 3)
#
# Needs: build/bin/tokenizer_bench, data/gpt2 (scripts/fetch-gpt2-tokenizer.sh), python3;
# optional: node + npm for the JS rows. Read ratios between rows of one run: the machine may be
# shared.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
build=$(cd "${1:-$here/build}" && pwd)
reps=${2:-3}
bench="$build/bin/tokenizer_bench"
[[ -x "$bench" ]] || { echo "missing $bench: build the tokenizer_bench target" >&2; exit 2; }
work=$(mktemp -d /tmp/hf_tokenizer_bench.XXXXXX)
trap 'rm -rf "$work"' EXIT

if [[ -f "$here/data/kjv/kjv.txt" ]]; then
  cp "$here/data/kjv/kjv.txt" "$work/kjv.txt"
else
  bible -f 'Genesis 1:1-Revelation 22:21' | sed -E 's/^[1-3]?[A-Za-z]+[0-9]+:[0-9]+ //' > "$work/kjv.txt"
fi
python3 "$here/tests/data/hf_tokenizer_make.py" "$here/data/gpt2" "$work/hf"

echo "== dstrain (median of $reps)"
"$bench" --input "$work/kjv.txt" --gpt2 "$here/data/gpt2" --hf "$work/hf/gpt2" \
  --hf "$work/hf/llama3" --hf "$work/hf/qwen2" --threads 1,2 --reps "$reps" | grep -v '^byte'

# One pass: the JS encoder runs near 0.2 MB/s, a pass takes about 20 s per tokenizer.
echo "== @huggingface/tokenizers@0.2.0 under node $(node --version 2>/dev/null || echo '(missing)') (one pass)"
if (cd "$work" && npm install --silent --ignore-scripts @huggingface/tokenizers@0.2.0 >/dev/null 2>&1); then
  for k in gpt2 llama3 qwen2; do
    NODE_PATH="$work/node_modules" node "$here/bench/hf_tokenizer_bench.js" "$work/hf/$k" "$work/kjv.txt" 1
  done
else
  echo "(npm could not install @huggingface/tokenizers: no JS rows)"
fi
