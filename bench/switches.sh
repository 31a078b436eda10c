#!/usr/bin/env bash
# Where the kernel's share of a statement goes, pgfresh beside PgBouncer: context switches
# (voluntary: the proxy found nothing to do and slept in epoll_wait or io_uring_enter;
# involuntary: a process its send woke took the CPU from it), user and system time a
# statement, and optionally the kernel functions that time was spent in. pgfresh's engine
# is PGFRESH_IO_ENGINE's (epoll unless set; io_uring for the ring).
#
#   bench/switches.sh [options]
#     -M PROTOCOL    pgbench protocol: simple (default), extended or prepared
#     -T SECONDS     how long each measured run lasts (default 10)
#     -c CLIENTS     pgbench clients (default 8)
#     -R ROUNDS      rounds, pgfresh then PgBouncer in each (default 2)
#     -p             also record the kernel functions with `perf record` (one more run of
#                    each proxy) and list, a statement each, those whose time differs most
#     -d DIR         use a running cluster made by bench/cluster.sh (default: make one)
#     -o DIR         where results and logs go (default: a new temp dir)
#     -B             skip `cargo build --release -p pgfresh`
#
# pgbench -S runs through pgfresh (session mode, parser on, reads spread over both
# standbys) and through PgBouncer 1.18 in session mode in front of the primary, one after
# the other; the counters come from /proc/PID/status and /proc/PID/stat of the proxy's
# process, read before and after each measured run (a warm-up run goes first). pgfresh
# runs its sessions on one thread (worker_threads = 0), PgBouncer is single-threaded too.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
PROTO=simple SECS=10 CLIENTS=8 ROUNDS=2 PROFILE=0 CLUSTER_DIR="" OUTDIR="" BUILD=1
while getopts "M:T:c:R:pd:o:B" opt; do
    case $opt in
        M) PROTO=$OPTARG ;;
        T) SECS=$OPTARG ;;
        c) CLIENTS=$OPTARG ;;
        R) ROUNDS=$OPTARG ;;
        p) PROFILE=1 ;;
        d) CLUSTER_DIR=$OPTARG ;;
        o) OUTDIR=$OPTARG ;;
        B) BUILD=0 ;;
        *) sed -n 2,21p "$0"; exit 2 ;;
    esac
done
# shellcheck source=bench/lib.sh
source "$HERE/lib.sh"
bench_start switches
bench_cluster
command -v pgbouncer >/dev/null || { echo "needs pgbouncer (apt-get install pgbouncer)" >&2; exit 1; }
if [ "$PROFILE" = 1 ]; then
    command -v perf >/dev/null || { echo "-p needs perf (apt-get install linux-perf)" >&2; exit 1; }
fi
SCALE=1
bench_pgbench_init

