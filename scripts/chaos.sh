#!/usr/bin/env bash
# Long fault runs: builds the chaos harness (release), runs it for a number of seeds on one store
# or several, prints each run's JSON line and a summary per store. Failed runs leave a history
# file under target/chaos/ that replays them:
#
#   scripts/chaos.sh --store postgres --runs 50            # seeds 1..50
#   scripts/chaos.sh --store all --runs 10 --seed 100      # every store, seeds 100..109
#   scripts/chaos.sh --replay target/chaos/chaos-postgres-7-1234.json
#
# Needs the services of scripts/services.sh (kinesalite, moto's install; it starts what is not
# running, and is skipped when SHARDLEASE_TEST_KINESIS_ENDPOINT is already set); every store but
# SQLite runs as a private server the harness starts. Extra arguments after `--`
# go to `shardlease-chaos run` (e.g. `-- --workers 4 --extra-faults 5`, `-- --exactly-once`
# through the effectively-once SQL sink in $SHARDLEASE_TEST_POSTGRES_URL, `-- --wipes`).
set -euo pipefail
cd "$(dirname "$0")/.."

store=sqlite runs=10 seed=1 replay="" extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --store) store=$2; shift 2 ;;
        --runs) runs=$2; shift 2 ;;
        --seed) seed=$2; shift 2 ;;
        --replay) replay=$2; shift 2 ;;
        --) shift; extra=("$@"); break ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        *) echo "chaos.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

if [ -z "${SHARDLEASE_TEST_KINESIS_ENDPOINT:-}" ]; then
    eval "$(scripts/services.sh)"
fi

cargo build --release --locked -p shardlease-chaos >&2
bin=${CARGO_TARGET_DIR:-target}/release/shardlease-chaos

if [ -n "$replay" ]; then
    exec "$bin" run --replay "$replay"
fi

if [ "$store" = all ]; then
    stores=(sqlite postgres mysql redis etcd dynamodb)
else
    IFS=, read -r -a stores <<<"$store"
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
for s in "${stores[@]}"; do
    "$bin" run --store "$s" --seed "$seed" --runs "$runs" "${extra[@]}" | tee -a "$log" || status=1
done

# One summary line per store: runs, faults, records, lost, duplicates, regressions, foreign.
python3 - "$log" <<'PY'
import json, sys, collections
t = collections.OrderedDict()
for line in open(sys.argv[1]):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    s = t.setdefault(r["store"], collections.Counter())
    s["runs"] += 1
    s["failed"] += 0 if r.get("ok") else 1
    for k in ("faults", "records", "lost", "duplicates", "regressions", "foreign_checkpoints"):
        s[k] += r.get(k, 0)
    s["seconds"] += r.get("seconds", 0)
print("| store | runs | failed | faults drawn | records | lost | duplicates | regressions | foreign checkpoints | seconds |")
print("|---|---|---|---|---|---|---|---|---|---|")
for name, s in t.items():
    print(f"| {name} | {s['runs']} | {s['failed']} | {s['faults']} | {s['records']} | {s['lost']} | "
          f"{s['duplicates']} | {s['regressions']} | {s['foreign_checkpoints']} | {s['seconds']:.0f} |")
PY
exit $status
