#!/usr/bin/env bash
# Sourced by the other scripts: makes sure Postgres (127.0.0.1:5432, user postgres, trust on loopback) and
# Redis (127.0.0.1:6379) answer, or the servers the script was pointed at (ensure_services). Where they
# already run, they are used as they are; where the local defaults do not, they are installed with apt
# (Debian) and started. A server elsewhere is only checked: it must answer.

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

# without_password prints a connection URL with its password masked, for messages.
without_password() { printf '%s' "$1" | sed -E 's#^([a-z+]+://[^:/@]*:)[^@/]*@#\1xxxxx@#'; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    echo "need root to run: $* (install sudo or run as root)" >&2; return 1; fi
}

port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

wait_port() {
  for _ in $(seq 1 60); do port_open "$1" "$2" && return 0; sleep 0.5; done
  return 1
}

apt_updated=""
apt_install() {
  if [ -z "$apt_updated" ]; then as_root apt-get update -qq; apt_updated=1; fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# host_port URL DEFAULT_PORT prints the host and the port of a connection URL
# (scheme://[user[:password]@]host[:port][/...]) or of host:port; 127.0.0.1 when it has no host.
host_port() {
  local rest=${1#*://} hp
  rest=${rest##*@}
  hp=${rest%%[/?]*}
  case $hp in
    *:*) echo "${hp%:*} ${hp##*:}" ;;
    *) echo "${hp:-127.0.0.1} $2" ;;
  esac
}

# servers_from DATABASE_URL REDIS_URL sets the servers to check from the URLs the calling script uses (its
# own variables; empty: the local defaults), unless PGHOST_ADDR, PGPORT_NUM or REDIS_PORT_NUM were set.
servers_from() {
  if [ -z "${PGHOST_ADDR:-}${PGPORT_NUM:-}" ]; then read -r PGHOST_ADDR PGPORT_NUM <<<"$(host_port "${1:-}" 5432)"; fi
  if [ -z "${REDIS_HOST_ADDR:-}${REDIS_PORT_NUM:-}" ]; then read -r REDIS_HOST_ADDR REDIS_PORT_NUM <<<"$(host_port "${2:-}" 6379)"; fi
  PGHOST_ADDR=${PGHOST_ADDR:-127.0.0.1} PGPORT_NUM=${PGPORT_NUM:-5432}
  REDIS_HOST_ADDR=${REDIS_HOST_ADDR:-127.0.0.1} REDIS_PORT_NUM=${REDIS_PORT_NUM:-6379}
}

# local_default HOST PORT DEFAULT_PORT says whether HOST:PORT is the local server this script may install
# and start.
local_default() {
  case $1 in 127.0.0.1 | localhost) [ "$2" = "$3" ] ;; *) return 1 ;; esac
}

ensure_postgres() {
  if port_open "$PGHOST_ADDR" "$PGPORT_NUM"; then return 0; fi
  if ! local_default "$PGHOST_ADDR" "$PGPORT_NUM" 5432; then
    echo "Postgres does not answer on $PGHOST_ADDR:$PGPORT_NUM (the database URL this script was given): start it, or unset the URL for the local server on 127.0.0.1:5432" >&2
    return 1
  fi
  say "Postgres is not answering on $PGHOST_ADDR:$PGPORT_NUM; starting it"
  if ! command -v pg_ctlcluster >/dev/null || [ -z "$(ls /etc/postgresql 2>/dev/null)" ]; then
    say "installing PostgreSQL with apt"
    apt_install postgresql postgresql-client
  fi
  local ver; ver=$(ls /etc/postgresql | sort -V | tail -1)
  local hba="/etc/postgresql/$ver/main/pg_hba.conf"
  # Loopback connections as postgres without a password, as the tests and the demo expect.
  if ! as_root grep -q '^host all postgres 127.0.0.1/32 trust' "$hba"; then
    as_root sed -i '1i host all postgres 127.0.0.1/32 trust\nhost all postgres ::1/128 trust' "$hba"
  fi
  # apt may already have started the cluster (then start fails and reload applies the pg_hba change).
  as_root pg_ctlcluster --skip-systemctl-redirect "$ver" main start 2>/dev/null || true
  as_root pg_ctlcluster --skip-systemctl-redirect "$ver" main reload 2>/dev/null || true
  wait_port "$PGHOST_ADDR" "$PGPORT_NUM" || { echo "Postgres did not start; see /var/log/postgresql/" >&2; return 1; }
}

ensure_redis() {
  if port_open "$REDIS_HOST_ADDR" "$REDIS_PORT_NUM"; then return 0; fi
  if ! local_default "$REDIS_HOST_ADDR" "$REDIS_PORT_NUM" 6379; then
    echo "Redis does not answer on $REDIS_HOST_ADDR:$REDIS_PORT_NUM (the Redis URL this script was given): start it, or unset the URL for the local server on 127.0.0.1:6379" >&2
    return 1
  fi
  say "Redis is not answering on 127.0.0.1:$REDIS_PORT_NUM; starting it"
  if ! command -v redis-server >/dev/null; then
    say "installing Redis with apt"
    apt_install redis-server
  fi
  as_root mkdir -p /var/lib/redis /var/log/redis
  as_root redis-server --daemonize yes --bind 127.0.0.1 --port "$REDIS_PORT_NUM" --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/campaignctl.log
  wait_port 127.0.0.1 "$REDIS_PORT_NUM" || { echo "Redis did not start; see /var/log/redis/campaignctl.log" >&2; return 1; }
}

ensure_go() {
  if command -v go >/dev/null; then return 0; fi
  if [ -x /usr/local/go/bin/go ]; then export PATH="/usr/local/go/bin:$PATH"; return 0; fi
  echo "Go is not installed: install Go 1.26 or newer (https://go.dev/dl) and run this again" >&2
  return 1
}

# ensure_services [DATABASE_URL [REDIS_URL]] makes sure Go is there and the servers answer: those of the
# URLs when given (see servers_from), the local defaults otherwise.
ensure_services() {
  servers_from "${1:-}" "${2:-}"
  ensure_go && ensure_postgres && ensure_redis
}
