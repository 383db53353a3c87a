#!/usr/bin/env bash
# What the monitors cost a training step: the same short run of configs/gpt2-tiny-cpu.json (data
# from scripts/prepare-kjv.sh) with every monitor on (tensorboard, csv_monitor,
# wall_clock_breakdown and a --metrics file) and with all of them off, alternating, REPS runs
# each. Prints per side the fastest run's median ms per step (the ratio is of those), the median
# and mean over all steps, and each run's median. Figures, not a test.
#
#   bench/monitor_overhead.sh [BUILD_DIR] [REPS]     env: STEPS (default 40), THREADS (default 2)
#   THREADS=1 OMP_WAIT_POLICY=PASSIVE bench/monitor_overhead.sh    (on a machine others load)
#
# The step time is measured from outside, as the interval between consecutive "step N/M" console
# lines (log_interval 1, so both sides print every step; bash's $EPOCHREALTIME stamps each line
# as it arrives): the trainer's own ms_per_step ends before the step is reported, so it would not
# see the monitors' writes at all. The first two steps (start-up, the first step's plan note) are
# left out; validation is off (eval_interval 0) so that no step evaluates.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
build=$(cd "${1:-$here/build}" && pwd)
reps=${2:-3}
steps=${STEPS:-40}
threads=${THREADS:-2}
dstrain=$build/bin/dstrain
[[ -x "$dstrain" ]] || { echo "missing $dstrain: build the dstrain target" >&2; exit 2; }
[[ -f "$here/data/kjv/train.bin" ]] || { echo "missing data/kjv: run scripts/prepare-kjv.sh" >&2; exit 2; }
work=$(mktemp -d /tmp/monitor_overhead.XXXXXX)

python3 - "$here" "$work" "$steps" <<'PY'
import json, sys
here, work, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
c = json.load(open(f"{here}/configs/gpt2-tiny-cpu.json"))
c["data"] = {"train": f"{here}/data/kjv/train.bin"}
c["training"].update(steps=steps, eval_interval=0, log_interval=1)
json.dump(c, open(f"{work}/off.json", "w"), indent=1)
c["wall_clock_breakdown"] = True
c["tensorboard"] = {"enabled": True, "output_path": f"{work}/monitors", "job_name": "tb"}
c["csv_monitor"] = {"enabled": True, "output_path": f"{work}/monitors", "job_name": "csv"}
json.dump(c, open(f"{work}/on.json", "w"), indent=1)
PY

# Runs one side; appends its step intervals (ms, steps 3..N) to $work/<side>.ms and to
# $work/<side>.<rep>.ms.
run_side() {
  local side=$1 rep=$2 extra=()
  [[ $side == on ]] && extra=(--metrics "$work/metrics.$rep.jsonl")
  if ! OMP_NUM_THREADS=$threads "$dstrain" train --config "$work/$side.json" "${extra[@]}" 2>"$work/$side.$rep.err" |
    while IFS= read -r line; do
      if [[ $line == step* ]]; then echo "$EPOCHREALTIME ${line%%|*}"; fi
    done >"$work/$side.$rep.stamps"; then
    echo "FAILED: $side run $rep" >&2
    tail -5 "$work/$side.$rep.err" >&2
    exit 1
  fi
  awk 'NR > 1 { if (NR > 2) printf "%.3f\n", ($1 - prev) * 1000 } { prev = $1 }' \
    "$work/$side.$rep.stamps" >"$work/$side.$rep.ms"
  cat "$work/$side.$rep.ms" >>"$work/$side.ms"
}

median() { sort -g "$1" | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
mean() { awk '{s+=$1} END {printf "%.1f", s/NR}' "$1"; }

echo "monitor_overhead: $steps steps x $reps runs per side, alternating, OMP_NUM_THREADS=$threads; load $(cut -d' ' -f1-3 /proc/loadavg)"
for ((r = 1; r <= reps; r++)); do
  run_side off "$r"
  run_side on "$r"
done
[[ -n $(ls "$work/monitors/tb"/events.out.tfevents.* 2>/dev/null) ]] || { echo "no TensorBoard event file written" >&2; exit 1; }
# Each run's median step; the fastest run of a side is the one other load disturbed least (a
# shared machine slows whole runs at a time), so the ratio is of those. All steps pooled beside.
declare -A best per_run
for side in off on; do
  for ((r = 1; r <= reps; r++)); do
    m=$(median "$work/$side.$r.ms")
    per_run[$side]+=" $(printf '%.1f' "$m")"
    if [[ -z ${best[$side]:-} ]] || awk -v a="$m" -v b="${best[$side]}" 'BEGIN {exit !(a < b)}'; then best[$side]=$m; fi
  done
done
printf '%-18s %14s %12s %12s %7s\n' "" "fastest run ms" "median ms" "mean ms" "steps"
for side in off on; do
  printf '%-18s %14.1f %12.1f %12s %7d\n' "all monitors $side" "${best[$side]}" "$(median "$work/$side.ms")" \
    "$(mean "$work/$side.ms")" "$(wc -l <"$work/$side.ms")"
done
awk -v a="${best[on]}" -v b="${best[off]}" 'BEGIN {printf "ratio on/off (fastest runs): %.3fx (%+.2f ms/step)\n", a / b, a - b}'
for side in off on; do echo "per run, $side (median ms):${per_run[$side]}"; done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg); files in $work"
