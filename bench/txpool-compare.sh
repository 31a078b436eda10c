#!/usr/bin/env bash
# Transaction pooling side by side: pgfresh (pool_mode = "transaction", parser on: reads to the
# standbys) and PgBouncer (pool_mode = transaction, in front of the primary), both with 20 server
# connections per node, at several client counts.
#
#   bench/txpool-compare.sh [options]
#     -T SECONDS     duration of each run (default 15)
#     -c "N N N"     client counts (default "8 64 500")
#     -s SCALE       pgbench scale factor (default 10)
#     -d DIR         use a running cluster made by bench/cluster.sh (default: make one, remove it after)
#     -o DIR         where results and logs go (default: a new temp dir)
#     -R ROUNDS      rounds (default 2); see below
#     -P             also pgfresh in front of the primary alone (target pgfresh-tx-primary, the
#                    same settings with no standby in its config: every read goes to the
#                    primary, a counted fallback once the start-up window is over), to tell the proxy's own throughput apart from
#                    what spreading the reads over standbys that share the machine's cores
#                    costs the servers
#     -B             skip `cargo build --release -p pgfresh`
#
# Both proxies run for the whole comparison, and each (workload, client count) cell runs on one
# and then the other, the order swapped every round, so a machine whose speed drifts during the
# comparison weighs on both alike. The summary gives each cell's medians over the rounds and
# their ratios, pgfresh over PgBouncer.
#
# Workloads: select-only (`-S -M extended`) and TPC-B-like (`-N -M extended`; unnamed statements,
# which PgBouncer 1.18 handles in transaction mode), pgbench with two
# threads. Recorded per run: tps, average and 99th-percentile latency (from pgbench's
# per-transaction log), failed transactions, the proxy's CPU time per statement (utime + stime
# from /proc/PID/stat before and after, over the statements run: 1 per select-only transaction,
# 5 per TPC-B-like one: BEGIN, UPDATE, SELECT, INSERT, END), and the most server connections the proxy held to any one node
# (its sockets, sampled twice a second). pgbench, the proxy and the three servers share the
# machine: read CPU figures as relative within one run.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
SECS=15 COUNTS="8 64 500" SCALE=10 CLUSTER_DIR="" OUTDIR="" BUILD=1 ROUNDS=2 PRIMARY_ONLY=0
while getopts "T:c:s:d:o:R:PB" opt; do
    case $opt in
        T) SECS=$OPTARG ;;
        c) COUNTS=$OPTARG ;;
        s) SCALE=$OPTARG ;;
        d) CLUSTER_DIR=$OPTARG ;;
        o) OUTDIR=$OPTARG ;;
        R) ROUNDS=$OPTARG ;;
        P) PRIMARY_ONLY=1 ;;
        B) BUILD=0 ;;
        *) sed -n 2,31p "$0"; exit 2 ;;
    esac
done

ulimit -n 65536 2>/dev/null || true

# shellcheck source=bench/lib.sh
source "$HERE/lib.sh"
bench_start txpool
bench_cluster

bench_pgbench_init

# Most server connections of the benchmark user the proxy under test ($PROXY_PID) holds to any
# one node while the file $1 exists: the node's backends of user app whose client port is one of
# the proxy's sockets to it (`ss -p`), so neither the other proxy's connections, up for the
# whole comparison, nor pgfresh's monitor count.
sample_connections() {
    local flag=$1 out=$2 pid=$PROXY_PID max=0 n port ports
    while [ -e "$flag" ]; do
        for port in "$PRIMARY_PORT" "$STANDBY1_PORT" "$STANDBY2_PORT"; do
            ports=$(ss -tnpH state established "( dport = :$port )" 2>/dev/null |
                awk -v p="pid=$pid," 'index($0, p) { n = split($3, a, ":"); printf "%s%s", sep, a[n]; sep = "," }')
            n=0
            if [ -n "$ports" ]; then
                n=$(psql_node "$port" "SELECT count(*) FROM pg_stat_activity WHERE usename = 'app' AND client_port IN ($ports)" 2>/dev/null || echo 0)
            fi
            if [ "${n:-0}" -gt "$max" ]; then max=$n; fi
        done
        echo "$max" >"$out"
        sleep 0.5
    done
}

