#!/usr/bin/env bash
# Stops only the services scripts/services.sh started (by the PIDs it recorded).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
pids=${SHARDLEASE_RUN_DIR:-$root/target/services}/pids
[ -f "$pids" ] || exit 0
while read -r name pid; do
  [ -n "${pid:-}" ] || continue
  if kill -0 "$pid" 2>/dev/null; then
    echo "stopping $name (pid $pid)" >&2
    kill "$pid" 2>/dev/null || true
    # Some servers (moto's) can go on serving queued requests for minutes after SIGTERM.
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
done <"$pids"
: >"$pids"
