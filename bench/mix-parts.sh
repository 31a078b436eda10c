#!/usr/bin/env bash
# What the read-mostly mix costs pgfresh piece by piece: the mix of bench/pgbench-compare.sh
# (9 point reads and 1 autocommit UPDATE of pgbench_accounts, -M extended) through pgfresh
# in session mode with parts of LSN routing switched off, beside PgBouncer in session mode.
#
#   bench/mix-parts.sh [options]
#     -C "CONFIGS"   which runs, in order, each round (default "default nopoll nolsn pgbouncer"):
#                      default    pgfresh's defaults
#                      nopoll     replay_check_period_ms = 0 (no fast replay polls, no samples)
#                      pN         replay_check_period_ms = N
#                      nolsn      lsn_routing = false (no position probes either)
#                      norecency  enable_recent_access_routing = false (every read may go to a
#                                 standby: unsafe, for the cost of reading there only)
#                      pgbouncer  PgBouncer, session mode, in front of the primary
#     -T SECONDS     how long each measured run lasts (default 10)
#     -c CLIENTS     pgbench clients (default 8)
#     -R ROUNDS      rounds (default 2)
#     -p             also count system calls, futex calls, epoll_wait calls and context
#                    switches a statement (perf stat attached: slower runs)
#     -r             also record where the proxy's time goes (perf record -e cpu-clock
#                    attached: slower runs) into NAME.ROUND.perf.data, with the run's
#                    statements in NAME.ROUND.statements; compare two runs with
#                    bench/perf-diff.py
#     -d DIR         use a running cluster made by bench/cluster.sh (default: make one)
#     -o DIR         where results and logs go (default: a new temp dir)
#     -B             skip `cargo build --release -p pgfresh`
#
# Each line: transactions a second, the proxy's CPU a statement (utime + stime from
# /proc/PID/stat before and after the run, user time apart), the load average, and for
# pgfresh the reads routed to a standby against all reads, the fast replay polls and the
# replay samples of the run (from its metrics). Scale 1.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
CONFIGS="default nopoll nolsn pgbouncer" SECS=10 CLIENTS=8 ROUNDS=2 PERF=0
CLUSTER_DIR="" OUTDIR="" BUILD=1 RECORD=0
while getopts "C:T:c:R:prd:o:B" opt; do
    case $opt in
        C) CONFIGS=$OPTARG ;;
        T) SECS=$OPTARG ;;
        c) CLIENTS=$OPTARG ;;
        R) ROUNDS=$OPTARG ;;
        p) PERF=1 ;;
        r) RECORD=1 ;;
        d) CLUSTER_DIR=$OPTARG ;;
        o) OUTDIR=$OPTARG ;;
        B) BUILD=0 ;;
        *) sed -n 2,32p "$0"; exit 2 ;;
    esac
done
# shellcheck source=bench/lib.sh
source "$HERE/lib.sh"
bench_start mix-parts
bench_cluster
SCALE=1
bench_pgbench_init
write_mix "$OUTDIR/mix.sql"

# user ticks, user + system ticks of PID.
ticks() { awk '{ print $14, $14 + $15 }' "/proc/$1/stat"; }

# sum of the series of metric NAME between two snapshots.
metric_sum() { metrics_delta "$1" "$2" "$3" | awk '{ s += $NF } END { print s + 0 }'; }

