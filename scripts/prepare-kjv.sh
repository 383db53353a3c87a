#!/usr/bin/env bash
# Prepares the main job's corpus: the King James Bible (public domain) from Debian's bible-kjv
# package, as byte-level token files data/kjv/train.bin and data/kjv/val.bin (last 10% = val).
#
#   scripts/prepare-kjv.sh [DSTRAIN_BIN]     (default: $DSTRAIN_BIN, build/bin/dstrain, PATH)
#
# Idempotent: does nothing when both token files exist. data/ is git-ignored.
# Needs `bible` (package bible-kjv, installed by scripts/install-deps.sh).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$root/data/kjv"

if [[ -f "$out/train.bin" && -f "$out/val.bin" ]]; then
  echo "prepare-kjv: $out/train.bin and $out/val.bin exist; nothing to do"
  exit 0
fi

bin="${1:-${DSTRAIN_BIN:-}}"
if [[ -z "$bin" ]]; then
  if [[ -x "$root/build/bin/dstrain" ]]; then
    bin="$root/build/bin/dstrain"
  elif command -v dstrain >/dev/null 2>&1; then
    bin="$(command -v dstrain)"
  else
    echo "prepare-kjv: no dstrain binary: build it (scripts/build.sh) or pass its path" >&2
    exit 1
  fi
fi
if ! command -v bible >/dev/null 2>&1; then
  echo "prepare-kjv: the 'bible' command is missing: install bible-kjv (scripts/install-deps.sh)" >&2
  exit 1
fi

mkdir -p "$out"
# Every verse is one line starting with its reference ("Ge1:1 ", "SSol1:1 ", "1Cor13:4 "): strip it.
tmp="$out/kjv.txt.tmp.$$"
trap 'rm -f "$tmp"' EXIT
bible -f 'Genesis 1:1-Revelation 22:21' | sed -E 's/^[1-3]?[A-Za-z]+[0-9]+:[0-9]+ //' > "$tmp"
lines=$(wc -l < "$tmp")
if (( lines < 31000 )); then
  echo "prepare-kjv: expected the 31102 verses of the KJV, got $lines lines" >&2
  exit 1
fi
if grep -qE '^[1-3]?[A-Za-z]+[0-9]+:[0-9]+ ' "$tmp"; then
  echo "prepare-kjv: some verse references were not stripped" >&2
  exit 1
fi
mv "$tmp" "$out/kjv.txt"
"$bin" data prepare --input "$out/kjv.txt" --output "$out" --val-fraction 0.1
