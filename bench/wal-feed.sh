#!/usr/bin/env bash
# What the WAL feed (`wal_feed`) costs: pgfresh with the feed off, on and strict, side by side
# in one run, on select-only and on the read-mostly mix (9 point reads + 1 UPDATE), both with
# the extended protocol.
#
#   bench/wal-feed.sh [options]
#     -T SECONDS     duration of each run (default 15)
#     -c CLIENTS     pgbench clients (default 8; two threads)
#     -s SCALE       pgbench scale factor (default 10)
#     -R ROUNDS      rounds of the whole set (default 1)
#     -d DIR         use a running cluster made by bench/cluster.sh (default: make one, remove it after)
#     -o DIR         where results and logs go (default: a new temp dir)
#     -B             skip `cargo build --release -p pgfresh`
#
# Recorded per run: tps, average latency, failed transactions, pgfresh's CPU per statement
# (utime + stime from /proc), the primary's CPU per statement (every process of its data
# directory: the feed's walsender is among them), the reads sent to the standbys, and the
# commits the feed decoded. The servers, pgbench and pgfresh share the machine: read CPU
# figures as relative within one run. The cluster needs wal_level = logical
# (bench/cluster.sh sets it).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
SECS=15 CLIENTS=8 SCALE=10 ROUNDS=1 CLUSTER_DIR="" OUTDIR="" BUILD=1
while getopts "T:c:s:R:d:o:B" opt; do
    case $opt in
        T) SECS=$OPTARG ;;
        c) CLIENTS=$OPTARG ;;
        s) SCALE=$OPTARG ;;
        R) ROUNDS=$OPTARG ;;
        d) CLUSTER_DIR=$OPTARG ;;
        o) OUTDIR=$OPTARG ;;
        B) BUILD=0 ;;
        *) sed -n 2,20p "$0"; exit 2 ;;
    esac
done

# shellcheck source=bench/lib.sh
source "$HERE/lib.sh"
bench_start wal-feed
bench_cluster
bench_pgbench_init
if [ "$(psql_node "$PRIMARY_PORT" "SHOW wal_level")" != logical ]; then
    echo "the primary's wal_level is not logical: start the cluster with this bench/cluster.sh" >&2
    exit 1
fi
write_mix "$OUTDIR/mix.sql"

# The primary's postmaster and every process it started.
primary_pid() {
    head -1 "$CLUSTER_DIR/node0/postmaster.pid"
}

RESULTS="$OUTDIR/results.tsv"
printf "round\twal_feed\tworkload\ttransactions\tstatements\tfailed\ttps\tlatency_ms\tproxy_cpu_us_per_stmt\tprimary_cpu_us_per_stmt\treplica_reads\treads\tfeed_commits\n" >"$RESULTS"

run_pgbench() {
    local round=$1 mode=$2 workload=$3 port=$4 admin=$5
    local tag="r${round}_${mode}_${workload}" log before after pbefore pafter rc=0 per_tx args
    log="$OUTDIR/$tag.log"
    case $workload in
        select) per_tx=1; args=(-S) ;;
        mix) per_tx=10; args=(-f "$OUTDIR/mix.sql") ;;
    esac
    echo "== round $round, wal_feed=$mode, $workload ($SECS s)"
    metrics_snapshot "$admin" "$OUTDIR/$tag.before.prom" || true
    before=$(cpu_ticks_tree "$PROXY_PID")
    pbefore=$(cpu_ticks_tree_reaped "$(primary_pid)")
    timeout $((SECS + 120)) "$PG_BINDIR/pgbench" -n "${args[@]}" -c "$CLIENTS" -j 2 -T "$SECS" \
        -M extended -h 127.0.0.1 -p "$port" -U app app >"$log" 2>&1 || rc=$?
    after=$(cpu_ticks_tree "$PROXY_PID")
    pafter=$(cpu_ticks_tree_reaped "$(primary_pid)")
    metrics_snapshot "$admin" "$OUTDIR/$tag.after.prom" || true
    if [ $rc -ne 0 ]; then
        echo "   pgbench exited with $rc (log: $log):"; tail -5 "$log" | sed 's/^/   | /'
    fi
    local tx failed tps lat stmts per pper reads commits
    tx=$(awk -F': ' '/number of transactions actually processed/ { split($2, a, "/"); print a[1] }' "$log")
    failed=$(awk -F': ' '/number of failed transactions/ { split($2, a, " "); print a[1] }' "$log")
    tps=$(awk '/^tps = / { print $3 }' "$log")
    lat=$(awk '/^latency average = / { print $4 }' "$log")
    tx=${tx:-0}; failed=${failed:-0}; tps=${tps:-0}; lat=${lat:-nan}
    stmts=$((tx * per_tx))
    per=$(awk -v d=$((after - before)) -v hz="$CLK_TCK" -v n="$stmts" 'BEGIN { if (n > 0) printf "%.1f", d / hz / n * 1e6; else print "n/a" }')
    pper=$(awk -v d=$((pafter - pbefore)) -v hz="$CLK_TCK" -v n="$stmts" 'BEGIN { if (n > 0) printf "%.1f", d / hz / n * 1e6; else print "n/a" }')
    reads=$(metrics_delta "$OUTDIR/$tag.before.prom" "$OUTDIR/$tag.after.prom" pgfresh_routed_total | routed_read_counts)
    commits=$(metrics_delta "$OUTDIR/$tag.before.prom" "$OUTDIR/$tag.after.prom" pgfresh_wal_feed_commits_total | awk '{ s += $NF } END { print s + 0 }')
    printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n" "$round" "$mode" "$workload" "$tx" "$stmts" "$failed" "$tps" "$lat" "$per" "$pper" "${reads% *}" "${reads#* }" "$commits" >>"$RESULTS"
    echo "   tps=$tps latency=${lat}ms failed=$failed pgfresh=${per}us/stmt primary=${pper}us/stmt standby reads=${reads% *}/${reads#* } feed commits=$commits"
}

for round in $(seq 1 "$ROUNDS"); do
    for mode in off on strict; do
        port=$(free_port); admin=$(free_port)
        write_pgfresh_conf "$OUTDIR/pgfresh-$mode.toml" "$port" "$admin" true "wal_feed = \"$mode\""
        start_pgfresh "$OUTDIR/pgfresh-$mode.toml" "$OUTDIR/pgfresh-$mode.r$round.log"
        PROXY_PID=$PGFRESH_PID
        wait_accepting "$port"
        wait_replica_reads "$port"
        if [ "$mode" != off ]; then
            # The feed streams once its slot is made: wait for it (at most 30 s).
            deadline=$((SECONDS + 30))
            until curl -fsS "http://127.0.0.1:$admin/v1/status" | grep -q '"streaming":true'; do
                if [ $SECONDS -ge $deadline ]; then echo "the WAL feed never streamed" >&2; exit 1; fi
                sleep 0.2
            done
        fi
        for workload in select mix; do
            run_pgbench "$round" "$mode" "$workload" "$port" "$admin"
        done
        stop_pid "$PROXY_PID"; PROXY_PID=""
    done
done

echo
echo "results: $RESULTS"
column -t -s $'\t' "$RESULTS"
