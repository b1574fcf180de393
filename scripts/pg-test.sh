#!/usr/bin/env bash
# A throwaway PostgreSQL for the tests: `scripts/pg-test.sh start DIR` initialises a cluster in DIR
# (created, owned by the `postgres` user), listening on a unix socket in DIR only (no TCP, so parallel
# clusters never clash on a port), and prints the URL the tests read from VIPWATCH_TEST_PG_URL;
# `scripts/pg-test.sh stop DIR` stops it and removes DIR; `restart DIR` restarts it (fast shutdown:
# every session is cut, as in a fail-over of the server). Durability is off (fsync, full-page writes):
# the data is thrown away anyway; with PG_TEST_DURABLE=1 it is as docs/how-to/postgresql-replicas.md
# recommends for production (fsync and full-page writes on, synchronous_commit off), for benchmarks. Runs as root (via `runuser -u postgres`, initdb refuses root) or as
# any other user directly. README "Two commands" and docs/how-to/postgresql-replicas.md.
set -euo pipefail
cmd=${1:?usage: pg-test.sh start|restart|stop DIR}
dir=${2:?usage: pg-test.sh start|restart|stop DIR}
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
[ -x "$bin/initdb" ] || { echo "PostgreSQL server binaries not found under /usr/lib/postgresql (apt-get install postgresql)" >&2; exit 1; }
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
case "$cmd" in
start)
    mkdir -p "$dir"
    # Others must reach the socket in DIR: the tests also run vipwatch as an unprivileged user (the
    # image's uid). mktemp -d makes it 0700.
    chmod 0755 "$dir"
    [ "$(id -u)" = 0 ] && chown postgres: "$dir"
    as_pg "$bin/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; exit 1; }
    durability="-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    [ "${PG_TEST_DURABLE:-}" = 1 ] && durability="-c fsync=on -c synchronous_commit=off -c full_page_writes=on"
    as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -o "-c listen_addresses='' -k $dir \
        $durability -c max_connections=300" start >/dev/null \
        || { cat "$dir/server.log" >&2; exit 1; }
    echo "postgres://postgres@localhost/postgres?host=$dir"
    ;;
restart)
    as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -m fast -w restart >/dev/null \
        || { cat "$dir/server.log" >&2; exit 1; }
    ;;
stop)
    [ -d "$dir/data" ] && as_pg "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null || true
    rm -rf "$dir"
    ;;
*) echo "usage: pg-test.sh start|restart|stop DIR" >&2; exit 2 ;;
esac
