#!/usr/bin/env bash
# Many idle clients plus active ones: pgfresh in transaction mode (20 server connections per
# node) holds IDLE idle clients while ACTIVE pgbench clients run a read/write mix.
#
#   bench/idle-active.sh [options]
#     -i N           idle clients (default 2000)
#     -a N           active pgbench clients (default 200)
#     -T SECONDS     duration of the active run (default 60)
#     -s SCALE       pgbench scale factor (default 10)
#     -d DIR         use a running cluster made by bench/cluster.sh (default: make one, remove it after)
#     -o DIR         where results and logs go (default: a new temp dir)
#     -B             skip `cargo build --release -p pgfresh`
#
# The mix: pgbench's built-in select-only (weight 9) and simple-update (weight 1) scripts,
# `-M extended`, two pgbench threads. Recorded: login rate of the idle clients, the proxy's
# resident memory before and after they log in (memory per idle client) and at the end of the
# run, transactions and failed transactions, p50 and p99 latency from pgbench's
# per-transaction log, proxy CPU per transaction, and whether every idle client still gets
# an answer after the run. pgbench, the idle-client holder, the proxy and three servers share
# the machine.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
IDLE=2000 ACTIVE=200 SECS=60 SCALE=10 CLUSTER_DIR="" OUTDIR="" BUILD=1
while getopts "i:a:T:s:d:o:B" opt; do
    case $opt in
        i) IDLE=$OPTARG ;;
        a) ACTIVE=$OPTARG ;;
        T) SECS=$OPTARG ;;
        s) SCALE=$OPTARG ;;
        d) CLUSTER_DIR=$OPTARG ;;
        o) OUTDIR=$OPTARG ;;
        B) BUILD=0 ;;
        *) sed -n 2,20p "$0"; exit 2 ;;
    esac
done

ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# shellcheck source=bench/lib.sh
source "$HERE/lib.sh"
bench_start idle-active
bench_cluster
bench_pgbench_init

rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }

port=$(free_port); admin=$(free_port)
# Room for the idle clients, the active ones and the script's own checks.
PGFRESH_MAX_CLIENTS=$((IDLE + ACTIVE + 100)) PGFRESH_POOL_SIZE=20 PGFRESH_POOL_EXTRA='pool_mode = "transaction"' \
    write_pgfresh_conf "$OUTDIR/pgfresh.toml" "$port" "$admin" true
start_pgfresh "$OUTDIR/pgfresh.toml" "$OUTDIR/pgfresh.server.log"
PROXY_PID=$PGFRESH_PID
wait_accepting "$port"
wait_replica_reads "$port"

rss_start=$(rss_kib "$PROXY_PID")
echo "== $IDLE idle clients log in"
coproc IDLERS { python3 "$HERE/idle-clients.py" 127.0.0.1 "$port" app app "$IDLE"; }
read -r _ held rate <&"${IDLERS[0]}"
rss_idle=$(rss_kib "$PROXY_PID")
echo "   $held held, $rate logins/s; proxy RSS ${rss_start} KiB -> ${rss_idle} KiB"

echo "== $ACTIVE active clients, $SECS s: select-only@9 + simple-update@1"
txlog="$OUTDIR/txlog"
before=$(cpu_ticks "$PROXY_PID")
rc=0
timeout $((SECS + 300)) "$PG_BINDIR/pgbench" -n -c "$ACTIVE" -j 2 -T "$SECS" -M extended \
    -b select-only@9 -b simple-update@1 -l --log-prefix="$txlog" \
    -h 127.0.0.1 -p "$port" -U app app >"$OUTDIR/pgbench.log" 2>&1 || rc=$?
after=$(cpu_ticks "$PROXY_PID")
rss_end=$(rss_kib "$PROXY_PID")
[ $rc -eq 0 ] || { echo "pgbench exited with $rc:"; tail -5 "$OUTDIR/pgbench.log"; }

echo >&"${IDLERS[1]}"
read -r _ alive dead <&"${IDLERS[0]}"
wait "$IDLERS_PID" 2>/dev/null || true

tx=$(awk -F': ' '/number of transactions actually processed/ { split($2, a, "/"); print a[1]; exit }' "$OUTDIR/pgbench.log")
failed=$(awk -F': ' '/number of failed transactions/ { split($2, a, " "); print a[1]; exit }' "$OUTDIR/pgbench.log")
tps=$(awk '/^tps = / { print $3; exit }' "$OUTDIR/pgbench.log")
# Column 3 of pgbench's transaction log is the latency in microseconds.
read -r p50 p99 < <(cat "$txlog".* | awk '{ print $3 }' | sort -n |
    awk '{ v[NR] = $1 } END { printf "%.2f %.2f\n", v[int(NR * 0.5)] / 1000, v[int(NR * 0.99)] / 1000 }')
rm -f "$txlog".*
cpu=$(awk -v d=$((after - before)) -v hz="$CLK_TCK" -v n="${tx:-0}" 'BEGIN { if (n > 0) printf "%.1f", d / hz / n * 1e6; else print "n/a" }')
per_idle=$(awk -v a="$rss_start" -v b="$rss_idle" -v n="$held" 'BEGIN { printf "%.1f", (b - a) / n }')

RESULTS="$OUTDIR/results.txt"
{
    echo "idle clients held:                 $held (logins: $rate/s)"
    echo "proxy RSS before / idle / end:     $rss_start / $rss_idle / $rss_end KiB ($per_idle KiB per idle client)"
    echo "active clients:                    $ACTIVE for $SECS s"
    echo "transactions / failed / tps:       ${tx:-0} / ${failed:-?} / ${tps:-?}"
    echo "latency p50 / p99:                 $p50 / $p99 ms"
    echo "proxy CPU per transaction:         $cpu us"
    echo "idle clients answering after:      $alive (failed: $dead)"
    echo "load average (1 min) at the end:   $(cut -d' ' -f1 /proc/loadavg)"
} | tee "$RESULTS"
