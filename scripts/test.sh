#!/usr/bin/env bash
# The whole check: formatting, lints with warnings as errors, and every test, against real local
# services that this script starts when they are not running (see scripts/services.sh).
#
#   scripts/test.sh            # everything
#   SHARDLEASE_SERVICES="" scripts/test.sh   # no services: backend tests say they are skipped
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== services"
eval "$(scripts/services.sh)"

echo "== cargo test"
cargo test --workspace --locked --all-targets
cargo test --workspace --locked --doc
