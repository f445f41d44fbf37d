#!/usr/bin/env bash
# Fetches the aws-kcl package (the KCL's Node.js client) from npm into target/aws-kcl (once) with
# `npm pack`, unpacks it as target/aws-kcl/node_modules/aws-kcl, and prints that node_modules
# directory: the NODE_PATH under which `require('aws-kcl')` works. No install script is run and no
# dependency is fetched: the module itself (lib/kcl) needs only Node's standard library; its
# dependencies serve `kcl-bootstrap`, which downloads the Java daemon's jars, and
# shardlease-multilang replaces the Java daemon.
#
#   NODE_PATH=$(scripts/aws-kcl.sh)     # idempotent; exit 1 (message on stderr) when unavailable
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
version=${AWS_KCL_VERSION:-2.3.2}
cache=${AWS_KCL_CACHE:-$root/target/aws-kcl}
modules="$cache/node_modules"
dir="$modules/aws-kcl"

command -v node >/dev/null 2>&1 || { echo "aws-kcl: node is not installed" >&2; exit 1; }
if [ ! -f "$dir/package.json" ] || ! grep -q "\"version\": \"$version\"" "$dir/package.json"; then
  command -v npm >/dev/null 2>&1 || { echo "aws-kcl: npm is not installed" >&2; exit 1; }
  mkdir -p "$cache"
  tarball="$cache/aws-kcl-$version.tgz"
  if [ ! -f "$tarball" ]; then
    echo "aws-kcl: downloading aws-kcl $version (npm pack, no dependencies)" >&2
    (cd "$cache" && npm pack --silent "aws-kcl@$version" >/dev/null) \
      || { echo "aws-kcl: cannot download aws-kcl $version from npm" >&2; exit 1; }
  fi
  # Unpacked beside, then moved into place: a half-unpacked module is never left at $dir.
  tmp=$(mktemp -d "$cache/unpack.XXXXXX")
  tar -xzf "$tarball" -C "$tmp"
  mkdir -p "$modules"
  rm -rf "$dir"
  mv "$tmp/package" "$dir"
  rmdir "$tmp"
fi
NODE_PATH="$modules" node -e "require('aws-kcl')" >&2 \
  || { echo "aws-kcl: $dir does not load" >&2; exit 1; }
echo "$modules"
