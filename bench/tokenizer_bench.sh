#!/usr/bin/env bash
# Tokenizer encode throughput, MB of text per second on 1 and 2 cores: GPT-2's BPE and
# SentencePiece (dstrain's, through the data prepare pipeline) against Debian's spm_encode on the
# same text and model in the same run, on the King James Bible and on a 100 MB mix of English
# (the KJV) and code (this repository's C++ sources and docs), built here.
#
#   bench/tokenizer_bench.sh [BUILD_DIR] [REPS]      (default build, 3)
#
# Needs: build/bin/tokenizer_bench, data/gpt2 (scripts/fetch-gpt2-tokenizer.sh), `bible`
# (bible-kjv), spm_train/spm_encode (sentencepiece). The machine may be shared: read the ratios
# between rows of one run, not the absolute figures.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
build=$(cd "${1:-$here/build}" && pwd)
reps=${2:-3}
bench="$build/bin/tokenizer_bench"
[[ -x "$bench" ]] || { echo "missing $bench: build the tokenizer_bench target" >&2; exit 2; }
work=$(mktemp -d /tmp/tokenizer_bench.XXXXXX)
trap 'rm -rf "$work"' EXIT
source "$here/bench/bench_lib.sh"

bible -f 'Genesis 1:1-Revelation 22:21' | sed -E 's/^[1-3]?[A-Za-z]+[0-9]+:[0-9]+ //' > "$work/kjv.txt"
find "$here/runtime" "$here/lib" "$here/apps" "$here/docs" -name '*.cpp' -o -name '*.h' -o -name '*.md' \
  | sort | xargs cat > "$work/code.txt"
: > "$work/mix.txt"
while (( $(stat -c %s "$work/mix.txt") < 100000000 )); do
  cat "$work/kjv.txt" "$work/code.txt" >> "$work/mix.txt"
done
truncate -s 100000000 "$work/mix.txt"
spm_train --input="$work/kjv.txt" --model_prefix="$work/kjv" --vocab_size=8000 --model_type=bpe \
  --byte_fallback=true --character_coverage=1.0 --minloglevel=2 >/dev/null 2>&1

echo "== dstrain (median of $reps)"
"$bench" --input "$work/kjv.txt" --input "$work/mix.txt" --gpt2 "$here/data/gpt2" \
  --spm "$work/kjv.model" --threads 1,2 --reps "$reps"

echo "== spm_encode, same model (median of $reps; 2 cores = two processes on the two halves)"
split -n l/2 -d "$work/mix.txt" "$work/mixhalf."
split -n l/2 -d "$work/kjv.txt" "$work/kjvhalf."
for f in kjv mix; do
  mb=$(awk -v b="$(stat -c %s "$work/$f.txt")" 'BEGIN {print b / 1e6}')
  one=$(time_cmd "$reps" sh -c "spm_encode --model='$work/kjv.model' --output_format=id < '$work/$f.txt' > /dev/null")
  two=$(time_cmd "$reps" sh -c "spm_encode --model='$work/kjv.model' --output_format=id < '$work/${f}half.00' > /dev/null &
                                spm_encode --model='$work/kjv.model' --output_format=id < '$work/${f}half.01' > /dev/null; wait")
  awk -v f="$f" -v mb="$mb" -v one="$one" -v two="$two" \
    'BEGIN {printf "spm_encode     %-5s %7.1f MB   1 process   %7.2f MB/s   2 processes %7.2f MB/s\n", f, mb, mb/one, mb/two}'
done
