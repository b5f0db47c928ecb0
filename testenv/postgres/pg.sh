#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for the test suite, from Debian's packages.
#   pg.sh up      install (if needed), initdb and start on a free loopback port
#   pg.sh url     print the SQLAlchemy URL of the running cluster
#   pg.sh status  exit 0 when it answers
#   pg.sh restart restart it on the same port (what a database failover looks like to clients)
#   pg.sh stop    stop it at once (-m immediate), keeping its data; pg.sh start starts it again
#   pg.sh down    stop it and remove its data
# NODELEDGER_PG_LISTEN=IP: also listen on IP and trust the test Kubernetes nodes and pods
# (10.231.0.0/24, 10.232.0.0/16: testenv/kube/nodes.sh), whose services reach it there.
set -euo pipefail

LOG_TAG=pg.sh
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
RUNDIR="${NODELEDGER_RUNDIR:-/tmp/nodeledger}/postgres"
DATA="$RUNDIR/data"
PORT_FILE="$RUNDIR/port"

pg_bin() {
  local dir
  dir=$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
  [ -n "$dir" ] && [ -x "$dir/initdb" ] && echo "$dir"
}

install_server() {
  if pg_bin >/dev/null; then return; fi
  log "installing PostgreSQL from Debian's packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends postgresql >/dev/null
}

as_postgres() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

url() {
  echo "postgresql+psycopg://postgres@127.0.0.1:$(cat "$PORT_FILE")/postgres"
}

running() {
  [ -f "$PORT_FILE" ] && [ -f "$DATA/postmaster.pid" ] \
    && as_postgres "$(pg_bin)/pg_ctl" -D "$DATA" status >/dev/null 2>&1 \
    && as_postgres "$(pg_bin)/pg_isready" -q -h 127.0.0.1 -p "$(cat "$PORT_FILE")"
}

up() {
  install_server
  local bin; bin=$(pg_bin)
  if running; then url; return; fi
  down >/dev/null 2>&1 || true
  mkdir -p "$RUNDIR"
  chown postgres: "$RUNDIR" 2>/dev/null || true
  as_postgres "$bin/initdb" -D "$DATA" -U postgres --auth=trust -E UTF8 --no-sync >/dev/null
  free_port >"$PORT_FILE"
  local listen=127.0.0.1
  if [ -n "${NODELEDGER_PG_LISTEN:-}" ]; then
    listen="$listen,$NODELEDGER_PG_LISTEN"
    printf 'host all all %s trust\n' 10.231.0.0/24 10.232.0.0/16 >>"$DATA/pg_hba.conf"
  fi
  # Test cluster: speed over durability, enough connections for two services and the tests.
  # In its configuration file, so that `start` after `stop` starts it alike.
  cat >>"$DATA/postgresql.conf" <<EOF
port = $(cat "$PORT_FILE")
unix_socket_directories = '$RUNDIR'
listen_addresses = '$listen'
fsync = off
synchronous_commit = off
full_page_writes = off
max_connections = 300
EOF
  start
  url
}

start() {
  as_postgres "$(pg_bin)/pg_ctl" -D "$DATA" -l "$RUNDIR/postgres.log" -w -t 60 start >/dev/null
}

stop() {   # at once, as a crash or a lost machine would: clients see their connections drop
  running || die "not running"
  as_postgres "$(pg_bin)/pg_ctl" -D "$DATA" -m immediate -w -t 60 stop >/dev/null
}

down() {
  local bin; bin=$(pg_bin) || return 0
  if [ -f "$DATA/postmaster.pid" ]; then
    as_postgres "$bin/pg_ctl" -D "$DATA" -m fast -w stop >/dev/null 2>&1 || true
  fi
  rm -rf "$RUNDIR"
}

restart() {
  running || die "not running"
  as_postgres "$(pg_bin)/pg_ctl" -D "$DATA" -m fast -w -t 60 restart >/dev/null
}

case "${1:-}" in
  up) up ;;
  restart) restart ;;
  stop) stop ;;
  start) running || start ;;
  url) running && url ;;
  status) running ;;
  down) down ;;
  *) echo "usage: $0 up|url|status|restart|stop|start|down" >&2; exit 2 ;;
esac
