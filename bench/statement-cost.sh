#!/usr/bin/env bash
# What one statement costs pgfresh, in numbers a busy machine does not blur: user-space
# instructions (callgrind) and system calls (perf stat), with pgbench -S through the proxy.
#
#   bench/statement-cost.sh [options]
#     -m MODE        pool_mode: session (default) or transaction
#     -M PROTOCOL    pgbench protocol: extended (default), simple or prepared
#     -t N           transactions per client, two clients (default 2000)
#     -d DIR         use a running cluster made by bench/cluster.sh (default: make one, remove it after)
#     -o DIR         where results and logs go (default: a new temp dir)
#     -B             skip `cargo build --release -p pgfresh`
# PGFRESH_WORKERS sets [proxy] worker_threads (default 0: pgfresh's own default, one thread).
#
# 1. Instructions: pgfresh runs under `valgrind --tool=callgrind` with instrumentation off;
#    it is switched on (callgrind_control) only while pgbench runs its 2 x N statements, and
#    the total is divided by them. The monitor polls once a second, so its share is small.
#    The profile is left in OUT/callgrind.out* for callgrind_annotate.
# 2. System calls: pgfresh runs normally; `perf stat` counts recvfrom, sendto and epoll_wait
#    while pgbench runs 8 clients x 5000 statements, next to the same for PgBouncer in
#    session mode when it is installed.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
MODE=session PROTO=extended N=2000 CLUSTER_DIR="" OUTDIR="" BUILD=1
while getopts "m:M:t:d:o:B" opt; do
    case $opt in
        m) MODE=$OPTARG ;;
        M) PROTO=$OPTARG ;;
        t) N=$OPTARG ;;
        d) CLUSTER_DIR=$OPTARG ;;
        o) OUTDIR=$OPTARG ;;
        B) BUILD=0 ;;
        *) sed -n 2,20p "$0"; exit 2 ;;
    esac
done

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

pgbench_run() {
    local port=$1 clients=$2 tx=$3
    "$PG_BINDIR/pgbench" -n -S -M "$PROTO" -c "$clients" -j 2 -t "$tx" -h 127.0.0.1 -p "$port" -U app app
}

# 1. Instructions per statement.
port=$(free_port); admin=$(free_port)
conf "$OUTDIR/callgrind.toml" "$port" "$admin"
valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$OUTDIR/callgrind.out" \
    "$PGFRESH_BIN" run -c "$OUTDIR/callgrind.toml" >"$OUTDIR/callgrind.log" 2>&1 &
PROXY_PID=$!
deadline=$((SECONDS + 120))
until "$PG_BINDIR/psql" -XAtq -h 127.0.0.1 -p "$port" -U app -d app -c "SELECT 1" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then echo "pgfresh under valgrind did not start" >&2; exit 1; fi
    sleep 0.5
done
wait_replica_reads "$port"
pgbench_run "$port" 2 200 >/dev/null 2>&1
callgrind_control -i on "$PROXY_PID" >/dev/null
pgbench_run "$port" 2 "$N" >"$OUTDIR/callgrind.pgbench.log" 2>&1
callgrind_control -i off "$PROXY_PID" >/dev/null
callgrind_control -d "$PROXY_PID" >/dev/null
stop_pid "$PROXY_PID"; PROXY_PID=""
total=$(cat "$OUTDIR"/callgrind.out* | awk '/^totals:/ { s += $2 } END { print s + 0 }')
echo "pgfresh ($MODE, -M $PROTO): $((total / (2 * N))) instructions a statement ($total over $((2 * N)))" | tee "$OUTDIR/results.txt"

# 2. System calls per statement.
count_syscalls() {
    local name=$1 pid=$2 port=$3
    pgbench_run "$port" 8 200 >/dev/null 2>&1
    perf stat -e syscalls:sys_enter_recvfrom,syscalls:sys_enter_sendto,syscalls:sys_enter_epoll_wait \
        -p "$pid" -x, -o "$OUTDIR/$name.perf" &
    local perf=$!
    sleep 0.5
    pgbench_run "$port" 8 5000 >"$OUTDIR/$name.pgbench.log" 2>&1
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
