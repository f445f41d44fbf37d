#!/usr/bin/env bash
# Builds the API documentation of every crate with warnings as errors (a broken intra-doc link,
# a missing doc, a bad code block fail it), twice:
#
# - on stable, as `cargo doc` builds it for a reader of this checkout;
# - on nightly with `--cfg docsrs`, as docs.rs builds it (each crate's lib.rs then turns on
#   rustdoc's `doc_cfg`, which marks every feature-gated item with its feature). Skipped with a
#   line saying so when no nightly toolchain is installed (`rustup toolchain install nightly`),
#   or with `--stable-only`.
#
#   scripts/doc.sh [--stable-only]
#
# Every feature of every crate, as `[package.metadata.docs.rs] all-features = true` asks of
# docs.rs. The doc tests run with the tests (scripts/test.sh: `cargo test --doc`).
set -euo pipefail
cd "$(dirname "$0")/.."

nightly=1
case "${1-}" in
  "") ;;
  --stable-only) nightly=0 ;;
  *) echo "usage: $0 [--stable-only]" >&2; exit 2 ;;
esac

echo "== cargo doc (stable, warnings are errors)"
start=$SECONDS
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --all-features --no-deps --locked
echo "doc: stable cargo doc --workspace --all-features --no-deps clean ($((SECONDS - start))s)"

if [ "$nightly" = 0 ]; then
  exit 0
fi
if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "doc: no nightly toolchain: the docs.rs build (--cfg docsrs) was not checked"
  exit 0
fi
echo "== cargo +nightly doc --cfg docsrs (as docs.rs builds it, warnings are errors)"
start=$SECONDS
# (Nightly's artifacts sit beside stable's in the target dir: the compiler version is part of
# their hashes. The HTML in target/doc is then this build's.)
RUSTDOCFLAGS="-D warnings --cfg docsrs" cargo +nightly doc --workspace --all-features --no-deps --locked
echo "doc: nightly $(cargo +nightly --version | cut -d' ' -f2-) --cfg docsrs clean ($((SECONDS - start))s)"
