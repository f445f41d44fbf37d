#!/usr/bin/env bash
# Installs the system packages the workspace's build needs, when they are missing (idempotent):
# `protoc` and Google's well-known .proto files for the etcd store's gRPC client (etcd-client runs
# protoc in its build script; without libprotobuf-dev it fails on google/protobuf/descriptor.proto),
# and `promtool` (Debian's `prometheus` package), with which examples/tests/deploy.rs checks and
# unit-tests deploy/prometheus/shardlease.rules.yml; libfaketime (Debian's `faketime`), with which
# the fault campaign (crates/shardlease-chaos) steps one consumer's wall clock. None is needed to
# run the embedded examples.
set -euo pipefail

log() { echo "build-deps: $*" >&2; }

missing=()
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
[ -f /usr/include/google/protobuf/descriptor.proto ] || missing+=(libprotobuf-dev)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1 || missing+=(faketime)
[ ${#missing[@]} -eq 0 ] && exit 0

log "installing ${missing[*]}"
DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