RESULTS="$OUTDIR/results.tsv"
printf "target\tworkload\tclients\ttransactions\tfailed\ttps\tlatency_ms\tp99_ms\tproxy_cpu_us_per_stmt\tmax_server_conns_per_node\tloadavg_1m\tmachine_busy_pct\tpgbench_cpu_us_per_stmt\tservers_cpu_us_per_stmt\tproxy_user_us_per_stmt\n" >"$RESULTS"

# Busy and total ticks of the whole machine, from /proc/stat: "BUSY TOTAL".
machine_ticks() {
    awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t }' /proc/stat
}

# CPU ticks of each server (primary, standby 1, standby 2), every process under its
# postmaster, exited ones included: "P S1 S2".
servers_ticks() {
    local n pid out=""
    for n in 0 1 2; do
        pid=$(head -1 "$CLUSTER_DIR/node$n/postmaster.pid")
        out="$out $(cpu_ticks_tree_reaped "$pid")"
    done
    echo $out
}

run_pgbench() {
    local target=$1 port=$2 workload=$3 clients=$4; shift 4
    local tag="${target}_${workload}_${clients}" before=0 after=0 ubefore=0 uafter=0 rc=0
    local log="$OUTDIR/$tag.log" txlog="$OUTDIR/txlog_$tag"
    echo "== $target: $workload, $clients clients ($SECS s)"
    psql_node "$PRIMARY_PORT" "CHECKPOINT" >/dev/null
    local flag="$OUTDIR/sampling"; touch "$flag"
    sample_connections "$flag" "$OUTDIR/$tag.conns" &
    local sampler=$!
    local m0 m1 s0 s1 b0 b1
    m0=$(machine_ticks); s0=$(servers_ticks)
    before=$(cpu_ticks_tree "$PROXY_PID"); ubefore=$(cpu_user_ticks_tree_reaped "$PROXY_PID")
    # pgbench's CPU: it is a child (through timeout) of this shell, which has reaped it by then.
    b0=$(awk '{ print $16 + $17 }' /proc/$$/stat)
    timeout $((SECS + 120)) "$PG_BINDIR/pgbench" -n -c "$clients" -j 2 -T "$SECS" -M extended \
        -l --log-prefix="$txlog" -h 127.0.0.1 -p "$port" -U app "$@" app >"$log" 2>&1 || rc=$?
    b1=$(awk '{ print $16 + $17 }' /proc/$$/stat)
    after=$(cpu_ticks_tree "$PROXY_PID"); uafter=$(cpu_user_ticks_tree_reaped "$PROXY_PID")
    m1=$(machine_ticks); s1=$(servers_ticks)
    rm -f "$flag"; wait "$sampler" 2>/dev/null || true
    local load; load=$(cut -d' ' -f1 /proc/loadavg)
    if [ $rc -ne 0 ]; then
        echo "   pgbench exited with $rc (log: $log):"; tail -5 "$log" | sed 's/^/   | /'
    fi
    local tx failed tps lat p99 stmts per user conns
    tx=$(awk -F': ' '/number of transactions actually processed/ { split($2, a, "/"); print a[1] }' "$log")
    failed=$(awk -F': ' '/number of failed transactions/ { split($2, a, " "); print a[1] }' "$log")
    tps=$(awk '/^tps = / { print $3 }' "$log")
    lat=$(awk '/^latency average = / { print $4 }' "$log")
    # Column 3 of pgbench's transaction log is the latency in microseconds.
    p99=$(cat "$txlog".* 2>/dev/null | awk '{ print $3 }' | sort -n | awk '{ v[NR] = $1 } END { if (NR) printf "%.2f", v[int(NR * 0.99)] / 1000; else print "n/a" }')
    rm -f "$txlog".*
    tx=${tx:-0}; failed=${failed:-0}; tps=${tps:-0}; lat=${lat:-nan}
    # pgbench -N (simple-update): BEGIN, UPDATE, SELECT, INSERT, END.
    stmts=$([ "$workload" = select ] && echo 1 || echo 5)
    per=$(awk -v d=$((after - before)) -v hz="$CLK_TCK" -v n="$tx" -v k="$stmts" 'BEGIN { if (n > 0) printf "%.1f", d / hz / (n * k) * 1e6; else print "n/a" }')
    user=$(awk -v d=$((uafter - ubefore)) -v hz="$CLK_TCK" -v n="$tx" -v k="$stmts" 'BEGIN { if (n > 0) printf "%.2f", d / hz / (n * k) * 1e6; else print "n/a" }')
    conns=$(cat "$OUTDIR/$tag.conns" 2>/dev/null || echo "?")
    local busy bench_per servers_per
    busy=$(awk -v a="$m0" -v b="$m1" 'BEGIN { split(a, x, " "); split(b, y, " "); if (y[2] > x[2]) printf "%.0f", (y[1] - x[1]) / (y[2] - x[2]) * 100; else print "n/a" }')
    bench_per=$(awk -v d=$((b1 - b0)) -v hz="$CLK_TCK" -v n="$tx" -v k="$stmts" 'BEGIN { if (n > 0) printf "%.1f", d / hz / (n * k) * 1e6; else print "n/a" }')
    # Total, then (primary / standby 1 / standby 2).
    servers_per=$(awk -v a="$s0" -v b="$s1" -v hz="$CLK_TCK" -v n="$tx" -v k="$stmts" 'BEGIN {
        split(a, x, " "); split(b, y, " ")
        if (n == 0) { print "n/a"; exit }
        for (i = 1; i <= 3; i++) { d[i] = (y[i] - x[i]) / hz / (n * k) * 1e6; t += d[i] }
        printf "%.1f (%.1f / %.1f / %.1f)", t, d[1], d[2], d[3] }')
    printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n" "$target" "$workload" "$clients" "$tx" "$failed" \
        "$tps" "$lat" "$p99" "$per" "$conns" "$load" "$busy" "$bench_per" "$servers_per" "$user" >>"$RESULTS"
    echo "   tps=$tps latency=${lat}ms p99=${p99}ms failed=$failed proxy_cpu=${per}us/stmt (user ${user}) server_conns<=$conns load=$load"
    echo "   machine busy=${busy}% pgbench=${bench_per}us/stmt servers=${servers_per}us/stmt"
}

