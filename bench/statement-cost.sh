#!/usr/bin/env bash
# What one statement costs pgfresh, in numbers a busy machine does not blur: user-space
# instructions (callgrind) and system calls (perf stat), with pgbench through the proxy,
# and the same for PgBouncer when it is installed.
#
#   bench/statement-cost.sh [options]
#     -m MODE        pool_mode: session (default) or transaction
#     -M PROTOCOL    pgbench protocol: extended (default), simple or prepared
#     -w WORKLOAD    select (default: pgbench -S), mix (9 point reads + 1 autocommit
#                    UPDATE, 10 statements a transaction; see write_mix in bench/lib.sh) or
#                    tpcb (pgbench's built-in TPC-B-like transaction: BEGIN, 3 UPDATEs, a
#                    SELECT, an INSERT, END, 7 statements)
#     -t N           transactions per client (default 2000; a mix transaction is 10
#                    statements)
#     -c CLIENTS     pgbench clients while instructions are counted (default 2); with more
#                    clients than the pool's connections (pool_size 20 a node), transaction
#                    mode measures the waits for a connection too
#     -d DIR         use a running cluster made by bench/cluster.sh (default: make one, remove it after)
#     -o DIR         where results and logs go (default: a new temp dir)
#     -B             skip `cargo build --release -p pgfresh`
#     -C             simulate the caches too (callgrind --cache-sim=yes): instruction- and
#                    data-cache misses a statement, first level and last level, beside the
#                    instructions
#     -r             also measure the floor of a tokio proxy: the example bare_relay (a byte
#                    relay, one server connection per client, copy_bidirectional on a
#                    current_thread runtime, no parsing), built with cargo unless -B, in
#                    front of the primary like PgBouncer
# PGFRESH_WORKERS sets [proxy] worker_threads (default 0: pgfresh's own default, one thread).
# CALLGRIND_OPTS adds options to pgfresh's callgrind run (`--dump-instr=yes` for counts an
# instruction, which bench/hot-lines.py reads).
#
# 1. Instructions: pgfresh runs under `valgrind --tool=callgrind` with instrumentation off;
#    it is switched on (callgrind_control) only while pgbench runs its statements, and the
#    total is divided by them. The monitor's full poll runs once a second, so its share is
#    small; in the mix the fast replay polls run (every replay_check_period_ms while reads
#    wait on positions), and pgfresh runs slower under valgrind, so their share a statement
#    is larger than it is at full speed. The profile is left in OUT/callgrind.out* for
#    callgrind_annotate. PgBouncer (session or transaction mode, as -m) is measured the
#    same way, from OUT/pgbouncer-callgrind.out*.
# 2. System calls: pgfresh runs normally; `perf stat` counts recvfrom, sendto and epoll_wait
#    while pgbench runs 8 clients x 5000 statements, next to the same for PgBouncer in
#    session mode when it is installed.
set -euo pipefail
CALLGRIND_OPTS=${CALLGRIND_OPTS:-}

HERE="$(cd "$(dirname "$0")" && pwd)"
MODE=session PROTO=extended WORKLOAD=select N=2000 CLIENTS=2 CLUSTER_DIR="" OUTDIR="" BUILD=1 RELAY=0 CACHE_SIM=no
while getopts "m:M:w:t:c:d:o:BrC" opt; do
    case $opt in
        m) MODE=$OPTARG ;;
        M) PROTO=$OPTARG ;;
        w) WORKLOAD=$OPTARG ;;
        t) N=$OPTARG ;;
        c) CLIENTS=$OPTARG ;;
        d) CLUSTER_DIR=$OPTARG ;;
        o) OUTDIR=$OPTARG ;;
        B) BUILD=0 ;;
        r) RELAY=1 ;;
        C) CACHE_SIM=yes ;;
        *) sed -n 2,37p "$0"; exit 2 ;;
    esac
done
case $WORKLOAD in
    select | mix | tpcb) ;;
    *) echo "unknown workload $WORKLOAD (select, mix or tpcb)" >&2; exit 2 ;;
esac

SCALE=1

# shellcheck source=bench/lib.sh
source "$HERE/lib.sh"
bench_start cost
bench_cluster
bench_pgbench_init

