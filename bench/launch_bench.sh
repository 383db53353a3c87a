#!/usr/bin/env bash
# Start-up and launch latency. First the start-up figures: `dstrain --version` (the executable's
# own start: it links no CUDA library, docs/building.md) and `dstrain launch --nproc-per-node 2 --
# true` (launcher, store, two workers that do nothing) against torchrun's 2-rank gloo rendezvous
# (bench/torchrun_barrier.py at N=2). Then the launch latency: wall time from starting the
# launcher until N ranks have joined the job's rendezvous, passed one barrier and exited, for dstrain (workers: ds_test_worker --barrier, a
# C++ program using the store through connect_from_env) and for torchrun (workers:
# bench/torchrun_barrier.py, a gloo process group + barrier). N = 2, 8, 32 local ranks, and
# 2 SSH nodes x 4 ranks (loopback sshd, scripts/ssh-test-nodes.sh; compared with torchrun at 8).
#
#   bench/launch_bench.sh [BUILD_DIR] [REPS] [TORCH_REPS]
#     BUILD_DIR   default build (needs bin/dstrain and bin/ds_test_worker)
#     REPS        dstrain repetitions per N (median reported), default 5
#     TORCH_REPS  torchrun repetitions per N (median), default 1 (it takes seconds per run)
#   SKIP_SSH=1 skips the SSH row (it needs root and openssh-server); SKIP_TORCH=1 skips torchrun.
#
# Never part of the pass/fail suite. Prints one table.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/bench_lib.sh
source "$here/bench/bench_lib.sh"
bench_args ds_launch_bench "$@"
cleanup() {
  "$here/scripts/ssh-test-nodes.sh" stop "$work/ssh" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT


torchrun() {
  OMP_NUM_THREADS=1 /usr/bin/python3 -m torch.distributed.run --standalone --nproc_per_node "$1" \
    --redirects 1 --tee 1 "$here/bench/torchrun_barrier.py"
}

printf '%-22s %12s %12s %10s\n' "case" "dstrain (s)" "torchrun (s)" "ratio"
row() {  # row NAME DSTRAIN_SECONDS TORCH_SECONDS
  local ratio="-"
  if [[ "$3" != "-" ]]; then ratio=$(awk -v d="$2" -v t="$3" 'BEGIN {printf "%.0fx", t / d}'); fi
  printf '%-22s %12s %12s %10s\n' "$1" "$2" "$3" "$ratio"
}

# The start-ups: many short runs, the median.
startup_reps=$((reps * 10))
version=$(time_cmd "$startup_reps" "$dstrain" --version)
launch_true=$(time_cmd "$startup_reps" "$dstrain" launch --nproc-per-node 2 --master-port 0 -- true)
torch2="-"
if [[ "${SKIP_TORCH:-0}" != 1 ]]; then torch2=$(time_cmd "$torch_reps" torchrun 2); fi
printf '%-22s %12s\n' "dstrain --version" "$version"
row "launch 2 -- true" "$launch_true" "$torch2"

declare -A torch_at
for n in 2 8 32; do
  d=$(time_cmd "$reps" "$dstrain" launch --nproc-per-node "$n" --master-port 0 -- "$worker" --barrier)
  t="-"
  if [[ "${SKIP_TORCH:-0}" != 1 ]]; then t=$(time_cmd "$torch_reps" torchrun "$n"); fi
  torch_at[$n]=$t
  row "local N=$n" "$d" "$t"
done

if [[ "${SKIP_SSH:-0}" != 1 ]]; then
  "$here/scripts/ssh-test-nodes.sh" start "$work/ssh" 4 >/dev/null
  # shellcheck disable=SC1091
  source "$work/ssh/env"
  ssh_true=$(time_cmd "$reps" ssh -p "$SSH_TEST_PORT" -i "$work/ssh/user" -o BatchMode=yes \
    -o UserKnownHostsFile="$work/ssh/known_hosts" 127.0.0.2 true)
  # shellcheck disable=SC2086
  d=$(time_cmd "$reps" env -u SSH_AUTH_SOCK "$dstrain" launch -H "$work/ssh/hostfile" $SSH_FLAGS \
    --master-port 0 -- "$worker" --barrier)
  row "ssh 2 nodes x 4" "$d" "${torch_at[8]:--}"
  echo "(ssh 2x4 is compared with torchrun --standalone at N=8; one plain 'ssh host true' takes" \
       "${ssh_true} s here, most of it the remote login shell's start-up)"
fi
