#!/usr/bin/env bash
# What spreading reads over the standbys does to the servers' throughput on this machine,
# with no proxy at all: pgbench -S straight to the nodes of one bench cluster, where the
# three servers share the machine's cores. The same connections on one node, then split
# over both standbys, then twice as many; each round runs every layout once.
#
#   bench/spread-cost.sh [options]
#     -c CONNECTIONS server connections in all (default 20, what a pool of 20 a node gives
#                    one node; pgfresh in transaction mode at 500 clients keeps 20 on each)
#     -M PROTOCOL    pgbench protocol (default extended)
#     -T SECONDS     how long each run lasts (default 10)
#     -R ROUNDS      rounds (default 2)
#     -d DIR         use a running cluster made by bench/cluster.sh (default: make one)
#     -o DIR         where results and logs go (default: a new temp dir)
#
# Each line: the layout and the transactions a second of every pgbench in it, and their sum.
# Scale 10.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
CONNS=20 PROTO=extended SECS=10 ROUNDS=2 CLUSTER_DIR="" OUTDIR="" BUILD=0
while getopts "c:M:T:R:d:o:" opt; do
    case $opt in
        c) CONNS=$OPTARG ;;
        M) PROTO=$OPTARG ;;
        T) SECS=$OPTARG ;;
        R) ROUNDS=$OPTARG ;;
        d) CLUSTER_DIR=$OPTARG ;;
        o) OUTDIR=$OPTARG ;;
        *) sed -n 2,17p "$0"; exit 2 ;;
    esac
done
# shellcheck source=bench/lib.sh
source "$HERE/lib.sh"
bench_start spread-cost
bench_cluster
SCALE=10
bench_pgbench_init

# run LOG PORT CLIENTS: one pgbench; prints its transactions a second.
run() {
    PGPASSWORD=app "$PG_BINDIR/pgbench" -n -S -M "$PROTO" -h 127.0.0.1 -p "$2" -U app \
        -c "$3" -j 1 -T "$SECS" app >"$1" 2>&1
    awk '/^tps = / { printf "%.0f\n", $3 }' "$1"
}

# layout NAME ROUND PORT:CLIENTS...: the pgbench runs at once, one a node; a line of results.
layout() {
    local name=$1 round=$2 i=0 pids=() spec tps sum=0 line=""
    shift 2
    for spec in "$@"; do
        run "$OUTDIR/$name.$round.$i.log" "${spec%%:*}" "${spec##*:}" >"$OUTDIR/$name.$round.$i.tps" &
        pids+=($!)
        i=$((i + 1))
    done
    wait "${pids[@]}"
    for ((i = 0; i < $#; i++)); do
        tps=$(cat "$OUTDIR/$name.$round.$i.tps")
        sum=$((sum + tps))
        line="$line${line:+ + }$tps"
    done
    printf "%-34s round %s: %s = %d tps\n" "$name" "$round" "$line" "$sum" | tee -a "$OUTDIR/results.txt"
}

half=$((CONNS / 2))
for round in $(seq 1 "$ROUNDS"); do
    layout "primary, $CONNS" "$round" "$PRIMARY_PORT:$CONNS"
    layout "standby1, $CONNS" "$round" "$STANDBY1_PORT:$CONNS"
    layout "standbys, $half + $half" "$round" "$STANDBY1_PORT:$half" "$STANDBY2_PORT:$half"
    layout "standbys, $CONNS + $CONNS" "$round" "$STANDBY1_PORT:$CONNS" "$STANDBY2_PORT:$CONNS"
    layout "primary, $((2 * CONNS))" "$round" "$PRIMARY_PORT:$((2 * CONNS))"
done
echo "results: $OUTDIR/results.txt"