# voluntary, involuntary context switches (of all PID's threads: with io_engine =
# "io_uring" the sessions run on a thread of their own), user and system ticks of PID.
counters() {
    cat "/proc/$1"/task/*/status |
        awk '/^voluntary_ctxt_switches/ { v += $2 } /^nonvoluntary_ctxt_switches/ { n += $2 } END { printf "%s %s ", v, n }'
    awk '{ print $14, $15 }' "/proc/$1/stat"
}

run_pgbench() {
    "$PG_BINDIR/pgbench" -n -S -M "$PROTO" -c "$CLIENTS" -j 2 -T "$1" -h 127.0.0.1 -p "$2" -U app app
}

# measure NAME PID PORT ROUND: one warm-up and one measured run; a line of results.
measure() {
    local name=$1 pid=$2 port=$3 round=$4 v0 n0 u0 s0 v1 n1 u1 s1 tx
    run_pgbench 2 "$port" >/dev/null 2>&1
    read -r v0 n0 u0 s0 < <(counters "$pid")
    run_pgbench "$SECS" "$port" >"$OUTDIR/$name.$round.pgbench.log" 2>&1
    read -r v1 n1 u1 s1 < <(counters "$pid")
    tx=$(awk '/number of transactions actually processed/ { print $NF }' "$OUTDIR/$name.$round.pgbench.log")
    awk -v n="$name" -v r="$round" -v tx="$tx" -v hz="$CLK_TCK" \
        -v dv=$((v1 - v0)) -v dn=$((n1 - n0)) -v du=$((u1 - u0)) -v ds=$((s1 - s0)) 'BEGIN {
        printf "%-8s round %s: %d statements, %.3f voluntary + %.3f involuntary context switches a statement, user %.2f us, system %.2f us a statement\n",
            n, r, tx, dv / tx, dn / tx, du * 1e6 / hz / tx, ds * 1e6 / hz / tx
    }' | tee -a "$OUTDIR/results.txt"
}

# profile NAME PID PORT: the kernel functions' samples (2 000 a second) during one run,
# in OUTDIR/NAME.kernel (samples, symbol), and the run's statements in OUTDIR/NAME.tx.
profile() {
    local name=$1 pid=$2 port=$3 rec
    perf record -F 2000 -e cpu-clock -p "$pid" -o "$OUTDIR/$name.perf.data" -- sleep "$SECS" >/dev/null 2>&1 &
    rec=$!
    run_pgbench "$SECS" "$port" >"$OUTDIR/$name.profile.pgbench.log" 2>&1
    wait "$rec" || true
    awk '/number of transactions actually processed/ { print $NF }' "$OUTDIR/$name.profile.pgbench.log" >"$OUTDIR/$name.tx"
    perf report -i "$OUTDIR/$name.perf.data" --no-children --stdio --sort sym -g none -n 2>/dev/null |
        awk '/^ +[0-9.]+%/ && $3 == "[k]" { print $2, $4 }' >"$OUTDIR/$name.kernel"
}

for round in $(seq 1 "$ROUNDS"); do
    port=$(free_port); admin=$(free_port)
    write_pgfresh_conf "$OUTDIR/pgfresh.toml" "$port" "$admin" true
    start_pgfresh "$OUTDIR/pgfresh.toml" "$OUTDIR/pgfresh.log"
    PROXY_PID=$PGFRESH_PID
    wait_accepting "$port"
    measure pgfresh "$PROXY_PID" "$port" "$round"
    if [ "$PROFILE" = 1 ] && [ "$round" = 1 ]; then profile pgfresh "$PROXY_PID" "$port"; fi
    stop_pid "$PROXY_PID"; PROXY_PID=""
    port=$(free_port)
    start_pgbouncer "$CLUSTER_DIR/pgbouncer-switches" "$port" session
    measure pgbouncer "$PROXY_PID" "$port" "$round"
    if [ "$PROFILE" = 1 ] && [ "$round" = 1 ]; then profile pgbouncer "$PROXY_PID" "$port"; fi
    stop_pid "$PROXY_PID"; PROXY_PID=""
done

if [ "$PROFILE" = 1 ]; then
    # Microseconds a statement in each kernel function (a sample is 500 us), the 15 that
    # pgfresh spends most more time in, and the total.
    awk -v a="$(cat "$OUTDIR/pgfresh.tx")" -v b="$(cat "$OUTDIR/pgbouncer.tx")" '
        FNR == 1 { file++ }
        file == 1 { p[$2] += $1 * 500 / a; all[$2] = 1; tp += $1 * 500 / a }
        file == 2 { q[$2] += $1 * 500 / b; all[$2] = 1; tq += $1 * 500 / b }
        END {
            printf "kernel time a statement: pgfresh %.2f us, pgbouncer %.2f us\n", tp, tq
            print "difference, pgfresh, pgbouncer (us a statement), kernel function"
            for (s in all) printf "%7.3f %7.3f %7.3f %s\n", p[s] - q[s], p[s], q[s], s | "sort -gr | head -15"
        }' "$OUTDIR/pgfresh.kernel" "$OUTDIR/pgbouncer.kernel" | tee -a "$OUTDIR/results.txt"
fi
echo "results: $OUTDIR/results.txt"
