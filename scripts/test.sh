#!/usr/bin/env bash
# The whole check: formatting, lints with warnings as errors, and every test, against real local
# services that this script starts when they are not running (see scripts/services.sh).
#
#   scripts/test.sh            # everything
#   SHARDLEASE_SERVICES="" scripts/test.sh   # no services: backend tests say they are skipped
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== build dependencies (protoc for the etcd store, promtool for the alert rules)"
scripts/build-deps.sh

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy (warnings are errors)"
# The examples package's `all` feature turns on every example and test that names a
# `required-features` (prometheus, effectively_once, kinesis_dynamodb), so they compile and run too.
cargo clippy --workspace --all-targets --locked --features shardlease-examples/all -- -D warnings
# `shardlease import-kcl` and its tests are built with the CLI's own `dynamodb` feature (and
# `kinesis` for the end-to-end switch onto kinesalite).
cargo clippy -p shardlease-cli --all-targets --locked --features dynamodb,kinesis -- -D warnings

echo "== services"
eval "$(scripts/services.sh)"

echo "== cargo test"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace --locked --all-targets --features shardlease-examples/all 2>&1 | tee "$log"
cargo test --workspace --locked --doc --features shardlease-examples/all 2>&1 | tee -a "$log"
cargo test -p shardlease-cli --locked --features dynamodb,kinesis --bins --test import_kcl \
  --test import_kcl_resume 2>&1 | tee -a "$log"
# One closing line for the whole run (cargo prints one per test binary).
echo
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
