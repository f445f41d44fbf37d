#!/usr/bin/env bash
# Checks that each backend feature of the facade compiles alone (no default features), so a
# feature that only builds thanks to another one (features unify in a workspace build) is
# caught. `cargo check` only; a few minutes on 2 cores with a warm target dir, so scripts/test.sh
# does not run it: run it by hand or in a separate CI job.
#
#   scripts/check-features.sh            # every feature
#   scripts/check-features.sh redis etcd # some
set -euo pipefail
cd "$(dirname "$0")/.."
features=${*:-sqlite postgres mysql postgres,mysql,sql-tls redis redis-tls etcd etcd-tls dynamodb kinesis dynamodb-streams}
for f in $features; do
  echo "== cargo check -p shardlease --no-default-features --features $f"
  cargo check -q --locked -p shardlease --no-default-features --features "$f"
done
echo "every feature alone compiles: $features"
