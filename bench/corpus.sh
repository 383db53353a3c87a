# Sourced by the training benchmarks (zero_bench.sh, layout_bench.sh): bench_corpus CONFIG BIN TMP
# prints the absolute path of the config's training token file, or, when it does not exist yet
# (scripts/prepare-kjv.sh makes it), of a stand-in tokenized from this repository's docs in TMP.
bench_corpus() {
  local config=$1 bin=$2 tmp=$3 train
  train=$(jq -r '.data.train' "$config")
  case "$train" in /*) ;; *) train="$(dirname "$config")/$train" ;; esac
  if [ ! -f "$train" ]; then
    cat docs/*.md docs/*.md docs/*.md docs/*.md > "$tmp/corpus.txt"
    "$bin" data prepare --input "$tmp/corpus.txt" --output "$tmp/data" >/dev/null
    train="$tmp/data/train.bin"
  fi
  realpath "$train"
}
