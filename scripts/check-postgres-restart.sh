#!/usr/bin/env bash
# Restarts the local PostgreSQL while shardlease workers run on it, and checks that they keep
# going once it is back and that no checkpoint was lost or moved backwards
# (crates/shardlease-sql/examples/postgres_restart.rs says exactly what is checked).
#
# Not part of scripts/test.sh: it stops a server other tests share. Run it by hand:
#
#   scripts/check-postgres-restart.sh              # 3 s outage (shorter than the failover timeout)
#   OUTAGE_SECS=8 scripts/check-postgres-restart.sh   # longer than the failover timeout: workers
#                                                     # fence themselves and come back
#
# Needs the PostgreSQL cluster of this machine (pg_ctlcluster); starts it first if it is down
# (scripts/services.sh). Leaves it running. Exit status 0 = the check passed.
set -euo pipefail
cd "$(dirname "$0")/.."

eval "$(SHARDLEASE_SERVICES=postgres scripts/services.sh)"
case "${SHARDLEASE_TEST_POSTGRES_URL:-}" in
  *127.0.0.1*|*localhost*) ;;
  *) echo "check-postgres-restart: SHARDLEASE_TEST_POSTGRES_URL must point at this machine" >&2; exit 2 ;;
esac
version=$(ls /etc/postgresql | head -n1)
if [ -z "$version" ]; then echo "check-postgres-restart: no local PostgreSQL cluster" >&2; exit 2; fi

export SHARDLEASE_PG_STOP="pg_ctlcluster --skip-systemctl-redirect $version main stop"
export SHARDLEASE_PG_START="pg_ctlcluster --skip-systemctl-redirect $version main start"
export SHARDLEASE_PG_OUTAGE_SECS=${OUTAGE_SECS:-3}

# Make sure the server is back even if the example dies mid-outage.
trap 'pg_isready -h 127.0.0.1 -p 5432 >/dev/null 2>&1 || $SHARDLEASE_PG_START || true' EXIT

cargo build -q -p shardlease-sql --example postgres_restart
cargo run -q -p shardlease-sql --example postgres_restart
