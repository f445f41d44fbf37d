#!/usr/bin/env bash
# Bench of shardlease-multilang with the real amazon-kclpy on kinesalite (not run by CI): the
# daemon's memory at 16 leases, the time to its first record, and its records/s through a Python
# child against the child's own speed. Prints one JSON line (scripts/multilang-bench.py says what
# each figure is). Builds the daemon in release, starts the services it needs (scripts/services.sh),
# fetches kclpy (scripts/kclpy.sh) and boto3 (into target/pybench, once).
#
#   scripts/multilang-bench.sh            # MLBENCH_RECORDS=20000 by default
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p shardlease-multilang >&2
eval "$(scripts/services.sh)"
kclpy=$(scripts/kclpy.sh)
pydeps=target/pybench
if [ ! -d "$pydeps/boto3" ]; then
  python3 -m pip install --quiet --target "$pydeps" boto3 >&2
fi
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
PYTHONPATH="$kclpy:$pydeps" exec python3 scripts/multilang-bench.py "$target_dir/release/shardlease-multilang"
