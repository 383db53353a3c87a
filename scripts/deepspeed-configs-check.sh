#!/usr/bin/env bash
# Runs every JSON file under a folder of a DeepSpeed checkout (tests/ unless told) through
# `dstrain config check` and
# reports how many validate. A config is tried for world sizes 1, 2, 4, 8, 16 (its batch triad
# holds for some data-parallel size, as DeepSpeed resolves it against the real world); it counts
# as valid at the first that passes. Files that are not job configs (a JSON object without any
# DeepSpeed batch or section key, e.g. a tokenizer vocabulary) and templates that are not JSON
# until a script substitutes their placeholders are listed apart.
#
#   scripts/deepspeed-configs-check.sh DEEPSPEED_CHECKOUT [DSTRAIN_BIN] [REV] [UNDER]
#
# DEEPSPEED_CHECKOUT is a git checkout (or bare repository) of deepspeedai/DeepSpeed; REV (default
# HEAD) is read with `git show`, so no work tree is needed and nothing of DeepSpeed's is copied
# into this repository. UNDER (default tests) is the folder searched; "" searches the whole tree,
# e.g. for microsoft/DeepSpeedExamples, whose training configs lie beside each example:
#
#   scripts/deepspeed-configs-check.sh /path/DeepSpeedExamples.git build/bin/dstrain HEAD "" Prints one line per file ("ok N", "FAIL" with the errors, "not a config")
# and a summary; exits 1 when any config fails.
set -uo pipefail
ds="${1:?usage: $0 DEEPSPEED_CHECKOUT [DSTRAIN_BIN] [REV]}"
bin="${2:-$(dirname "$0")/../build/bin/dstrain}"
rev="${3:-HEAD}"
under="${4-tests}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
ok=0 fail=0 other=0 templates=0
while IFS= read -r f; do
  out="$tmp/$(echo "$f" | tr '/' '_')"
  git -C "$ds" show "$rev:$f" >"$out"
  if ! grep -qE '"(train_batch_size|train_micro_batch_size_per_gpu|zero_optimization|fp16|bf16|optimizer)"' "$out"; then
    echo "not a config  $f"
    other=$((other + 1))
    continue
  fi
  # A template a script fills in (bare placeholders such as BATCH_SIZE_PER_GPU) is not JSON:
  # neither DeepSpeed nor dstrain can read it as it stands.
  if ! python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$out" 2>/dev/null; then
    echo "template (not JSON)  $f"
    templates=$((templates + 1))
    continue
  fi
  passed=""
  for n in 1 2 4 8 16; do
    if "$bin" config check -n "$n" "$out" >/dev/null 2>"$tmp/err"; then
      passed="$n"
      break
    fi
  done
  if [[ -n "$passed" ]]; then
    echo "ok (world $passed, $(grep -c '^warning' "$tmp/err") warnings)  $f"
    ok=$((ok + 1))
  else
    echo "FAIL  $f"
    "$bin" config check "$out" 2>&1 >/dev/null | grep -v '^warning' | sed 's/^/    /'
    fail=$((fail + 1))
  fi
done < <(git -C "$ds" ls-tree -r --name-only "$rev" ${under:+"$under"} | grep '\.json$')
echo "$ds $(git -C "$ds" rev-parse --short "$rev"): $ok of $((ok + fail)) configs validate ($((100 * ok / (ok + fail > 0 ? ok + fail : 1)))%), $fail fail; $templates templates (not JSON), $other other JSON files"
((fail == 0))
