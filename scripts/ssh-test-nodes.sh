#!/usr/bin/env bash
# Two loopback "nodes" for trying the SSH launcher by hand and for bench/launch_bench.sh: OpenSSH
# servers on 127.0.0.2 and 127.0.0.3 (same unprivileged port), with generated host keys and a
# generated user key, all under DIR. Needs root (sshd's privilege separation) and openssh-server.
#
#   scripts/ssh-test-nodes.sh start DIR [SLOTS]   start both; writes DIR/env (source it) with
#                                                 SSH_FLAGS and DIR/hostfile (SLOTS per node, 2)
#   scripts/ssh-test-nodes.sh stop DIR            stop both (by the pids recorded in DIR)
#
# The tests (tests/multiproc/ssh) start their own servers; this script is for people and benches.
set -euo pipefail

cmd=${1:-}
dir=${2:-}
if [[ -z "$cmd" || -z "$dir" ]]; then
  echo "usage: $0 start|stop DIR [SLOTS]" >&2
  exit 2
fi

case "$cmd" in
  start)
    slots=${3:-2}
    mkdir -p "$dir" /run/sshd
    dir=$(cd "$dir" && pwd)
    for k in host2 host3 user; do
      [[ -f "$dir/$k" ]] || ssh-keygen -q -t ed25519 -N '' -C dstrain-test -f "$dir/$k"
    done
    cp "$dir/user.pub" "$dir/authorized_keys"
    port=$(python3 - <<'PY'
import socket
for _ in range(50):
    a = socket.socket(); a.bind(("127.0.0.2", 0)); p = a.getsockname()[1]
    b = socket.socket()
    try:
        b.bind(("127.0.0.3", p)); print(p); break
    except OSError:
        pass
    finally:
        a.close(); b.close()
PY
)
    : > "$dir/known_hosts"
    for n in 2 3; do
      cat > "$dir/sshd_config$n" <<CFG
ListenAddress 127.0.0.$n:$port
HostKey $dir/host$n
PidFile $dir/sshd$n.pid
AuthorizedKeysFile $dir/authorized_keys
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
LogLevel ERROR
MaxStartups 100
CFG
      /usr/sbin/sshd -f "$dir/sshd_config$n"
      echo "[127.0.0.$n]:$port $(cat "$dir/host$n.pub")" >> "$dir/known_hosts"
    done
    printf '127.0.0.2 slots=%s\n127.0.0.3 slots=%s\n' "$slots" "$slots" > "$dir/hostfile"
    cat > "$dir/env" <<ENV
SSH_TEST_PORT=$port
SSH_FLAGS="--ssh-port $port --ssh-key $dir/user --ssh-known-hosts $dir/known_hosts"
ENV
    for _ in $(seq 100); do
      if [[ -f "$dir/sshd2.pid" && -f "$dir/sshd3.pid" ]]; then break; fi
      sleep 0.05
    done
    echo "sshd on 127.0.0.2:$port and 127.0.0.3:$port; source $dir/env; hostfile $dir/hostfile"
    ;;
  stop)
    for n in 2 3; do
      if [[ -f "$dir/sshd$n.pid" ]]; then
        kill "$(cat "$dir/sshd$n.pid")" 2>/dev/null || true
        rm -f "$dir/sshd$n.pid"
      fi
    done
    ;;
  *)
    echo "usage: $0 start|stop DIR [SLOTS]" >&2
    exit 2
    ;;
esac
