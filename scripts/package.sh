#!/usr/bin/env bash
# Packages every publishable crate of the workspace as crates.io would receive it, and checks each
# package: `cargo package` over all of them at once (cargo orders them by dependency and resolves
# each against the ones packaged before it, so crates not yet on crates.io are found), then
# `cargo publish --dry-run` (what would be uploaded, in which order), then the metadata and the
# file list of every package.
#
#   scripts/package.sh              # package and verify: each .crate built alone, as a user gets it
#   scripts/package.sh --no-verify  # package only (manifests, file lists, dependency resolution)
#
# Verifying builds every package from its .crate with its default features: on 2 cores about
# 9-10 minutes from an empty target dir, one to two minutes once the dependencies are built;
# without it, about 20 seconds.
#
# The publishable crates are the members without `publish = false`; the bench, the chaos harness,
# the examples and the e2e tests are not published. A package holds its code, README.md and
# LICENSE only (`include` in each manifest): tests, examples, scripts and test data stay here.
# Prints one line per crate (name, files, size of the .crate) and a closing line.
#
# Uncommitted changes are packaged too (`--allow-dirty`), so the check runs before a commit;
# publishing for real is `cargo publish -p NAME` from a clean checkout, in the order printed.
set -euo pipefail
cd "$(dirname "$0")/.."

verify=()
case "${1-}" in
  "") ;;
  --no-verify) verify=(--no-verify) ;;
  *) echo "usage: $0 [--no-verify]" >&2; exit 2 ;;
esac

meta=$(cargo metadata --format-version 1 --no-deps --locked)
target_dir=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])' <<<"$meta")

# The publishable members, and a check of the metadata crates.io and docs.rs show.
crates=$(python3 - <<'EOF' "$meta"
import json, sys
meta = json.loads(sys.argv[1])
bad = []
names = []
for p in meta["packages"]:
    if p.get("publish") == []:
        continue
    names.append(p["name"])
    for field in ("description", "license", "repository", "homepage", "documentation", "readme",
                  "rust_version"):
        if not p.get(field):
            bad.append(f"{p['name']}: no `{field.replace('_', '-')}`")
    for field in ("keywords", "categories"):
        if not p.get(field):
            bad.append(f"{p['name']}: no `{field}`")
    if len(p.get("keywords", [])) > 5:
        bad.append(f"{p['name']}: more than 5 keywords")
    has_lib = any("lib" in t["kind"] for t in p["targets"])
    if has_lib and "rs" not in ((p.get("metadata") or {}).get("docs") or {}):
        bad.append(f"{p['name']}: no [package.metadata.docs.rs]")
if bad:
    print("\n".join(bad), file=sys.stderr)
    sys.exit(1)
print(" ".join(sorted(names)))
EOF
)
pkg_args=()
for c in $crates; do pkg_args+=(-p "$c"); done

# Stale packages of an earlier run must not be read below.
for c in $crates; do
  rm -f "$target_dir/package/$c"-[0-9]*.crate
done

log=$(mktemp)
trap 'rm -f "$log"' EXIT
# A package without its tests makes cargo warn once per test target it drops: that is intended.
quiet() { grep -v '^warning: ignoring \(test\|example\) \|^warning: aborting upload due to dry run\|^ *Updating \|^ *Uploading ' "$@" || true; }

echo "== cargo package ${verify[*]} ($(wc -w <<<"$crates") crates)"
start=$SECONDS
if ! cargo package --locked --allow-dirty "${verify[@]}" "${pkg_args[@]}" >"$log" 2>&1; then
  quiet "$log" >&2
  echo "package: cargo package failed" >&2
  exit 1
fi
quiet "$log" | grep -v '^ *\(Compiling\|Checking\) ' || true
elapsed=$((SECONDS - start))

# What crates.io would be sent, in the order it would be (the packages were verified above).
echo "== cargo publish --dry-run --no-verify"
if ! cargo publish --dry-run --locked --allow-dirty --no-verify "${pkg_args[@]}" >"$log" 2>&1; then
  quiet "$log" >&2
  echo "package: cargo publish --dry-run failed" >&2
  exit 1
fi

# Every package holds only what it should, and its licence and README. Listed in the order cargo
# would upload them (dependencies first): the order to publish in.
order=$(sed -n 's/^ *Uploading \([^ ]*\) v\([^ ]*\) .*/\1-\2/p' "$log")
total=0
failed=0
echo "== packages, in publishing order"
for c in $order; do
  crate="$target_dir/package/$c.crate"
  if [ ! -f "$crate" ]; then
    echo "package: cargo publish --dry-run would upload $c, which cargo package did not make" >&2
    failed=1
    continue
  fi
  files=$(tar -tzf "$crate" | sed "s|^$c/||" | grep -v '/$')
  unexpected=$(grep -Ev '^(src/.*\.rs|Cargo\.toml|Cargo\.toml\.orig|Cargo\.lock|README\.md|LICENSE|\.cargo_vcs_info\.json)$' <<<"$files" || true)
  for need in LICENSE README.md; do
    if ! grep -qx "$need" <<<"$files"; then
      echo "package: $c has no $need" >&2
      failed=1
    fi
  done
  if [ -n "$unexpected" ]; then
    echo "package: $c holds files it should not:" >&2
    sed 's/^/  /' <<<"$unexpected" >&2
    failed=1
  fi
  bytes=$(stat -c %s "$crate")
  total=$((total + bytes))
  awk -v c="$c" -v n="$(wc -l <<<"$files")" -v b="$bytes" \
    'BEGIN { printf "%-28s %3d files  %7.1f KiB\n", c, n, b / 1024 }'
done
[ "$failed" = 0 ] || exit 1
mode=verified
[ ${#verify[@]} -eq 0 ] || mode="not verified"
awk -v n="$(wc -w <<<"$order")" -v m="$mode" -v b="$total" -v s="$elapsed" \
  'BEGIN { printf "package: %d crates packaged (%s), %.1f KiB in all, %ds\n", n, m, b / 1024, s }'
