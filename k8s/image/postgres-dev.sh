#!/bin/sh
# Dev only (podman overlay): what the postgres image's entry point does for the dev
# overlay. First start: initdb into $PGDATA with the superuser `postgres` and password
# $POSTGRES_PASSWORD (scram-sha-256 over TCP, trust on the local socket for pg_isready);
# then run the server listening on every address. Signals reach postgres (exec).
set -eu
: "${PGDATA:?PGDATA is not set: the data directory}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  : "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is not set: the superuser password (Secret postgres-dev)}"
  mkdir -p "$PGDATA"
  chmod 0700 "$PGDATA"
  pwfile=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
  initdb --pgdata="$PGDATA" --username=postgres --pwfile="$pwfile" \
    --auth-local=trust --auth-host=scram-sha-256 --encoding=UTF8 --locale=C.UTF-8 >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
  echo "postgres-dev: initialised $PGDATA"
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/var/run/postgresql
