# Shell helpers shared by the launch benchmarks (source it; it defines functions only):
#   bench_args NAME [BUILD_DIR] [REPS] [TORCH_REPS]
#                          sets build, reps, torch_reps, dstrain, worker (checked to exist) and a
#                          fresh scratch directory work=/tmp/NAME.XXXXXX
#   now                    nanoseconds since the epoch
#   median X...            the median of the numbers given
#   time_cmd REPS CMD...   runs CMD REPS times (its output to $work/out) and prints the median
#                          wall time in seconds; fails, showing the output's tail, if any run fails
# `work` must name a scratch directory.

bench_args() {
  local name=$1
  build=$(cd "${2:-$here/build}" && pwd)
  reps=${3:-5}
  torch_reps=${4:-1}
  dstrain=$build/bin/dstrain
  worker=$build/bin/ds_test_worker
  for f in "$dstrain" "$worker"; do
    [[ -x "$f" ]] || { echo "missing $f: build the dstrain and ds_test_worker targets" >&2; exit 2; }
  done
  work=$(mktemp -d "/tmp/$name.XXXXXX")
}
now() { date +%s%N; }
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
time_cmd() {
  local n=$1; shift
  local times=()
  for ((i = 0; i < n; i++)); do
    local t0; t0=$(now)
    if ! "$@" >"$work/out" 2>&1; then
      echo "FAILED: $*" >&2
      tail -20 "$work/out" >&2
      return 1
    fi
    local t1; t1=$(now)
    times+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.4f", (b - a) / 1e9}')")
  done
  median "${times[@]}"
}
