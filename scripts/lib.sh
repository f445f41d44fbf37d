# Shell helpers the service scripts share (sourced, not run): services.sh and tls-services.sh.
# Each script defines its own `log` before calling them.

# port_open PORT: whether something listens on 127.0.0.1:PORT.
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# wait_for WHAT SECONDS COMMAND...: runs COMMAND every 0.1 s until it succeeds, for at most
# SECONDS; says which service did not become ready otherwise.
wait_for() {
  local what=$1 secs=$2; shift 2
  for _ in $(seq 1 $((secs * 10))); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  log "$what did not become ready in ${secs}s"
  return 1
}