# 1. pgfresh, transaction mode, 20 connections per node; with -P, 2. the same in front of the
# primary alone; 3. PgBouncer, transaction mode, in front of the primary (it refuses to run as
# root). All stay up until the end. TARGETS lists "NAME PORT PID" per target.
TARGETS=()
stop_all() {
    local t
    for t in "${TARGETS[@]}"; do stop_pid "${t##* }"; done
    PROXY_PID=""
    bench_cleanup
}
trap stop_all EXIT
fresh_port=$(free_port); admin=$(free_port)
PGFRESH_POOL_SIZE=20 PGFRESH_POOL_EXTRA='pool_mode = "transaction"' \
    write_pgfresh_conf "$OUTDIR/pgfresh.toml" "$fresh_port" "$admin" true
start_pgfresh "$OUTDIR/pgfresh.toml" "$OUTDIR/pgfresh.server.log"
TARGETS+=("pgfresh-tx $fresh_port $PGFRESH_PID")
wait_accepting "$fresh_port"
wait_replica_reads "$fresh_port"
if [ "$PRIMARY_ONLY" = 1 ]; then
    port=$(free_port)
    PGFRESH_POOL_SIZE=20 PGFRESH_POOL_EXTRA='pool_mode = "transaction"' \
        write_pgfresh_conf "$OUTDIR/pgfresh-primary.toml" "$port" "$(free_port)" true
    # Without the standbys' [[nodes]] entries (paragraphs).
    awk 'BEGIN { RS = ""; ORS = "\n\n" } !/name = "pg[12]"/' "$OUTDIR/pgfresh-primary.toml" >"$OUTDIR/pgfresh-primary.tmp"
    mv "$OUTDIR/pgfresh-primary.tmp" "$OUTDIR/pgfresh-primary.toml"
    start_pgfresh "$OUTDIR/pgfresh-primary.toml" "$OUTDIR/pgfresh-primary.server.log"
    TARGETS+=("pgfresh-tx-primary $port $PGFRESH_PID")
    wait_accepting "$port"
