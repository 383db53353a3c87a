#!/usr/bin/env bash
# Runs one fuzz target for a fixed time (the `fuzz` ctest label; tests/fuzz/README.md).
#   run_fuzz.sh <fuzzer binary> <tests/fuzz dir> <work dir> <seconds>
# Replays every committed input first (corpus/<name>/ and regressions/<name>/: a crash there
# fails at once), then mutates for <seconds> with new inputs kept in <work dir>/<name>/corpus
# (never in the source tree). Prints the executions and exits non-zero on any crash, leak,
# timeout (an input taking over 10 s) or out-of-memory, naming the saved input.
set -uo pipefail
bin="$1" src="$2" work="$3" seconds="$4"
name="$(basename "$bin")"
run="$work/$name"
mkdir -p "$run/corpus" "$run/artifacts"
dirs=("$run/corpus")
for d in "$src/corpus/$name" "$src/regressions/$name"; do
  [[ -d "$d" ]] && dirs+=("$d")
done
dict=()
[[ -f "$src/dict/$name.dict" ]] && dict=(-dict="$src/dict/$name.dict")
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$src/lsan.supp}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
log="$run/log.txt"
"$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
  -artifact_prefix="$run/artifacts/" "${dict[@]}" "${dirs[@]}" >"$log" 2>&1
rc=$?
execs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)"
corpus="$(ls "$run/corpus" | wc -l)"
if ((rc != 0)); then
  tail -n 60 "$log"
  echo "FUZZ FAIL $name: exit $rc after ${execs:-?} executions; inputs: $(ls "$run/artifacts" | tr '\n' ' ')"
  echo "  saved under $run/artifacts/ (keep it under tests/fuzz/regressions/$name/ once fixed)"
  exit 1
fi
echo "fuzz $name: ${execs:-?} executions in ${seconds} s, 0 crashes, $corpus new corpus inputs"
