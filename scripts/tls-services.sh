#!/usr/bin/env bash
# Starts TLS-only servers for the TLS tests (one per store, on their own ports) and prints the
# SHARDLEASE_TEST_TLS_* variables that point the tests at them (eval its output).
#
# What it makes, under target/tls-services/ (or $SHARDLEASE_TLS_DIR):
#   certs/ca.crt            the test CA every TLS URL trusts
#   certs/other-ca.crt      a second CA that signed nothing the servers use (the wrong-CA tests)
#   certs/server.crt|key    the servers' certificate, for the DNS name `localhost` only (so a
#                           connection to 127.0.0.1 is a wrong host name)
#   certs/client.crt|key    a client certificate from the test CA (CN=root), for etcd
# and these servers, each bound to 127.0.0.1, TLS only, with a user that has a password:
#   PostgreSQL  5433  own cluster (initdb + pg_ctl), ssl=on, hostssl + scram-sha-256 only
#   MariaDB     3307  own datadir, require_secure_transport=ON
#   Redis       6390  --port 0 --tls-port, requirepass
#   etcd        2391  https, --client-cert-auth, auth enabled (user root)
#   DynamoDB    8443  scripts/tls-proxy.py terminating TLS in front of moto (services.sh's)
#
# Idempotent: a server already answering is left alone. PIDs it started go to $dir/pids;
# `scripts/tls-services.sh stop` stops only those.
#
#   eval "$(scripts/tls-services.sh)"
#   scripts/tls-services.sh stop
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dir=${SHARDLEASE_TLS_DIR:-$root/target/tls-services}
mkdir -p "$dir"
pids="$dir/pids"
touch "$pids"
certs="$dir/certs"
# The password every TLS server's user has (a test secret: the tests check it never shows).
password=${SHARDLEASE_TLS_PASSWORD:-tls-Secret-pw-7391}

log() { echo "tls-services: $*" >&2; }

# taken PORT NAME: true (and says so) when PORT answers but not as this checkout's server, e.g.
# another checkout's tls-services left running: starting ours there could only fail.
taken() {
  port_open "$1" || return 1
  log "$2: port $1 is taken by a server this checkout did not start (another checkout's" \
    "tls-services? stop it with that checkout's scripts/tls-services.sh stop)"
}

if [ "${1:-}" = stop ]; then
  while read -r name pid; do
    [ -n "${pid:-}" ] || continue
    if kill -0 "$pid" 2>/dev/null; then
      log "stopping $name (pid $pid)"
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
  done <"$pids"
  : >"$pids"
  exit 0
fi

# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"

