#!/usr/bin/env bash
# TLS toward clients side by side: pgfresh (session mode, parser on: reads to the standbys) and
# PgBouncer (session mode, in front of the primary), each plain and with
# client_tls_sslmode = require, in one run.
#
#   bench/tls-compare.sh [options]
#     -T SECONDS     duration of each run (default 15)
#     -c CLIENTS     pgbench clients (default 8; two threads)
#     -s SCALE       pgbench scale factor (default 10)
#     -d DIR         use a running cluster made by bench/cluster.sh (default: make one, remove it after)
#     -o DIR         where results and logs go (default: a new temp dir)
#     -B             skip `cargo build --release -p pgfresh`
#
# Workloads: select-only with the simple and the extended protocol. pgbench connects once per
# client (sslmode=require for the TLS runs), so the handshake is paid once and the figures are
# the per-statement cost of encrypting and decrypting. The certificate is a fresh
# self-signed P-256 one (openssl). Recorded per run: tps, average latency, failed transactions
# and the proxy's CPU time per statement (utime + stime from /proc/PID/stat before and after).
# pgbench, the proxy and the three servers share the machine: read CPU figures as relative
# within one run.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
SECS=15 CLIENTS=8 SCALE=10 CLUSTER_DIR="" OUTDIR="" BUILD=1
while getopts "T:c:s:d:o:B" opt; do
    case $opt in
        T) SECS=$OPTARG ;;
        c) CLIENTS=$OPTARG ;;
        s) SCALE=$OPTARG ;;
        d) CLUSTER_DIR=$OPTARG ;;
        o) OUTDIR=$OPTARG ;;
        B) BUILD=0 ;;
        *) sed -n 2,20p "$0"; exit 2 ;;
    esac
done


# shellcheck source=bench/lib.sh
source "$HERE/lib.sh"
bench_start tls
bench_cluster
bench_pgbench_init

# The certificate both proxies serve, readable by the postgres user (PgBouncer runs as it).
CERTDIR="$CLUSTER_DIR/tls"
as_pg mkdir -p "$CERTDIR"
as_pg openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj /CN=localhost -keyout "$CERTDIR/server.key" -out "$CERTDIR/server.pem" 2>/dev/null

RESULTS="$OUTDIR/results.tsv"
printf "target\ttls\tprotocol\ttransactions\tfailed\ttps\tlatency_ms\tproxy_cpu_us_per_stmt\n" >"$RESULTS"

run_pgbench() {
    local target=$1 port=$2 sslmode=$3 protocol=$4
    local tag="${target}_${sslmode}_${protocol}" before after rc=0 log
    log="$OUTDIR/$tag.log"
    echo "== $target, sslmode=$sslmode, $protocol ($SECS s)"
    before=$(cpu_ticks_tree "$PROXY_PID")
    PGSSLMODE=$sslmode timeout $((SECS + 120)) "$PG_BINDIR/pgbench" -n -S -c "$CLIENTS" -j 2 -T "$SECS" \
        -M "$protocol" -h 127.0.0.1 -p "$port" -U app app >"$log" 2>&1 || rc=$?
    after=$(cpu_ticks_tree "$PROXY_PID")
    if [ $rc -ne 0 ]; then
        echo "   pgbench exited with $rc (log: $log):"; tail -5 "$log" | sed 's/^/   | /'
    fi
    local tx failed tps lat per
    tx=$(awk -F': ' '/number of transactions actually processed/ { split($2, a, "/"); print a[1] }' "$log")
    failed=$(awk -F': ' '/number of failed transactions/ { split($2, a, " "); print a[1] }' "$log")
    tps=$(awk '/^tps = / { print $3 }' "$log")
    lat=$(awk '/^latency average = / { print $4 }' "$log")
    tx=${tx:-0}; failed=${failed:-0}; tps=${tps:-0}; lat=${lat:-nan}
    per=$(awk -v d=$((after - before)) -v hz="$CLK_TCK" -v n="$tx" 'BEGIN { if (n > 0) printf "%.1f", d / hz / n * 1e6; else print "n/a" }')
    local tls=no; [ "$sslmode" = require ] && tls=yes
    printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n" "$target" "$tls" "$protocol" "$tx" "$failed" "$tps" "$lat" "$per" >>"$RESULTS"
    echo "   tps=$tps latency=${lat}ms failed=$failed proxy_cpu=${per}us/stmt"
}

run_suite() {
    local target=$1 port=$2 protocol
    for protocol in simple extended; do
        run_pgbench "$target" "$port" disable "$protocol"
        run_pgbench "$target" "$port" require "$protocol"
    done
}

# 1. pgfresh, plain clients and TLS clients on the same port (client_tls_sslmode = prefer;
#    pgbench chooses with PGSSLMODE).
port=$(free_port); admin=$(free_port)
write_pgfresh_conf "$OUTDIR/pgfresh.toml" "$port" "$admin" true
cat >>"$OUTDIR/pgfresh.toml" <<EOF

[tls]
client_tls_sslmode = "prefer"
client_tls_cert_file = "$CERTDIR/server.pem"
client_tls_key_file = "$CERTDIR/server.key"
EOF
start_pgfresh "$OUTDIR/pgfresh.toml" "$OUTDIR/pgfresh.server.log"
PROXY_PID=$PGFRESH_PID
wait_accepting "$port"
wait_replica_reads "$port"
run_suite pgfresh "$port"
stop_pid "$PROXY_PID"; PROXY_PID=""

# 2. PgBouncer, session mode, in front of the primary, plain clients and TLS clients on the
#    same port (client_tls_sslmode = prefer; pgbench chooses with PGSSLMODE).
if command -v pgbouncer >/dev/null; then
    port=$(free_port)
    start_pgbouncer "$CLUSTER_DIR/pgbouncer-tls" "$port" session "client_tls_sslmode = prefer
client_tls_cert_file = $CERTDIR/server.pem
client_tls_key_file = $CERTDIR/server.key"
    run_suite pgbouncer "$port"
    stop_pid "$PROXY_PID"; PROXY_PID=""
else
    echo "pgbouncer is not installed (apt-get install -y pgbouncer): skipped"
fi

echo
echo "results: $RESULTS"
column -t -s $'\t' "$RESULTS"
