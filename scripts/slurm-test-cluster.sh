#!/usr/bin/env bash
# A two-node Slurm cluster on this machine, for trying --launcher slurm by hand and for
# bench/cluster_launch_bench.sh: munged, slurmctld and two slurmd (`slurmd -N n1`, `-N n2`) under
# DIR, with a slurm.conf written here (free ports, proctrack/linuxproc, task/none, nodes n[1-2] at
# 127.0.0.1 with CPUS cpus each). Needs root and slurm-wlm + munge (scripts/install-deps.sh).
#
#   scripts/slurm-test-cluster.sh start DIR [CPUS]   start it; writes DIR/env (source it: SLURM_CONF)
#   scripts/slurm-test-cluster.sh stop DIR           cancel every job, stop the daemons by their pids
#
# The tests (tests/multiproc/cluster/slurm_cluster.h) start their own; this is for people and
# benches. Node names n1/n2 do not resolve: pass --master-addr 127.0.0.1 (or MASTER_ADDR).
set -euo pipefail

cmd=${1:-}
dir=${2:-}
if [[ -z "$cmd" || -z "$dir" ]]; then
  echo "usage: $0 start|stop DIR [CPUS]" >&2
  exit 2
fi

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

case "$cmd" in
  start)
    cpus=${3:-4}
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    mkdir -p "$dir/spool-n1" "$dir/spool-n2"
    [[ -f "$dir/munge.key" ]] || /usr/sbin/mungekey -c -k "$dir/munge.key"
    /usr/sbin/munged -F -f -S "$dir/munge.sock" --key-file="$dir/munge.key" --pid-file="$dir/munged.pid" \
      --seed-file="$dir/munged.seed" --log-file="$dir/munged.log" >"$dir/munged.out" 2>&1 &
    echo $! >"$dir/pid.munged"
    for _ in $(seq 100); do [[ -S "$dir/munge.sock" ]] && break; sleep 0.05; done
    host=$(hostname)
    cat >"$dir/slurm.conf" <<CONF
ClusterName=dsbench
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge.sock,cred_expire=5
StateSaveLocation=$dir
SlurmdSpoolDir=$dir/spool-%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=15
InactiveLimit=0
NodeName=n1 NodeHostname=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=1000 Port=$(free_port)
NodeName=n2 NodeHostname=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=1000 Port=$(free_port)
PartitionName=main Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
    export SLURM_CONF=$dir/slurm.conf
    /usr/sbin/slurmctld -D -f "$SLURM_CONF" >"$dir/slurmctld.out" 2>&1 &
    echo $! >"$dir/pid.slurmctld"
    for n in n1 n2; do
      /usr/sbin/slurmd -D -N $n -f "$SLURM_CONF" >"$dir/slurmd-$n.out" 2>&1 &
      echo $! >"$dir/pid.slurmd-$n"
    done
    for _ in $(seq 300); do
      [[ "$(sinfo -h -N -o %T 2>/dev/null | tr '\n' ' ')" == "idle idle " ]] && break
      sleep 0.1
    done
    echo "SLURM_CONF=$SLURM_CONF" >"$dir/env"
    echo "export SLURM_CONF" >>"$dir/env"
    sinfo
    ;;
  stop)
    dir=$(cd "$dir" && pwd)
    if [[ -f "$dir/slurm.conf" ]]; then
      SLURM_CONF=$dir/slurm.conf scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
      for _ in $(seq 50); do
        [[ -z "$(SLURM_CONF=$dir/slurm.conf squeue -h 2>/dev/null)" ]] && break
        sleep 0.1
      done
    fi
    for d in slurmd-n1 slurmd-n2 slurmctld munged; do
      if [[ -f "$dir/pid.$d" ]]; then
        kill "$(cat "$dir/pid.$d")" 2>/dev/null || true
        rm -f "$dir/pid.$d"
      fi
    done
    ;;
  *)
    echo "usage: $0 start|stop DIR [CPUS]" >&2
    exit 2
    ;;
esac
