#!/usr/bin/env bash
# pgbench side by side: direct to the primary, pgfresh (parser on: reads to the standbys),
# pgfresh with enable_query_parser = false (everything to the primary, like a pooler), and
# pgbouncer in session mode pointing at the primary.
#
#   bench/pgbench-compare.sh [options]
#     -T SECONDS     duration of each select-only run (default 20)
#     -N SECONDS     duration of each TPC-B-like (-N) run (default 10)
#     -c CLIENTS     pgbench clients (default 8)
#     -s SCALE       pgbench scale factor (default 10)
#     -d DIR         use a running cluster made by bench/cluster.sh (default: make one, remove it after)
#     -o DIR         where results and logs go (default: a new temp dir)
#     -B             skip `cargo build --release -p pgfresh`
#
# For every target it runs `pgbench -n -S -M simple`, `-S -M prepared` and `-N -M simple`, and
# records tps, average latency, failed transactions and the CPU time the proxy used (utime +
# stime from /proc/PID/stat of the proxy and its child processes, before and after the run)
# divided by the transactions. pgpool-II (Debian package pgpool2) runs too when installed and
# PGPOOL=0 is not set: once with load_balance_mode = on over the standbys, once with it off.
# Set SKIP="pgbouncer pgfresh-noparser ..." to leave targets out.
# The proxy, pgbench and the three servers share the machine: read the CPU figures as relative.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
T_SELECT=20 T_TPCB=10 CLIENTS=8 SCALE=10 CLUSTER_DIR="" OUTDIR="" BUILD=1
while getopts "T:N:c:s:d:o:B" opt; do
    case $opt in
        T) T_SELECT=$OPTARG ;;
        N) T_TPCB=$OPTARG ;;
        c) CLIENTS=$OPTARG ;;
        s) SCALE=$OPTARG ;;
        d) CLUSTER_DIR=$OPTARG ;;
        o) OUTDIR=$OPTARG ;;
        B) BUILD=0 ;;
        *) sed -n 2,21p "$0"; exit 2 ;;
    esac
done

cd "$HERE/.."
if [ $BUILD = 1 ]; then
    cargo build --release -p pgfresh
fi
OUTDIR="${OUTDIR:-$(mktemp -d /tmp/pgfresh-pgbench.XXXXXX)}"
mkdir -p "$OUTDIR"
CLK_TCK=$(getconf CLK_TCK)

# shellcheck source=bench/lib.sh
source "$HERE/lib.sh"
bench_cluster

bench_pgbench_init

RESULTS="$OUTDIR/results.tsv"
printf "target\tmode\tclients\tseconds\ttransactions\tfailed\ttps\tlatency_ms\tproxy_cpu_s\tproxy_cpu_us_per_tx\tloadavg_1m\n" >"$RESULTS"

# run_pgbench TARGET PORT -- PGBENCH_ARGS...   (PROXY_PID set, or empty for direct)
run_pgbench() {
    local target=$1 port=$2 mode=$3 secs=$4; shift 4
    local log="$OUTDIR/${target}_${mode}.log" before=0 after=0
    echo "== $target: pgbench $mode ($secs s)"
    psql_node "$PRIMARY_PORT" "CHECKPOINT" >/dev/null
    if [ -n "$PROXY_PID" ]; then before=$(cpu_ticks_tree "$PROXY_PID"); fi
    local rc=0
    timeout $((secs + 60)) "$PG_BINDIR/pgbench" -n -c "$CLIENTS" -j 2 -T "$secs" -h 127.0.0.1 -p "$port" -U app "$@" app \
        >"$log" 2>&1 || rc=$?
    if [ -n "$PROXY_PID" ]; then after=$(cpu_ticks_tree "$PROXY_PID"); fi
    local load; load=$(cut -d' ' -f1 /proc/loadavg)
    if [ $rc -ne 0 ]; then
        echo "   pgbench exited with $rc (log: $log):"; tail -20 "$log" | sed 's/^/   | /'
    fi
    local tx failed tps lat
    tx=$(awk -F': ' '/number of transactions actually processed/ { split($2, a, "/"); print a[1] }' "$log")
    failed=$(awk -F': ' '/number of failed transactions/ { split($2, a, " "); print a[1] }' "$log")
    tps=$(awk '/^tps = / { print $3 }' "$log")
    lat=$(awk '/^latency average = / { print $4 }' "$log")
    tx=${tx:-0}; failed=${failed:-0}; tps=${tps:-0}; lat=${lat:-nan}
    local cpu_s="" per_tx=""
    if [ -n "$PROXY_PID" ]; then
        cpu_s=$(awk -v d=$((after - before)) -v hz="$CLK_TCK" 'BEGIN { printf "%.2f", d / hz }')
        per_tx=$(awk -v d=$((after - before)) -v hz="$CLK_TCK" -v n="$tx" 'BEGIN { if (n > 0) printf "%.1f", d / hz / n * 1e6; else print "n/a" }')
    fi
    printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n" "$target" "$mode" "$CLIENTS" "$secs" "$tx" "$failed" \
        "$tps" "$lat" "${cpu_s:--}" "${per_tx:--}" "$load" >>"$RESULTS"
    echo "   tps=$tps latency=${lat}ms failed=$failed proxy_cpu=${cpu_s:--}s (${per_tx:--} us/tx) load=$load"
}