conf() {
    local file=$1 port=$2 admin=$3
    PGFRESH_WORKERS=${PGFRESH_WORKERS:-0} PGFRESH_POOL_EXTRA="pool_mode = \"$MODE\"" write_pgfresh_conf "$file" "$port" "$admin" true
    sed -i 's/^\[monitor\]$/[monitor]\nsr_check_period_ms = 1000/' "$file"
}

STMTS=1
SCRIPT=(-S)
if [ "$WORKLOAD" = mix ]; then
    write_mix "$OUTDIR/mix.sql"
    STMTS=10
    SCRIPT=(-f "$OUTDIR/mix.sql" -s "$SCALE")
elif [ "$WORKLOAD" = tpcb ]; then
    STMTS=7
    SCRIPT=(-b tpcb-like)
fi

pgbench_run() {
    local port=$1 clients=$2 tx=$3
    "$PG_BINDIR/pgbench" -n "${SCRIPT[@]}" -M "$PROTO" -c "$clients" -j 2 -t "$tx" -h 127.0.0.1 -p "$port" -U app app
}

# Instructions a statement of the process PID (run under callgrind, dumping to FILE*),
# counted while pgbench runs CLIENTS x N transactions through PORT: callgrind_at PID PORT FILE
callgrind_at() {
    local pid=$1 port=$2 file=$3 total
    pgbench_run "$port" 2 200 >/dev/null 2>&1
    as_owner "$pid" callgrind_control -z "$pid" >/dev/null 2>&1
    as_owner "$pid" callgrind_control -i on "$pid" >/dev/null 2>&1
    pgbench_run "$port" "$CLIENTS" "$N" >"$file.pgbench.log" 2>&1
    as_owner "$pid" callgrind_control -i off "$pid" >/dev/null 2>&1
    as_owner "$pid" callgrind_control -d "$pid" >/dev/null 2>&1
    total=$(cat "$file".* | awk '/^totals:/ { s += $2 } END { print s + 0 }')
    local misses=""
    if [ "$CACHE_SIM" = yes ]; then
        # totals: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw
        misses=$(cat "$file".* | awk -v n=$((CLIENTS * N * STMTS)) '/^totals:/ { i1 += $5; il += $8; d1 += $6 + $7; ll += $9 + $10 }
            END { printf "; %.1f first-level and %.1f last-level instruction-cache misses, %.1f first-level and %.1f last-level data-cache misses a statement", i1 / n, il / n, d1 / n, ll / n }')
    fi
    echo "$((total / (CLIENTS * N * STMTS))) instructions a statement ($total over $((CLIENTS * N * STMTS)))$misses"
}

# Runs a command as the owner of process PID (callgrind_control must be).
as_owner() {
    local pid=$1; shift
    if [ "$(stat -c %u "/proc/$pid")" != "$(id -u)" ]; then as_pg "$@"; else "$@"; fi
}

# 1. Instructions per statement.
port=$(free_port); admin=$(free_port)
conf "$OUTDIR/callgrind.toml" "$port" "$admin"
valgrind --tool=callgrind --instr-atstart=no --cache-sim="$CACHE_SIM" $CALLGRIND_OPTS --callgrind-out-file="$OUTDIR/callgrind.out" \
    "$PGFRESH_BIN" run -c "$OUTDIR/callgrind.toml" >"$OUTDIR/callgrind.log" 2>&1 &
PROXY_PID=$!
deadline=$((SECONDS + 120))
until "$PG_BINDIR/psql" -XAtq -h 127.0.0.1 -p "$port" -U app -d app -c "SELECT 1" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then echo "pgfresh under valgrind did not start" >&2; exit 1; fi
    sleep 0.5
done
wait_replica_reads "$port"
echo "pgfresh ($MODE, $WORKLOAD, -M $PROTO): $(callgrind_at "$PROXY_PID" "$port" "$OUTDIR/callgrind.out")" | tee "$OUTDIR/results.txt"
stop_pid "$PROXY_PID"; PROXY_PID=""
# The monitor's share (its polls and their tokio-postgres connections): under valgrind
# pgfresh runs slower while the fast polls keep their period, so this share a statement is
# inflated; the rest is the one to compare between builds.
callgrind_annotate --inclusive=yes "$OUTDIR/callgrind.out.1" 2>/dev/null | awk -v n=$((CLIENTS * N * STMTS)) '
    /PROGRAM TOTALS/ { gsub(",", "", $1); t = $1 }
    /monitor::run::\{\{closure\}\} \[/ { gsub(",", "", $1); m += $1 }
    /tokio_postgres::connection::Connection<S,T> as core::future::future::Future>::poll \[/ { gsub(",", "", $1); m += $1 }
    END { printf "  of which the monitor: %d; the rest: %d instructions a statement\n", m / n, (t - m) / n }' |
    tee -a "$OUTDIR/results.txt"

if command -v pgbouncer >/dev/null; then
    port=$(free_port)
    as_pg mkdir -p "$CLUSTER_DIR/pgbouncer-cost"
    as_pg rm -f "$CLUSTER_DIR"/pgbouncer-cost/callgrind.out*
    PGBOUNCER_WRAP="valgrind --tool=callgrind --instr-atstart=no --cache-sim=$CACHE_SIM --callgrind-out-file=$CLUSTER_DIR/pgbouncer-cost/callgrind.out" \
        start_pgbouncer "$CLUSTER_DIR/pgbouncer-cost" "$port" "$MODE"
    echo "pgbouncer ($MODE, $WORKLOAD, -M $PROTO): $(callgrind_at "$PROXY_PID" "$port" "$CLUSTER_DIR/pgbouncer-cost/callgrind.out")" | tee -a "$OUTDIR/results.txt"
    stop_pid "$PROXY_PID"; PROXY_PID=""
    for f in "$CLUSTER_DIR"/pgbouncer-cost/callgrind.out.*; do
        cp "$f" "$OUTDIR/pgbouncer-${f##*/}"
    done
fi

if [ "$RELAY" = 1 ]; then
    if [ "$BUILD" = 1 ]; then
        cargo build --release -p pgfresh-proxy --example bare_relay
    fi
    RELAY_BIN="$(dirname "$PGFRESH_BIN")/examples/bare_relay"
    port=$(free_port)
    valgrind --tool=callgrind --instr-atstart=no --cache-sim="$CACHE_SIM" --callgrind-out-file="$OUTDIR/relay-callgrind.out" \
        "$RELAY_BIN" "127.0.0.1:$port" "127.0.0.1:$PRIMARY_PORT" >"$OUTDIR/relay.log" 2>&1 &
    PROXY_PID=$!
    wait_accepting "$port"
    echo "bare tokio relay (-M $PROTO): $(callgrind_at "$PROXY_PID" "$port" "$OUTDIR/relay-callgrind.out")" | tee -a "$OUTDIR/results.txt"
    stop_pid "$PROXY_PID"; PROXY_PID=""
fi

# 2. System calls per statement.
count_syscalls() {
    local name=$1 pid=$2 port=$3
    pgbench_run "$port" 8 200 >/dev/null 2>&1
    perf stat -e syscalls:sys_enter_recvfrom,syscalls:sys_enter_sendto,syscalls:sys_enter_epoll_wait \
        -p "$pid" -x, -o "$OUTDIR/$name.perf" &
    local perf=$!
    sleep 0.5
    pgbench_run "$port" 8 $((5000 / STMTS)) >"$OUTDIR/$name.pgbench.log" 2>&1
    kill -INT $perf; wait $perf || true
    awk -F, -v who="$name" '/syscalls/ { split($3, e, ":"); sub("sys_enter_", "", e[2]); printf "%s: %.2f %s a statement\n", who, $1 / 40000, e[2] }' "$OUTDIR/$name.perf" | tee -a "$OUTDIR/results.txt"
}
port=$(free_port); admin=$(free_port)
conf "$OUTDIR/pgfresh.toml" "$port" "$admin"
start_pgfresh "$OUTDIR/pgfresh.toml" "$OUTDIR/pgfresh.log"
PROXY_PID=$PGFRESH_PID
wait_accepting "$port"
wait_replica_reads "$port"
count_syscalls pgfresh "$PROXY_PID" "$port"
stop_pid "$PROXY_PID"; PROXY_PID=""

if command -v pgbouncer >/dev/null; then
    port=$(free_port)
    start_pgbouncer "$CLUSTER_DIR/pgbouncer-cost" "$port" "$MODE"
    count_syscalls pgbouncer "$PROXY_PID" "$port"
    stop_pid "$PROXY_PID"; PROXY_PID=""
fi
echo "results: $OUTDIR/results.txt"
