#!/usr/bin/env bash
# Makes a PostgreSQL server reachable for the test suite and prints the URL to
# use (without a database name) on its last line, for ONEJOB_TEST_POSTGRES.
#
# 1. A server already answering on 127.0.0.1:5432 as user `postgres` is used.
# 2. Else an installed but stopped Debian cluster is started.
# 3. Else PostgreSQL is installed from Debian's packages and a throwaway
#    cluster (trust auth, owned by the `postgres` user, as initdb refuses root)
#    is started on 127.0.0.1:55432.
set -euo pipefail

log() { echo "ensure-postgres: $*" >&2; }

can_login() { # host port
  if command -v psql >/dev/null 2>&1; then
    psql "postgres://postgres@$1:$2/postgres" -Atqc 'select 1' >/dev/null 2>&1
  else
    (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null
  fi
}

if can_login 127.0.0.1 5432; then
  log "using the PostgreSQL server on 127.0.0.1:5432"
  echo "postgres://postgres@127.0.0.1:5432"
  exit 0
fi

if command -v pg_lsclusters >/dev/null 2>&1 && [ -n "$(pg_lsclusters -h 2>/dev/null)" ]; then
  version=$(pg_lsclusters -h | awk 'NR==1 {print $1}')
  cluster=$(pg_lsclusters -h | awk 'NR==1 {print $2}')
  log "starting the installed cluster $version/$cluster"
  pg_ctlcluster --skip-systemctl-redirect "$version" "$cluster" start >&2 || true
  for _ in $(seq 1 30); do
    if can_login 127.0.0.1 5432; then
      echo "postgres://postgres@127.0.0.1:5432"
      exit 0
    fi
    sleep 1
  done
  log "the installed cluster did not accept user postgres on 127.0.0.1:5432; starting a private one"
fi

if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  log "installing PostgreSQL from Debian's packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq postgresql >&2
fi
bindir=$(dirname "$(ls -d /usr/lib/postgresql/*/bin/initdb | sort -V | tail -n 1)")
port=55432
datadir=/tmp/onejob-ci-pg/data
if ! can_login 127.0.0.1 "$port"; then
  rm -rf /tmp/onejob-ci-pg
  mkdir -p /tmp/onejob-ci-pg/socket
  chown -R postgres:postgres /tmp/onejob-ci-pg
  log "creating a throwaway cluster in $datadir on port $port"
  su postgres -s /bin/sh -c "$bindir/initdb -D $datadir -U postgres --auth=trust >/dev/null"
  su postgres -s /bin/sh -c "$bindir/pg_ctl -D $datadir -l /tmp/onejob-ci-pg/log -w \
    -o '-p $port -k /tmp/onejob-ci-pg/socket -c listen_addresses=127.0.0.1 -c max_connections=300' start" >&2
fi
for _ in $(seq 1 30); do
  if can_login 127.0.0.1 "$port"; then
    echo "postgres://postgres@127.0.0.1:$port"
    exit 0
  fi
  sleep 1
done
log "PostgreSQL did not come up"
exit 1