run_suite() {
    local target=$1 port=$2
    case " ${SKIP:-} " in *" $target "*) echo "== $target: skipped (SKIP)"; return ;; esac
    run_pgbench "$target" "$port" select-simple "$T_SELECT" -S -M simple
    run_pgbench "$target" "$port" select-prepared "$T_SELECT" -S -M prepared
    run_pgbench "$target" "$port" tpcb-N-simple "$T_TPCB" -N -M simple
}

# 1. Direct to the primary.
PROXY_PID=""
run_suite direct "$PRIMARY_PORT"

# 2. pgfresh, parser on (reads to the standbys) and off (everything to the primary).
for parser in true false; do
    name=$([ $parser = true ] && echo pgfresh || echo pgfresh-noparser)
    port=$(free_port); admin=$(free_port)
    write_pgfresh_conf "$OUTDIR/$name.toml" "$port" "$admin" "$parser"
    start_pgfresh "$OUTDIR/$name.toml" "$OUTDIR/$name.server.log"
    PROXY_PID=$PGFRESH_PID
    wait_accepting "$port"
    if [ $parser = true ]; then wait_replica_reads "$port"; fi
    # Sample the read pool twice a second: why a standby was out of it, and the lag seen.
    ( while kill -0 "$PROXY_PID" 2>/dev/null; do
          curl -fsS "http://127.0.0.1:$admin/v1/status" 2>/dev/null | python3 -c '
import json, sys, time
s = json.load(sys.stdin)
for n in s["nodes"]:
    if n["role"] != "primary":
        print("%.1f %s lag_ms=%s lag_bytes=%s in_pool=%s reason=%s" % (time.time(), n["name"], n["lag_ms"], n["lag_bytes"], n["in_pool"], n["not_in_pool_reason"]))
' || true
          sleep 0.5
      done ) >"$OUTDIR/$name.pool-samples.txt" 2>/dev/null &
    sampler=$!
    run_suite "$name" "$port"
    kill "$sampler" 2>/dev/null || true; wait "$sampler" 2>/dev/null || true
    echo "   standby samples out of the read pool: $(grep -c 'in_pool=False' "$OUTDIR/$name.pool-samples.txt" || true)" \
        "of $(wc -l <"$OUTDIR/$name.pool-samples.txt"); reasons: $(grep -o 'reason=[A-Za-z_]*' "$OUTDIR/$name.pool-samples.txt" | grep -v reason=None | sort | uniq -c | tr '\n' ' ')"
    curl -fsS "http://127.0.0.1:$admin/metrics" >"$OUTDIR/$name.metrics.txt" 2>/dev/null || true
    stop_pid "$PROXY_PID"; PROXY_PID=""
done

# 3. pgbouncer, session pooling, in front of the primary. It refuses to run as root.
if command -v pgbouncer >/dev/null; then
    port=$(free_port)
    bdir="$CLUSTER_DIR/pgbouncer"
    start_pgbouncer "$bdir" "$port" session
    run_suite pgbouncer "$port"
    stop_pid "$PROXY_PID"; PROXY_PID=""
    cp "$bdir/pgbouncer.log" "$OUTDIR/pgbouncer.log" 2>/dev/null || true
else
    echo "pgbouncer is not installed (apt-get install -y pgbouncer): skipped"
fi

# 4. pgpool-II (optional), streaming-replication mode, connection cache on.
if command -v pgpool >/dev/null && [ "${PGPOOL:-1}" != 0 ]; then
    for lb in on off; do
        name=$([ $lb = on ] && echo pgpool-lb || echo pgpool-nolb)
        port=$(free_port); pcp=$(free_port)
        pdir="$CLUSTER_DIR/$name"
        as_pg mkdir -p "$pdir"
        as_pg tee "$pdir/pgpool.conf" >/dev/null <<EOF
backend_clustering_mode = 'streaming_replication'
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$pdir'
pcp_listen_addresses = ''
pcp_port = $pcp
pcp_socket_dir = '$pdir'
pid_file_name = '$pdir/pgpool.pid'
logdir = '$pdir'
backend_hostname0 = '127.0.0.1'
backend_port0 = $PRIMARY_PORT
backend_weight0 = 1
backend_flag0 = 'ALWAYS_PRIMARY'
backend_hostname1 = '127.0.0.1'
backend_port1 = $STANDBY1_PORT
backend_weight1 = 1
backend_hostname2 = '127.0.0.1'
backend_port2 = $STANDBY2_PORT
backend_weight2 = 1
num_init_children = 16
max_pool = 2
connection_cache = on
load_balance_mode = $lb
sr_check_period = 1
sr_check_user = 'postgres'
sr_check_password = ''
health_check_period = 0
enable_pool_hba = off
failover_on_backend_error = off
log_min_messages = warning
EOF
        as_pg touch "$pdir/pcp.conf"
        if [ "$(id -u)" -eq 0 ]; then
            setpriv --reuid=postgres --regid=postgres --init-groups -- pgpool -n -f "$pdir/pgpool.conf" -F "$pdir/pcp.conf" \
                >"$OUTDIR/$name.server.log" 2>&1 &
        else
            pgpool -n -f "$pdir/pgpool.conf" -F "$pdir/pcp.conf" >"$OUTDIR/$name.server.log" 2>&1 &
        fi
        PROXY_PID=$!
        if wait_accepting "$port"; then
            run_suite "$name" "$port"
        else
            echo "pgpool-II did not start; its log:"; tail -20 "$OUTDIR/$name.server.log"
        fi
        stop_pid "$PROXY_PID"; PROXY_PID=""
    done
fi

echo
echo "results: $RESULTS"
column -t -s $'\t' "$RESULTS"
