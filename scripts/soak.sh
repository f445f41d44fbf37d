#!/usr/bin/env bash
# Runs the deterministic simulation over many seeds in release and prints the failing ones, each
# with the command that replays it alone. Not part of CI (which runs 200 seeds in debug).
#
#   scripts/soak.sh            # 10,000 seeds starting at 1
#   scripts/soak.sh 50000 1001 # 50,000 seeds starting at 1001
set -uo pipefail
cd "$(dirname "$0")/.."
seeds=${1:-10000}
first=${2:-1}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
echo "== simulation soak: $seeds seeds from $first (release)"
start=$(date +%s)
SHARDLEASE_SIM_SEEDS=$seeds SHARDLEASE_SIM_FIRST_SEED=$first \
  cargo test --release --locked -p shardlease-core --test simulation -- --nocapture simulated_fleets_keep_every_invariant >"$log" 2>&1
status=$?
ok=$(grep -c '^seed [0-9]*: ok' "$log")
failed=$(grep '^seed [0-9]*: FAILED' "$log")
anomalies=$(grep -c '^seed [0-9]*: ok (POST-ACCIDENT ANOMALIES' "$log")
echo "seeds ok: $ok of $seeds in $(( $(date +%s) - start )) s"
echo "of which passed with documented post-accident anomalies (two owners for a pass, a parent read again): $anomalies"
echo "(SHARDLEASE_SIM_STRICT=1 scripts/soak.sh counts those as failures)"
if [ -n "$failed" ]; then
  echo "failing seeds:"
  echo "$failed" | cut -c1-1500
  echo "$failed" | sed -E 's/^seed ([0-9]+):.*/  replay: SHARDLEASE_SIM_SEED=\1 cargo test -p shardlease-core --test simulation -- --nocapture/'
elif [ "$status" -ne 0 ]; then
  tail -n 30 "$log"
fi
exit $status
