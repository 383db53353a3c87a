#!/usr/bin/env bash
# Time from a node loss to the first step on the survivors: dstrain launch --nnodes 1:2 over two
# loopback SSH nodes (scripts/ssh-test-nodes.sh: sshd on 127.0.0.2 and 127.0.0.3, 2 ranks each, a
# 2-layer GPT-2 of width 64, checkpoints every 10 steps) against torchrun's elastic restart on the
# same machine (two torchrun agents, --nnodes 1:2, c10d rendezvous on 127.0.0.2, 2 workers each,
# bench/torchrun_elastic_worker.py: a gloo DDP loop checkpointing every 5 steps). Each run: wait
# for 30 steps, SIGKILL the second node (dstrain: its sshd, SSH sessions, agent and ranks;
# torchrun: its agent and workers), then time until the survivors log their first step. torchrun
# runs twice: its defaults (last_call_timeout 30 s, keep-alive 5 s x 3), and tuned
# (last_call_timeout=1). Prints figures; not a test.
#
#   bench/elastic_bench.sh [build-dir]       needs root, openssh-server; SKIP_TORCH=1 skips torchrun
set -euo pipefail
cd "$(dirname "$0")/.."
here=$(pwd)
BUILD=${1:-build}
BIN="$here/$BUILD/bin/dstrain"
[ -x "$BIN" ] || { echo "elastic_bench: no $BIN (build dstrain first)" >&2; exit 2; }
[ -f data/kjv/train.bin ] || { echo "elastic_bench: data/kjv/train.bin missing (scripts/prepare-kjv.sh)" >&2; exit 2; }
work=$(mktemp -d)
cleanup() {
  pkill -KILL -f "$work" 2>/dev/null || true
  "$here/scripts/ssh-test-nodes.sh" stop "$work/ssh" >/dev/null 2>&1 || true
  [ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
now() { date +%s.%N; }

# ------------------------------------------------------------------ dstrain
"$here/scripts/ssh-test-nodes.sh" start "$work/ssh" 2 >/dev/null
# shellcheck disable=SC1091
source "$work/ssh/env"
cat >"$work/job.json" <<JSON
{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
 "zero_optimization": {"stage": 1},
 "model": {"type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 64, "vocab_size": 256, "seq_len": 64},
 "data": {"train": "$here/data/kjv/train.bin"},
 "training": {"steps": 100000, "seed": 1, "log_interval": 1, "checkpoint_dir": "$work/ckpt", "checkpoint_interval": 10}}
JSON
# shellcheck disable=SC2086
"$BIN" launch -H "$work/ssh/hostfile" $SSH_FLAGS --master-port 0 --nnodes 1:2 --env OMP_NUM_THREADS=1 \
  --env DSTRAIN_BENCH_DIR="$work" -- "$BIN" train --config "$work/job.json" --metrics "$work/m.jsonl" \
  >"$work/dstrain.out" 2>"$work/dstrain.err" &
launcher=$!
until [ "$(cat "$work/m.jsonl" 2>/dev/null | wc -l)" -ge 30 ]; do
  sleep 0.05
  kill -0 "$launcher" 2>/dev/null || { echo "elastic_bench: dstrain ended early:" >&2; tail -5 "$work/dstrain.err" >&2; exit 1; }
done
# Node 1 (127.0.0.3): its ranks (NODE_RANK=1), their agent, the sshd sessions above it, its sshd.
victims=()
for p in $(pgrep -f "$BIN train"); do
  if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "NODE_RANK=1"; then victims+=("$p"); fi
done
agent=$(ps -o ppid= -p "${victims[0]}" | tr -d ' ')
victims+=("$agent")
listener=$(cat "$work/ssh/sshd3.pid")
p=$(ps -o ppid= -p "$agent" | tr -d ' ')
while [ "$p" -gt 1 ] && [ "$p" != "$listener" ]; do victims+=("$p"); p=$(ps -o ppid= -p "$p" | tr -d ' '); done
victims+=("$listener")
t_kill=$(now)
kill -KILL "${victims[@]}" 2>/dev/null || true
until grep -q '"elastic_restarts"' "$work/m.jsonl" 2>/dev/null; do
  sleep 0.02
  kill -0 "$launcher" 2>/dev/null || { echo "elastic_bench: dstrain ended:" >&2; tail -5 "$work/dstrain.err" >&2; exit 1; }
done
t_first=$(now)
kill -TERM "$launcher"; wait "$launcher" || true
dstrain_s=$(echo "$t_first - $t_kill" | bc)
downtime=$(grep '"elastic_restarts"' "$work/m.jsonl" | head -1 | sed 's/.*"elastic_downtime_s":\([0-9.]*\).*/\1/')

# ------------------------------------------------------------------ torchrun
torch_run() {  # LABEL RDZV_CONF -> seconds from the kill to the survivor's first step
  local label=$1 conf=$2 port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.2",0)); print(s.getsockname()[1])')
  rm -f "$work/torch.ckpt"
  local common=(--nnodes 1:2 --nproc_per_node 2 --rdzv_backend c10d --rdzv_endpoint "127.0.0.2:$port"
                --rdzv_id "bench-$label" --max_restarts 3 --monitor_interval 1 --redirects 1 --tee 1)
  # Agent a hosts the rendezvous store (both would match 127.0.0.2 here); b, the node killed, not.
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_NUM_THREADS=1 /usr/bin/python3 -m torch.distributed.run \
    "${common[@]}" --rdzv_conf "is_host=true${conf:+,$conf}" "$here/bench/torchrun_elastic_worker.py" \
    "$work/torch.ckpt" 100000 >"$work/t_$label.a.out" 2>"$work/t_$label.a.err" &
  local a=$!
  sleep 1
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_NUM_THREADS=1 /usr/bin/python3 -m torch.distributed.run \
    "${common[@]}" --rdzv_conf "is_host=false${conf:+,$conf}" "$here/bench/torchrun_elastic_worker.py" \
    "$work/torch.ckpt" 100000 >"$work/t_$label.b.out" 2>"$work/t_$label.b.err" &
  local b=$!
  local log
  until log=$(cat "$work/t_$label.a.out" "$work/t_$label.b.out" 2>/dev/null | grep -c 'step [0-9]' || true); [ "$log" -ge 30 ]; do
    sleep 0.05
    if ! kill -0 "$a" 2>/dev/null || ! kill -0 "$b" 2>/dev/null; then
      echo "elastic_bench: torchrun ($label) ended early:" >&2; tail -n 5 "$work/t_$label.a.err" "$work/t_$label.b.err" >&2; return 1
    fi
  done
  local t0
  t0=$(now)
  kill -KILL $(pgrep -P "$b") "$b" 2>/dev/null || true
  until cat "$work/t_$label.a.out" 2>/dev/null | grep -q 'step [0-9]* restart [1-9]'; do
    sleep 0.02
    kill -0 "$a" 2>/dev/null || { echo "elastic_bench: torchrun ($label) ended:" >&2; tail -5 "$work/t_$label.a.err" >&2; return 1; }
  done
  local t1
  t1=$(now)
  kill -TERM "$a" 2>/dev/null; wait "$a" 2>/dev/null || true
  echo "$t1 - $t0" | bc
}
torch_default=n/a torch_tuned=n/a
if [[ "${SKIP_TORCH:-0}" != 1 ]]; then
  torch_default=$(torch_run default "" || echo failed)
  torch_tuned=$(torch_run tuned "last_call_timeout=1" || echo failed)
fi

printf '%-44s %10s\n' "node SIGKILLed -> first step on the survivors" "seconds"
printf '%-44s %10.2f\n' "dstrain launch --nnodes 1:2 (ssh)" "$dstrain_s"
printf '%-44s %10s\n' "  its elastic_downtime_s (from the loss seen)" "$downtime"
printf '%-44s %10s\n' "torchrun --nnodes 1:2, defaults" "$torch_default"
printf '%-44s %10s\n' "torchrun --nnodes 1:2, last_call_timeout=1" "$torch_tuned"
