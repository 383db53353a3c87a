#!/usr/bin/env bash
# Launch latency of the cluster engines, all in the same run: the wall time from starting the
# launcher until a 2-node x 2-rank job has joined its rendezvous, passed one barrier and exited
# (workers: ds_test_worker --barrier), through
#   ssh      dstrain launch over loopback sshd nodes (scripts/ssh-test-nodes.sh)
#   slurm    dstrain launch --launcher slurm inside an salloc of a two-node Slurm cluster on this
#            machine (scripts/slurm-test-cluster.sh); timed inside the allocation
#   openmpi  dstrain launch --launcher openmpi over the same sshd nodes (orted through ssh)
#   mpich    dstrain launch --launcher mpich over the same sshd nodes (hydra_pmi_proxy through ssh)
# and, as torchtitan's Slurm script starts jobs, `srun torchrun` (one torchrun per node, c10d
# rendezvous, 2 ranks each running bench/torchrun_barrier.py: a gloo group and one barrier) in
# the same allocation. `srun true` on both nodes is timed too (the floor of any srun step).
#
#   bench/cluster_launch_bench.sh [BUILD_DIR] [REPS] [TORCH_REPS]
#     BUILD_DIR   default build (needs bin/dstrain and bin/ds_test_worker)
#     REPS        repetitions per dstrain case (median reported), default 5
#     TORCH_REPS  srun torchrun repetitions (median), default 1 (it takes seconds per run)
# Needs root, openssh-server, slurm-wlm, munge, openmpi-bin, mpich and (for torchrun)
# python3-torch (scripts/install-deps.sh --bench). Everything stays on the loopback interface.
# Never part of the pass/fail suite. Prints one table and the ratios.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/bench_lib.sh
source "$here/bench/bench_lib.sh"
bench_args ds_cluster_bench "$@"
cleanup() {
  "$here/scripts/slurm-test-cluster.sh" stop "$work/slurm" >/dev/null 2>&1 || true
  "$here/scripts/ssh-test-nodes.sh" stop "$work/ssh" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
export OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo
unset SSH_AUTH_SOCK


"$here/scripts/ssh-test-nodes.sh" start "$work/ssh" 2 >/dev/null
# shellcheck disable=SC1091
source "$work/ssh/env"
wrapper=$work/ssh/ssh-wrapper
cat >"$wrapper" <<WRAP
#!/bin/sh
exec ssh -p $SSH_TEST_PORT -i $work/ssh/user -o UserKnownHostsFile=$work/ssh/known_hosts -o StrictHostKeyChecking=yes -o BatchMode=yes "\$@"
WRAP
chmod +x "$wrapper"
"$here/scripts/slurm-test-cluster.sh" start "$work/slurm" 4 >/dev/null
# shellcheck disable=SC1091
source "$work/slurm/env"

hosts=$work/ssh/hostfile
# shellcheck disable=SC2086
t_ssh=$(time_cmd "$reps" "$dstrain" launch -H "$hosts" $SSH_FLAGS --master-port 0 -- "$worker" --barrier)
t_ompi=$(time_cmd "$reps" "$dstrain" launch --launcher openmpi -H "$hosts" --master-port 0 --launcher-args \
  "--allow-run-as-root --mca plm_rsh_agent $wrapper --mca oob_tcp_if_include lo" -- "$worker" --barrier)
t_mpich=$(time_cmd "$reps" "$dstrain" launch --launcher mpich -H "$hosts" --master-port 0 --launcher-args \
  "-launcher ssh -launcher-exec $wrapper -iface lo" -- "$worker" --barrier)

# Inside one allocation: dstrain's slurm launcher, srun true, srun torchrun.
cat >"$work/in_allocation.sh" <<INNER
#!/usr/bin/env bash
set -euo pipefail
work=$work
source $here/bench/bench_lib.sh
echo "slurm \$(time_cmd $reps $dstrain launch --launcher slurm --master-addr 127.0.0.1 --master-port 0 -- $worker --barrier)"
echo "srun_true \$(time_cmd $reps srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --mpi=none true)"
if [[ "\${SKIP_TORCH:-}" != 1 ]]; then
  port=\$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  echo "torch \$(time_cmd $torch_reps srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --mpi=none \
    /usr/bin/python3 -m torch.distributed.run --nnodes=2 --nproc_per_node=2 --rdzv_id=\$SLURM_JOB_ID \
    --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:\$port --redirects 1 --tee 1 $here/bench/torchrun_barrier.py)"
fi
INNER
chmod +x "$work/in_allocation.sh"
salloc --nodes=2 --ntasks-per-node=2 "$work/in_allocation.sh" >"$work/alloc.out" 2>"$work/alloc.err" || {
  cat "$work/alloc.err" >&2
  exit 1
}
t_slurm=$(awk '$1 == "slurm" {print $2}' "$work/alloc.out")
t_srun=$(awk '$1 == "srun_true" {print $2}' "$work/alloc.out")
t_torch=$(awk '$1 == "torch" {print $2}' "$work/alloc.out")

printf '2 nodes x 2 ranks, join + one barrier + exit; medians of %s (torchrun: %s)\n' "$reps" "$torch_reps"
printf '%-36s %10s\n' "case" "seconds"
printf '%-36s %10s\n' "dstrain launch (ssh)" "$t_ssh" "dstrain launch --launcher slurm" "$t_slurm" \
  "dstrain launch --launcher openmpi" "$t_ompi" "dstrain launch --launcher mpich" "$t_mpich" \
  "srun true (floor of a step)" "$t_srun" "srun torchrun" "${t_torch:-skipped}"
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2fx", a / b}'; }
echo "ratios:"
echo "  slurm / ssh          $(ratio "$t_slurm" "$t_ssh")"
echo "  openmpi / ssh        $(ratio "$t_ompi" "$t_ssh")"
echo "  mpich / ssh          $(ratio "$t_mpich" "$t_ssh")"
[[ -n "$t_torch" ]] && echo "  srun torchrun / slurm $(ratio "$t_torch" "$t_slurm")"
true
