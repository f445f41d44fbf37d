#!/usr/bin/env bash
# The whole check: formatting, lints with warnings as errors, the crates.io packages, the API
# docs, the dependencies' licences, and every test, against real local services that this script
# starts when they are not running (see scripts/services.sh).
#
#   scripts/test.sh            # everything
#   SHARDLEASE_SERVICES="" scripts/test.sh   # no services: backend tests say they are skipped
#   SHARDLEASE_PACKAGE_VERIFY=1 scripts/test.sh   # also build each package alone (minutes)
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== build dependencies (protoc for the etcd store, promtool for the alert rules)"
scripts/build-deps.sh

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy (warnings are errors)"
# Every feature that ships (TLS for each store among them), so feature-gated code cannot rot
# unseen; this includes the examples package's `all` feature (every example and test that names a
# `required-features`). Each backend feature alone: scripts/check-features.sh (not run here).
cargo clippy --workspace --all-targets --locked --all-features -- -D warnings

echo "== crates.io packages (scripts/package.sh)"
# Packaging every published crate takes seconds; building each one alone from its .crate
# (verification) takes minutes from an empty target dir, so it runs on request:
# SHARDLEASE_PACKAGE_VERIFY=1 scripts/test.sh.
if [ "${SHARDLEASE_PACKAGE_VERIFY:-0}" = 1 ]; then
  scripts/package.sh
else
  scripts/package.sh --no-verify
fi

echo "== API docs, stable and as docs.rs builds them (scripts/doc.sh)"
scripts/doc.sh

echo "== licences of the dependencies (scripts/check-licenses.sh)"
scripts/check-licenses.sh

echo "== services"
eval "$(scripts/services.sh)"
# TLS-only servers (own ports, test CA) for each store's TLS tests (docs/tls.md).
# They are stopped when this script exits (only the PIDs this checkout started): they trust this
# checkout's test CA, so left running they would fail the TLS tests of the next checkout.
tls_stop=:
if [ "${SHARDLEASE_SERVICES-x}" != "" ]; then
  tls_stop="scripts/tls-services.sh stop"
  trap '$tls_stop' EXIT
  eval "$(scripts/tls-services.sh)"
fi

echo "== cargo test"
log=$(mktemp)
trap 'rm -f "$log"; $tls_stop' EXIT
cargo test --workspace --locked --all-targets --all-features 2>&1 | tee "$log"
cargo test --workspace --locked --doc --all-features 2>&1 | tee -a "$log"
# One closing line for the whole run (cargo prints one per test binary).
echo
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