make_certs() {
  [ -f "$certs/client.key" ] && return 0
  command -v openssl >/dev/null || { log "openssl is not installed"; return 1; }
  mkdir -p "$certs"
  (
    cd "$certs"
    local ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
    openssl req -x509 "${ec[@]}" -keyout ca.key -out ca.crt -days 3650 -subj /CN=shardlease-test-ca
    openssl req -x509 "${ec[@]}" -keyout other-ca.key -out other-ca.crt -days 3650 \
      -subj /CN=shardlease-other-ca
    openssl req "${ec[@]}" -keyout server.key -out server.csr -subj /CN=localhost
    printf 'subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n' >server.ext
    openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt \
      -days 3650 -extfile server.ext
    openssl req "${ec[@]}" -keyout client.key -out client.csr -subj /CN=root
    printf 'extendedKeyUsage=clientAuth\n' >client.ext
    openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out client.crt \
      -days 3650 -extfile client.ext
    # PKCS#8 keys (every client library reads those).
    for k in server client; do
      openssl pkcs8 -topk8 -nocrypt -in $k.key -out $k.pk8 && mv $k.pk8 $k.key
    done
  ) >/dev/null 2>&1
  chmod 644 "$certs"/*.crt "$certs"/*.key
}

pg_port=5433
pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)
pg_up() { pg_isready -h 127.0.0.1 -p $pg_port; }

start_postgres() {
  [ -n "$pg_bin" ] || { log "PostgreSQL is not installed"; return 1; }
  pg_up >/dev/null 2>&1 && return 0
  taken $pg_port PostgreSQL && return 1
  local data="$dir/pg"
  local as=()
  [ "$(id -u)" = 0 ] && as=(runuser -u postgres --)
  if [ ! -f "$data/PG_VERSION" ]; then
    mkdir -p "$data"
    [ "$(id -u)" = 0 ] && chown postgres "$data" "$dir"
    "${as[@]}" "$pg_bin/initdb" -D "$data" -A trust -U postgres >/dev/null
    cp "$certs/server.crt" "$certs/server.key" "$certs/ca.crt" "$data/"
    chmod 600 "$data/server.key"
    [ "$(id -u)" = 0 ] && chown postgres "$data/server.crt" "$data/server.key" "$data/ca.crt"
    cat >>"$data/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $pg_port
unix_socket_directories = '$data'
ssl = on
ssl_cert_file = 'server.crt'
ssl_key_file = 'server.key'
password_encryption = 'scram-sha-256'
EOF
    # TCP only over TLS and with a password; the socket (setup only) trusts.
    cat >"$data/pg_hba.conf" <<EOF
local   all all                trust
hostssl all all 127.0.0.1/32   scram-sha-256
EOF
  fi
  "${as[@]}" "$pg_bin/pg_ctl" -D "$data" -l "$data/log" -w start >/dev/null
  echo "postgres $(head -n1 "$data/postmaster.pid")" >>"$pids"
  wait_for PostgreSQL 30 pg_up
  "${as[@]}" psql -h "$data" -p $pg_port -U postgres -d postgres -q -v ON_ERROR_STOP=1 <<EOF >/dev/null
DO \$\$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'shardlease') THEN
    CREATE ROLE shardlease LOGIN SUPERUSER PASSWORD '$password';
  END IF;
END \$\$;
SELECT 'CREATE DATABASE test OWNER shardlease' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'test')\gexec
EOF
}

my_port=3307
my_up() { mysqladmin --no-defaults -S "$dir/mysql/sock" -uroot ping; }

start_mariadb() {
  command -v mariadbd >/dev/null || [ -x /usr/sbin/mariadbd ] || { log "MariaDB is not installed"; return 1; }
  my_up >/dev/null 2>&1 && return 0
  taken $my_port MariaDB && return 1
  local data="$dir/mysql"
  if [ ! -d "$data/mysql" ]; then
    mkdir -p "$data"
    mariadb-install-db --no-defaults --datadir="$data" --user="$(id -un)" \
      --auth-root-authentication-method=socket >/dev/null 2>&1
  fi
  nohup /usr/sbin/mariadbd --no-defaults --datadir="$data" --user="$(id -un)" \
    --socket="$data/sock" --pid-file="$data/pid" --bind-address=127.0.0.1 --port=$my_port \
    --skip-name-resolve --require-secure-transport=ON \
    --ssl-ca="$certs/ca.crt" --ssl-cert="$certs/server.crt" --ssl-key="$certs/server.key" \
    >"$data/log" 2>&1 &
  echo "mariadb $!" >>"$pids"
  wait_for MariaDB 30 my_up
  mysql --no-defaults -S "$data/sock" -uroot <<EOF
CREATE DATABASE IF NOT EXISTS test;
CREATE USER IF NOT EXISTS 'shardlease'@'127.0.0.1' IDENTIFIED BY '$password' REQUIRE SSL;
GRANT ALL ON *.* TO 'shardlease'@'127.0.0.1';
EOF
}

redis_port=6390
redis_up() { redis-cli --tls --cacert "$certs/ca.crt" --sni localhost -h 127.0.0.1 -p $redis_port --no-auth-warning -a "$password" ping | grep -q PONG; }

start_redis() {
  command -v redis-server >/dev/null || { log "redis-server is not installed"; return 1; }
  redis_up >/dev/null 2>&1 && return 0
  taken $redis_port Redis && return 1
  mkdir -p "$dir/redis"
  # The password goes in a config file, not on the command line (where `ps` shows it).
  printf 'requirepass %s\n' "$password" >"$dir/redis/secret.conf"
  chmod 600 "$dir/redis/secret.conf"
  redis-server "$dir/redis/secret.conf" --daemonize yes --bind 127.0.0.1 --port 0 \
    --tls-port $redis_port --tls-cert-file "$certs/server.crt" --tls-key-file "$certs/server.key" \
    --tls-ca-cert-file "$certs/ca.crt" --tls-auth-clients optional \
    --save "" --appendonly no --dir "$dir/redis" --pidfile "$dir/redis/pid" \
    --logfile "$dir/redis/log" >&2
  wait_for Redis 10 redis_up
  echo "redis $(cat "$dir/redis/pid")" >>"$pids"
}

etcd_port=2391
etcdctl_tls() {
  ETCDCTL_API=3 etcdctl --endpoints "https://localhost:$etcd_port" --cacert "$certs/ca.crt" \
    --cert "$certs/client.crt" --key "$certs/client.key" --command-timeout=2s "$@"
}
etcd_up() { etcdctl_tls --user "root:$password" get probe; }

start_etcd() {
  command -v etcd >/dev/null || { log "etcd is not installed"; return 1; }
  etcd_up >/dev/null 2>&1 && return 0
  local data="$dir/etcd"
  mkdir -p "$data"
  if ! port_open $etcd_port; then
    nohup etcd --name shardlease-tls --data-dir "$data/data" --logger zap --log-level warn \
      --listen-client-urls "https://127.0.0.1:$etcd_port" \
      --advertise-client-urls "https://localhost:$etcd_port" \
      --listen-peer-urls "http://127.0.0.1:$((etcd_port + 1))" \
      --initial-advertise-peer-urls "http://127.0.0.1:$((etcd_port + 1))" \
      --initial-cluster "shardlease-tls=http://127.0.0.1:$((etcd_port + 1))" \
      --cert-file "$certs/server.crt" --key-file "$certs/server.key" \
      --client-cert-auth --trusted-ca-file "$certs/ca.crt" \
      >"$data/log" 2>&1 &
    echo "etcd $!" >>"$pids"
  fi
  wait_for etcd 30 etcdctl_tls endpoint health
  # Password authentication on top of the client certificate (a password must never show). While
  # authentication is off, etcd refuses every call that names a user.
  etcdctl_tls user add "root:$password" >/dev/null 2>&1 || true
  etcdctl_tls user grant-role root root >/dev/null 2>&1 || true
  etcdctl_tls auth enable >/dev/null 2>&1 || true
  wait_for "etcd auth" 10 etcd_up
}

dynamodb_tls_port=8443
dynamodb_target=${SHARDLEASE_TEST_DYNAMODB_ENDPOINT:-http://127.0.0.1:8000}
dynamodb_target=${dynamodb_target#http://}

start_dynamodb() {
  if ! curl -s -o /dev/null "http://$dynamodb_target/moto-api/"; then
    # moto itself comes from services.sh.
    eval "$(SHARDLEASE_SERVICES=dynamodb "$root/scripts/services.sh")"
    dynamodb_target=${SHARDLEASE_TEST_DYNAMODB_ENDPOINT#http://}
  fi
  curl -s -o /dev/null --cacert "$certs/ca.crt" "https://localhost:$dynamodb_tls_port/moto-api/" && return 0
  taken $dynamodb_tls_port "DynamoDB's TLS proxy" && return 1
  nohup python3 "$root/scripts/tls-proxy.py" --listen $dynamodb_tls_port --target "$dynamodb_target" \
    --cert "$certs/server.crt" --key "$certs/server.key" >"$dir/tls-proxy.log" 2>&1 &
  echo "tls-proxy $!" >>"$pids"
  wait_for "DynamoDB TLS proxy" 10 curl -sf -o /dev/null --cacert "$certs/ca.crt" \
    "https://localhost:$dynamodb_tls_port/moto-api/"
}

make_certs
pw=$password
echo "export SHARDLEASE_TEST_TLS_CA=$certs/ca.crt"
echo "export SHARDLEASE_TEST_TLS_OTHER_CA=$certs/other-ca.crt"
echo "export SHARDLEASE_TEST_TLS_CLIENT_CERT=$certs/client.crt"
echo "export SHARDLEASE_TEST_TLS_CLIENT_KEY=$certs/client.key"
echo "export SHARDLEASE_TEST_TLS_PASSWORD=$pw"
wanted=${SHARDLEASE_TLS_SERVICES:-postgres mariadb redis etcd dynamodb}
for s in $wanted; do
  case $s in
    postgres) start_postgres &&
      echo "export SHARDLEASE_TEST_TLS_POSTGRES_ADDR=localhost:$pg_port" ;;
    mariadb|mysql) start_mariadb &&
      echo "export SHARDLEASE_TEST_TLS_MYSQL_ADDR=localhost:$my_port" ;;
    redis) start_redis && echo "export SHARDLEASE_TEST_TLS_REDIS_ADDR=localhost:$redis_port" ;;
    etcd) start_etcd && echo "export SHARDLEASE_TEST_TLS_ETCD_ADDR=localhost:$etcd_port" ;;
    dynamodb) start_dynamodb &&
      echo "export SHARDLEASE_TEST_TLS_DYNAMODB_ADDR=localhost:$dynamodb_tls_port" ;;
    *) log "unknown service $s"; exit 2 ;;
  esac
done
