#!/usr/bin/env bash
# Fetches the amazon-kclpy sdist from PyPI into target/kclpy (once) and prints the PYTHONPATH
# that makes its `amazon_kclpy` module importable. Its setup.py (which downloads the Java daemon's
# jars from Maven) is never run: the module itself needs only the standard library, and
# shardlease-multilang replaces the Java daemon.
#
#   PYTHONPATH=$(scripts/kclpy.sh)      # idempotent; exit 1 (message on stderr) when unavailable
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
version=${KCLPY_VERSION:-3.2.0}
cache=${KCLPY_CACHE:-$root/target/kclpy}
dir="$cache/amazon_kclpy-$version"

if [ ! -f "$dir/amazon_kclpy/kcl.py" ]; then
  mkdir -p "$cache"
  if [ ! -f "$cache/amazon_kclpy-$version.tar.gz" ]; then
    echo "kclpy: downloading amazon-kclpy $version (sdist, no dependencies)" >&2
    python3 -m pip download --quiet --no-deps --no-binary :all: "amazon-kclpy==$version" -d "$cache" >&2 \
      || { echo "kclpy: cannot download amazon-kclpy $version from PyPI" >&2; exit 1; }
  fi
  tar -xzf "$cache/amazon_kclpy-$version.tar.gz" -C "$cache"
fi
python3 -c "import sys; sys.path.insert(0, '$dir'); import amazon_kclpy.kcl" >&2 \
  || { echo "kclpy: $dir does not import" >&2; exit 1; }
echo "$dir"