# measure NAME PID PORT ROUND [ADMIN]: one measured run; a line of results.
measure() {
    local name=$1 pid=$2 port=$3 round=$4 admin=${5:-} u0 c0 u1 c1 tx perfpid="" recpid="" extra=""
    [ -n "$admin" ] && metrics_snapshot "$admin" "$OUTDIR/m0" || true
    read -r u0 c0 < <(ticks "$pid")
    if [ "$PERF" = 1 ]; then
        perf stat -e 'raw_syscalls:sys_enter,syscalls:sys_enter_futex,syscalls:sys_enter_epoll_wait,context-switches' \
            -p "$pid" -o "$OUTDIR/$name.$round.perf" &
        perfpid=$!
    fi
    if [ "$RECORD" = 1 ]; then
        perf record -F 2000 -e cpu-clock -p "$pid" -o "$OUTDIR/$name.$round.perf.data" >/dev/null 2>&1 &
        recpid=$!
    fi
    PGPASSWORD=app "$PG_BINDIR/pgbench" -n -h 127.0.0.1 -p "$port" -U app -c "$CLIENTS" -j 2 -T "$SECS" \
        -M extended -f "$OUTDIR/mix.sql" -s "$SCALE" app >"$OUTDIR/$name.$round.pgbench.log" 2>&1
    if [ -n "$perfpid" ]; then kill -INT "$perfpid"; wait "$perfpid" || true; fi
    if [ -n "$recpid" ]; then kill -INT "$recpid"; wait "$recpid" || true; fi
    read -r u1 c1 < <(ticks "$pid")
    tx=$(awk '/number of transactions actually processed/ { split($NF, a, "/"); print a[1] }' "$OUTDIR/$name.$round.pgbench.log")
    echo $((tx * 10)) >"$OUTDIR/$name.$round.statements"
    if [ -n "$admin" ]; then
        metrics_snapshot "$admin" "$OUTDIR/m1"
        extra="; replica/reads $(metrics_delta "$OUTDIR/m0" "$OUTDIR/m1" pgfresh_routed_total | routed_read_counts | tr ' ' /)"
        extra="$extra, polls $(metric_sum "$OUTDIR/m0" "$OUTDIR/m1" pgfresh_replay_polls_total)"
        extra="$extra, samples $(metric_sum "$OUTDIR/m0" "$OUTDIR/m1" pgfresh_replay_samples_total)"
    fi
    awk -v n="$name" -v r="$round" -v tx="$tx" -v hz="$CLK_TCK" -v s="$SECS" -v du=$((u1 - u0)) \
        -v dc=$((c1 - c0)) -v load="$(cut -d' ' -f1 /proc/loadavg)" -v extra="$extra" 'BEGIN {
        st = tx * 10
        printf "%-10s round %s: %.0f tps, %.2f us a statement (user %.2f), load %s%s\n",
            n, r, tx / s, dc * 1e6 / hz / st, du * 1e6 / hz / st, load, extra
    }' | tee -a "$OUTDIR/results.txt"
    if [ -n "$perfpid" ]; then
        awk -v st=$((tx * 10)) '/syscalls|context/ { gsub(",", "", $1); printf "    %s %.3f a statement\n", $2, $1 / st }' \
            "$OUTDIR/$name.$round.perf" | tee -a "$OUTDIR/results.txt"
    fi
}

for round in $(seq 1 "$ROUNDS"); do
    for cfg in $CONFIGS; do
        port=$(free_port)
        if [ "$cfg" = pgbouncer ]; then
            start_pgbouncer "$CLUSTER_DIR/pgbouncer-mix" "$port" session
            measure "$cfg" "$PROXY_PID" "$port" "$round"
        else
            admin=$(free_port) routing="" monitor=""
            case $cfg in
                default) ;;
                nopoll) monitor="replay_check_period_ms = 0" ;;
                p[0-9]*) monitor="replay_check_period_ms = ${cfg#p}" ;;
                nolsn) routing="lsn_routing = false" ;;
                norecency) routing="enable_recent_access_routing = false" ;;
                *) echo "unknown configuration $cfg" >&2; exit 2 ;;
            esac
            PGFRESH_MONITOR_EXTRA=$monitor write_pgfresh_conf "$OUTDIR/$cfg.toml" "$port" "$admin" true "$routing"
            start_pgfresh "$OUTDIR/$cfg.toml" "$OUTDIR/$cfg.$round.log"
            PROXY_PID=$PGFRESH_PID
            wait_accepting "$port"
            wait_replica_reads "$port"
            measure "$cfg" "$PROXY_PID" "$port" "$round" "$admin"
        fi
        stop_pid "$PROXY_PID"; PROXY_PID=""
    done
done
echo "results: $OUTDIR/results.txt"
