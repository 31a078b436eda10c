#!/usr/bin/env bash
# A throwaway PostgreSQL primary + 2 streaming hot standbys on free loopback ports, for the
# proxy benchmarks.
#
#   bench/cluster.sh start [DIR]   create and start; prints the ports and writes DIR/cluster.env
#   bench/cluster.sh stop DIR      stop every server (immediate mode) and remove DIR
#
# DIR defaults to a fresh `mktemp -d`. The servers run from the installed binaries
# (`pg_config --bindir`, or $PG_BINDIR). PostgreSQL refuses to run as root, so when this script
# runs as root the servers and tools run as the `postgres` OS user (setpriv) in a directory
# that user owns. Settings are for benchmarks, not durability: fsync and full_page_writes off.
# TCP connections from 127.0.0.1 are trusted. The login role `app` owns the database `app`.
#
# cluster.env defines: BENCH_DIR PG_BINDIR PG_SOCKDIR PRIMARY_PORT STANDBY1_PORT STANDBY2_PORT
set -Eeuo pipefail

PG_BINDIR="${PG_BINDIR:-$(pg_config --bindir)}"

# as_pg and free_port come from the shared helpers.
# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# Poll `psql -c SQL` on PORT until it prints EXPECTED, for at most 60 s.
wait_for() {
    local port=$1 sql=$2 expected=$3 what=$4 deadline=$((SECONDS + 60)) out=""
    while [ $SECONDS -lt $deadline ]; do
        out=$(as_pg "$PG_BINDIR/psql" -XAtq -h "$DIR" -p "$port" -U postgres -d postgres -c "$sql" 2>/dev/null || true)
        if [ "$out" = "$expected" ]; then return 0; fi
        sleep 0.1
    done
    echo "cluster.sh: timed out waiting for $what (last answer: '$out')" >&2
    return 1
}

start() {
    DIR="${1:-$(mktemp -d /tmp/pgfresh-bench.XXXXXX)}"
    mkdir -p "$DIR"
    # Half-built clusters are not left running.
    trap 'echo "cluster.sh: start failed; removing $DIR" >&2; stop "$DIR" >/dev/null 2>&1 || true' ERR
    if [ "$(id -u)" -eq 0 ]; then chown postgres:postgres "$DIR"; fi
    chmod 755 "$DIR"

    local p0 p1 p2
    p0=$(free_port); p1=$(free_port); p2=$(free_port)
    while [ "$p1" = "$p0" ]; do p1=$(free_port); done
    while [ "$p2" = "$p0" ] || [ "$p2" = "$p1" ]; do p2=$(free_port); done

    as_pg "$PG_BINDIR/initdb" -D "$DIR/node0" -U postgres -A trust --no-sync -E UTF8 --locale=C >"$DIR/initdb.log"
    as_pg tee -a "$DIR/node0/postgresql.conf" >/dev/null <<EOF
listen_addresses = '127.0.0.1'
port = $p0
unix_socket_directories = '$DIR'
fsync = off
full_page_writes = off
synchronous_commit = on
wal_level = logical
hot_standby = on
max_wal_senders = 10
max_connections = 300
shared_buffers = 256MB
logging_collector = off
EOF
    as_pg tee -a "$DIR/node0/pg_hba.conf" >/dev/null <<EOF
host all all 127.0.0.1/32 trust
host replication all 127.0.0.1/32 trust
EOF
    as_pg "$PG_BINDIR/pg_ctl" -D "$DIR/node0" -l "$DIR/node0.log" -w -t 90 start >/dev/null
    as_pg "$PG_BINDIR/psql" -XAtq -v ON_ERROR_STOP=1 -h "$DIR" -p "$p0" -U postgres -d postgres \
        -c "CREATE ROLE app LOGIN" -c "CREATE DATABASE app OWNER app" >/dev/null

    local i port
    for i in 1 2; do
        port=$([ $i = 1 ] && echo "$p1" || echo "$p2")
        as_pg "$PG_BINDIR/pg_basebackup" -h 127.0.0.1 -p "$p0" -U postgres -D "$DIR/node$i" \
            -X stream -R -c fast --no-sync
        echo "port = $port" | as_pg tee -a "$DIR/node$i/postgresql.conf" >/dev/null
        echo "cluster_name = 'node$i'" | as_pg tee -a "$DIR/node$i/postgresql.conf" >/dev/null
        as_pg "$PG_BINDIR/pg_ctl" -D "$DIR/node$i" -l "$DIR/node$i.log" -w -t 90 start >/dev/null
    done
    wait_for "$p1" "SELECT status FROM pg_stat_wal_receiver" streaming "standby 1 streaming"
    wait_for "$p2" "SELECT status FROM pg_stat_wal_receiver" streaming "standby 2 streaming"

    cat >"$DIR/cluster.env" <<EOF
BENCH_DIR=$DIR
PG_BINDIR=$PG_BINDIR
PG_SOCKDIR=$DIR
PRIMARY_PORT=$p0
STANDBY1_PORT=$p1
STANDBY2_PORT=$p2
EOF
    echo "cluster dir: $DIR"
    echo "primary:  127.0.0.1:$p0"
    echo "standby1: 127.0.0.1:$p1"
    echo "standby2: 127.0.0.1:$p2"
    echo "env file: $DIR/cluster.env"
}

stop() {
    DIR="${1:?usage: cluster.sh stop DIR}"
    [ -f "$DIR/cluster.env" ] || [ -d "$DIR/node0" ] || { echo "cluster.sh: $DIR is not a bench cluster" >&2; exit 1; }
    local n
    for n in 2 1 0; do
        if [ -f "$DIR/node$n/postmaster.pid" ]; then
            as_pg "$PG_BINDIR/pg_ctl" -D "$DIR/node$n" -m immediate -w stop >/dev/null 2>&1 || true
        fi
    done
    rm -rf "$DIR"
    echo "removed $DIR"
}

case "${1:-}" in
    start) shift; start "$@" ;;
    stop) shift; stop "$@" ;;
    *) echo "usage: $0 start [DIR] | stop DIR" >&2; exit 2 ;;
esac
