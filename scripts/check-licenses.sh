#!/usr/bin/env bash
# Checks the licence of every package in the dependency tree (every feature, dev- and
# build-dependencies included) against an allow-list, offline: `cargo metadata` over Cargo.lock,
# reading the `license` field of each package's manifest in the local registry cache (a prior
# build or `cargo fetch` has downloaded them). Also checks that the workspace says its own
# licence: LICENSE at the root, and in every package that is published.
#
#   scripts/check-licenses.sh
#
# The tree is the one that builds for this machine's platform (`--filter-platform`): offline, the
# sources of other platforms' dependencies (Windows, wasm) are not in the cache to read.
# Prints the packages that fail and one closing line: "licenses: N packages, all allowed".
set -euo pipefail
cd "$(dirname "$0")/.."

host=$(rustc -vV | sed -n 's/^host: //p')
meta=$(mktemp)
trap 'rm -f "$meta"' EXIT
cargo metadata --format-version 1 --all-features --locked --offline --filter-platform "$host" >"$meta"

python3 - "$meta" <<'EOF'
import json, os, re, sys

# Licences whose terms allow shipping shardlease under Apache-2.0 (permissive, no copyleft).
ALLOWED = {
    "Apache-2.0", "MIT", "MIT-0", "BSD-2-Clause", "BSD-3-Clause", "ISC", "Zlib", "0BSD",
    "Unicode-3.0", "Unicode-DFS-2016", "Unlicense", "CC0-1.0", "BSL-1.0",
    # webpki-roots: Mozilla's root certificates as data.
    "CDLA-Permissive-2.0",
}
ALLOWED_EXCEPTIONS = {"LLVM-exception"}
# Our own licence, which every package of the workspace declares.
OURS = "Apache-2.0"


def tokens(expr):
    # Old crates write "MIT/Apache-2.0" for "MIT OR Apache-2.0".
    return re.findall(r"\(|\)|[A-Za-z0-9.+-]+", expr.replace("/", " OR "))


def allowed(expr):
    """Whether an SPDX expression can be satisfied with allowed licences only."""
    toks = tokens(expr)
    pos = 0

    def peek():
        return toks[pos] if pos < len(toks) else None

    def take():
        nonlocal pos
        pos += 1
        return toks[pos - 1]

    def primary():
        if peek() == "(":
            take()
            v = disjunction()
            if take() != ")":
                raise ValueError("unbalanced parentheses")
            return v
        lic = take()
        if lic in ("AND", "OR", "WITH", ")"):
            raise ValueError(f"unexpected {lic!r}")
        ok = lic.rstrip("+") in ALLOWED
        if peek() == "WITH":
            take()
            exception = take()
            ok = ok and exception in ALLOWED_EXCEPTIONS
        return ok

    def conjunction():
        v = primary()
        while peek() == "AND":
            take()
            v = primary() and v
        return v

    def disjunction():
        v = conjunction()
        while peek() == "OR":
            take()
            v = conjunction() or v
        return v

    result = disjunction()
    if pos != len(toks):
        raise ValueError(f"trailing {toks[pos:]!r}")
    return result


meta = json.load(open(sys.argv[1]))
members = set(meta["workspace_members"])
problems = []
for p in meta["packages"]:
    name = f"{p['name']} {p['version']}"
    lic = p.get("license")
    if p["id"] in members:
        if lic != OURS:
            problems.append(f"{name}: workspace member with license {lic!r}, not {OURS}")
        if p.get("publish") != [] and not os.path.isfile(
                os.path.join(os.path.dirname(p["manifest_path"]), "LICENSE")):
            problems.append(f"{name}: published, but no LICENSE beside its Cargo.toml")
        continue
    if not lic:
        problems.append(f"{name}: no SPDX `license` (license-file {p.get('license_file')!r})")
        continue
    try:
        if not allowed(lic):
            problems.append(f"{name}: {lic!r} is not on the allow-list")
    except (ValueError, IndexError) as e:
        problems.append(f"{name}: cannot parse {lic!r}: {e}")
if not os.path.isfile("LICENSE"):
    problems.append("no LICENSE at the root of the repository")

for line in problems:
    print(f"license: {line}", file=sys.stderr)
n = len(meta["packages"])
if problems:
    print(f"licenses: {n} packages, {len(problems)} not allowed")
    sys.exit(1)
print(f"licenses: {n} packages ({len(members)} of this workspace), all allowed")
EOF
