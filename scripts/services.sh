#!/usr/bin/env bash
# Starts the local services the tests need, when they are not already running, and prints the
# environment variables that point the tests at them (source it, or eval its output).
#
# Idempotent; binds 127.0.0.1 only; records the PIDs it started in $SHARDLEASE_RUN_DIR/pids so
# scripts/stop-services.sh stops only those. Services already running are left alone.
#
#   eval "$(scripts/services.sh)"     # start what is missing, export SHARDLEASE_TEST_* variables
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
run_dir=${SHARDLEASE_RUN_DIR:-$root/target/services}
mkdir -p "$run_dir"
pids="$run_dir/pids"
touch "$pids"

log() { echo "services: $*" >&2; }

need_pkg() { # need_pkg COMMAND PACKAGE...
  command -v "$1" >/dev/null 2>&1 && return 0
  log "installing $2 (for $1)"
  if [ ! -f "$run_dir/apt-updated" ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 && touch "$run_dir/apt-updated"
  fi
  shift
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2
}

# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"

start_postgres() {
  if pg_isready -h 127.0.0.1 -p 5432 >/dev/null 2>&1; then return 0; fi
  need_pkg pg_ctlcluster postgresql
  local v
  v=$(ls /etc/postgresql 2>/dev/null | head -n1)
  if [ -z "$v" ]; then log "no PostgreSQL cluster found"; return 1; fi
  pg_ctlcluster --skip-systemctl-redirect "$v" main start >&2 || true
  wait_for PostgreSQL 30 pg_isready -h 127.0.0.1 -p 5432
}

start_mariadb() {
  if mysqladmin -h 127.0.0.1 -P 3306 -uroot ping >/dev/null 2>&1; then return 0; fi
  need_pkg mariadbd mariadb-server
  mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld 2>/dev/null || true
  start-stop-daemon --start --oknodo --background --make-pidfile --pidfile "$run_dir/mariadb.pid" \
    --exec /usr/sbin/mariadbd -- --bind-address=127.0.0.1 --port=3306 >&2
  echo "mariadb $(cat "$run_dir/mariadb.pid" 2>/dev/null)" >>"$pids"
  wait_for MariaDB 30 mysqladmin -h 127.0.0.1 -P 3306 -uroot ping
  mysql -h 127.0.0.1 -P 3306 -uroot -e 'CREATE DATABASE IF NOT EXISTS test' >&2
}

start_redis() {
  if redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; then return 0; fi
  need_pkg redis-server redis-server
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
    --dir "$run_dir" --pidfile "$run_dir/redis.pid" --logfile "$run_dir/redis.log" >&2
  wait_for Redis 10 sh -c 'redis-cli -h 127.0.0.1 -p 6379 ping | grep -q PONG'
  echo "redis $(cat "$run_dir/redis.pid" 2>/dev/null)" >>"$pids"
}

# Redis Cluster: three masters and one replica each on loopback (ports 7000-7005 unless
# SHARDLEASE_REDIS_CLUSTER_PORT moves the first; each also uses its port + 10000 for the cluster
# bus), no persistence, node files and logs under the run dir. Reused when its first node already
# answers with a healthy cluster; a port taken by something else is an error.
redis_cluster_port=${SHARDLEASE_REDIS_CLUSTER_PORT:-7000}
redis_cluster_ok() { redis-cli -h 127.0.0.1 -p "$1" cluster info 2>/dev/null | grep -q 'cluster_state:ok'; }

start_redis_cluster() {
  need_pkg redis-server redis-server
  local first=$redis_cluster_port ports=() p
  for p in $(seq "$first" $((first + 5))); do ports+=("$p"); done
  if redis_cluster_ok "$first"; then return 0; fi
  for p in "${ports[@]}"; do
    if port_open "$p" || port_open $((p + 10000)); then
      log "port $p or $((p + 10000)) is taken by something that is not our Redis Cluster"
      return 1
    fi
  done
  local dir="$run_dir/redis-cluster"
  rm -rf "$dir" && mkdir -p "$dir"
  for p in "${ports[@]}"; do
    mkdir -p "$dir/$p"
    redis-server --daemonize yes --bind 127.0.0.1 --port "$p" --save "" --appendonly no \
      --cluster-enabled yes --cluster-config-file "$dir/$p/nodes.conf" --cluster-node-timeout 2000 \
      --dir "$dir/$p" --pidfile "$dir/$p/redis.pid" --logfile "$dir/$p/redis.log" >&2
    wait_for "Redis Cluster node $p" 10 sh -c "redis-cli -h 127.0.0.1 -p $p ping | grep -q PONG"
    echo "redis-cluster-$p $(cat "$dir/$p/redis.pid" 2>/dev/null)" >>"$pids"
  done
  local nodes=()
  for p in "${ports[@]}"; do nodes+=("127.0.0.1:$p"); done
  redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >&2
  for p in "${ports[@]}"; do wait_for "Redis Cluster on $p" 30 redis_cluster_ok "$p"; done
}

redis_cluster_url() {
  local first=$redis_cluster_port
  echo "redis+cluster://127.0.0.1:$first,127.0.0.1:$((first + 1)),127.0.0.1:$((first + 2))"
}

# DynamoDB: moto's server from PyPI, in a virtualenv under the build folder (no AWS is reachable).
dynamodb_port=${SHARDLEASE_DYNAMODB_PORT:-8000}
dynamodb_up() { curl -s -o /dev/null "http://127.0.0.1:$dynamodb_port/moto-api/"; }

start_dynamodb() {
  need_pkg curl curl
  if dynamodb_up; then return 0; fi
  need_pkg python3 python3 python3-venv
  local venv="$run_dir/moto-venv"
  if [ ! -x "$venv/bin/moto_server" ]; then
    log "installing moto[server] into $venv"
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install -q 'moto[server]' >&2
  fi
  # Through a wrapper that applies one request at a time (moto's own server races conditional
  # writes of one item; see the script).
  nohup "$venv/bin/python" "$root/scripts/moto-server.py" -H 127.0.0.1 -p "$dynamodb_port" \
    >"$run_dir/moto.log" 2>&1 &
  echo "dynamodb $!" >>"$pids"
  wait_for DynamoDB 30 dynamodb_up
}

start_kinesis() { # kinesalite from npm, via a Node wrapper that binds 127.0.0.1 only
  local port=${SHARDLEASE_KINESIS_PORT:-4567}
  if port_open "$port"; then return 0; fi
  need_pkg npm nodejs npm
  if [ ! -f "$run_dir/node_modules/kinesalite/package.json" ]; then
    log "installing kinesalite (npm)"
    (cd "$run_dir" && npm install --silent --no-audit --no-fund --no-save kinesalite >&2)
  fi
  nohup node "$root/scripts/kinesalite.js" "$run_dir" "$port" >"$run_dir/kinesalite.log" 2>&1 &
  echo "kinesalite $!" >>"$pids"
  wait_for kinesalite 30 port_open "$port"
}

# etcd v3 from Debian's etcd-server (etcdctl from etcd-client), data under the build folder.
# Reuses an etcd already answering on the port; another program on 2379 moves ours to 23790.
etcd_port=${SHARDLEASE_ETCD_PORT:-2379}
etcd_up() { ETCDCTL_API=3 etcdctl --endpoints "http://127.0.0.1:$1" --command-timeout=1s endpoint health; }

start_etcd() {
  need_pkg etcd etcd-server
  need_pkg etcdctl etcd-client
  if etcd_up "$etcd_port" >/dev/null 2>&1; then return 0; fi
  if port_open "$etcd_port" || port_open $((etcd_port + 1)); then
    log "port $etcd_port or $((etcd_port + 1)) is taken by something that is not etcd; using 23790"
    etcd_port=23790
    if etcd_up "$etcd_port" >/dev/null 2>&1; then return 0; fi
  fi
  # Data in memory when the machine has a tmpfs: etcd syncs every write to disk, and on a busy
  # machine (a build writing gigabytes beside the tests) one sync can take seconds, which stalls
  # every test on the server. The shared server's data is scratch; the restart tests run an etcd
  # of their own on disk.
  local data="$run_dir/etcd-$etcd_port"
  if [ -d /dev/shm ] && [ -w /dev/shm ]; then data="/dev/shm/shardlease-etcd-$etcd_port"; fi
  mkdir -p "$data"
  # Revisions older than the last 10,000 are compacted away, so repeated test runs (checkpoints are
  # frequent writes) never fill etcd's backend quota.
  nohup etcd --name shardlease-test --data-dir "$data" --logger zap --log-level warn \
    --auto-compaction-mode revision --auto-compaction-retention 10000 \
    --listen-client-urls "http://127.0.0.1:$etcd_port" \
    --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$((etcd_port + 1))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((etcd_port + 1))" \
    --initial-cluster "shardlease-test=http://127.0.0.1:$((etcd_port + 1))" \
    >"$run_dir/etcd.log" 2>&1 &
  echo "etcd $!" >>"$pids"
  wait_for etcd 30 etcd_up "$etcd_port"
}

wanted=${SHARDLEASE_SERVICES:-postgres mariadb redis redis-cluster etcd dynamodb kinesis}
for s in $wanted; do
  case $s in
    postgres) start_postgres && echo "export SHARDLEASE_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test" ;;
    mariadb|mysql) start_mariadb && echo "export SHARDLEASE_TEST_MYSQL_URL=mysql://root@127.0.0.1:3306/test" ;;
    redis) start_redis && echo "export SHARDLEASE_TEST_REDIS_URL=redis://127.0.0.1:6379/" ;;
    redis-cluster) start_redis_cluster &&
      echo "export SHARDLEASE_TEST_REDIS_CLUSTER_URL=$(redis_cluster_url)" ;;
    etcd) start_etcd && echo "export SHARDLEASE_TEST_ETCD_URL=etcd://127.0.0.1:$etcd_port" ;;
    dynamodb) start_dynamodb &&
      echo "export SHARDLEASE_TEST_DYNAMODB_ENDPOINT=http://127.0.0.1:$dynamodb_port" &&
      echo "export SHARDLEASE_TEST_DYNAMODB_URL='dynamodb://test:test@shardlease-test?region=us-east-1&endpoint=http://127.0.0.1:$dynamodb_port&create_table=true'" ;;
    kinesis) start_kinesis && echo "export SHARDLEASE_TEST_KINESIS_ENDPOINT=http://127.0.0.1:${SHARDLEASE_KINESIS_PORT:-4567}" ;;
    *) log "unknown service $s"; exit 2 ;;
  esac
done