fi
if command -v pgbouncer >/dev/null; then
    port=$(free_port)
    start_pgbouncer "$CLUSTER_DIR/pgbouncer" "$port" transaction
    TARGETS+=("pgbouncer-tx $port $PROXY_PID")
else
    echo "pgbouncer is not installed (apt-get install -y pgbouncer): skipped"
fi

# One cell on one target: run_cell "NAME PORT PID" WORKLOAD CLIENTS
run_cell() {
    local name port flag
    read -r name port PROXY_PID <<<"$1"
    flag=$([ "$2" = select ] && echo -S || echo -N)
    run_pgbench "$name" "$port" "$2" "$3" "$flag"
    PROXY_PID=""
}

for round in $(seq 1 "$ROUNDS"); do
    echo "== round $round of $ROUNDS"
    for c in $COUNTS; do
        for w in select tpcb; do
            # The targets in order, reversed every other round.
            for i in "${!TARGETS[@]}"; do
                if [ $((round % 2)) -eq 1 ]; then
                    run_cell "${TARGETS[$i]}" "$w" "$c"
                else
                    run_cell "${TARGETS[$((${#TARGETS[@]} - 1 - i))]}" "$w" "$c"
                fi
            done
        done
    done
done
curl -fsS "http://127.0.0.1:$admin/metrics" >"$OUTDIR/pgfresh.metrics.txt" 2>/dev/null || true

echo
echo "results: $RESULTS"
column -t -s $'\t' "$RESULTS"

# Medians over the rounds, per target and cell: tps, p99, proxy CPU a statement (all, user space
# only), the servers' CPU a statement, and the ratios
# of tps and CPU to PgBouncer's.
SUMMARY="$OUTDIR/summary.tsv"
printf "target\tworkload\tclients\ttps\tp99_ms\tproxy_cpu_us\tproxy_user_us\tservers_cpu_us\ttps_vs_pgbouncer\tcpu_vs_pgbouncer\n" >"$SUMMARY"
awk -F'\t' '
    function median(list,    n, v, i, j, t) {
        n = split(list, v, " ")
        for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j - 1] + 0 > v[j] + 0; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
        if (n == 0) return "n/a"
        return (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
    }
    NR == 1 { next }
    {
        k = $1 "\t" $2 "\t" $3; cells[k] = 1
        tps[k] = tps[k] " " $6; p99[k] = p99[k] " " $8; cpu[k] = cpu[k] " " $9; usr[k] = usr[k] " " $15
        split($14, sv, " "); srv[k] = srv[k] " " sv[1]
    }
    END {
        for (k in cells) {
            split(k, f, "\t"); b = "pgbouncer-tx\t" f[2] "\t" f[3]
            t = median(tps[k]); c = median(cpu[k])
            bt = (b in cells) ? median(tps[b]) : 0; bc = (b in cells) ? median(cpu[b]) : 0
            printf "%s\t%.0f\t%s\t%.1f\t%s\t%s\t%s\t%s\n", k, t, median(p99[k]), c, median(usr[k]), median(srv[k]),
                (bt + 0 > 0) ? sprintf("%.2f", t / bt) : "n/a", (bc + 0 > 0) ? sprintf("%.2f", c / bc) : "n/a"
        }
    }' "$RESULTS" | sort -t$'\t' -k2,2 -k3,3n -k1,1 >>"$SUMMARY"
echo
echo "medians over $ROUNDS rounds: $SUMMARY"
column -t -s $'\t' "$SUMMARY"
