#!/usr/bin/env bash
# Replay-position freshness and read offload under constant writes: pgbench runs the
# read-mostly mix (9 point reads + 1 autocommit UPDATE of pgbench_accounts, -M extended)
# through pgfresh (session mode, defaults) once per value of [monitor] replay_check_period_ms,
# while bench/replay-freshness.py samples the standbys' own replay positions and pgfresh's
# known ones, and reads the primary's commits from its WAL afterwards.
#
#   bench/replay-freshness.sh [options]
#     -T SECONDS     duration of each run (default 20)
#     -c CLIENTS     pgbench clients (default 8)
#     -p "MS MS"     replay_check_period_ms values (default "0 5 2"; 0: full polls only)
#     -s SCALE       pgbench scale factor (default 10)
#     -d DIR         use a running cluster made by bench/cluster.sh (default: make one, remove it after)
#     -o DIR         where results and logs go (default: a new temp dir)
#     -B             skip `cargo build --release -p pgfresh`
#
# Per run it prints (and writes to OUTDIR/PERIOD.json): the staleness of pgfresh's known
# replay positions (percentiles of an upper bound, and the share within 10 ms), the ideal
# offload (the share of the time some standby had replayed every commit made before), the
# offload pgfresh achieved (its own routing counters), the fast replay polls made a second
# (pgfresh_replay_polls_total) and the proxy's CPU time. The samplers add
# load of their own (two direct queries a millisecond, /v1/status every 2 ms): read the CPU
# figures of bench/pgbench-compare.sh, not this run's throughput.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
SECS=20 CLIENTS=8 PERIODS="0 5 2" SCALE=10 CLUSTER_DIR="" OUTDIR="" BUILD=1
while getopts "T:c:p:s:d:o:B" opt; do
    case $opt in
        T) SECS=$OPTARG ;;
        c) CLIENTS=$OPTARG ;;
        p) PERIODS=$OPTARG ;;
        s) SCALE=$OPTARG ;;
        d) CLUSTER_DIR=$OPTARG ;;
        o) OUTDIR=$OPTARG ;;
        B) BUILD=0 ;;
        *) sed -n 2,22p "$0"; exit 2 ;;
    esac
done

# shellcheck source=bench/lib.sh
source "$HERE/lib.sh"
bench_start freshness
bench_cluster
bench_pgbench_init
write_mix "$OUTDIR/mix.sql"

fast_polls() {
    curl -fsS "http://127.0.0.1:$1/metrics" | awk '/^pgfresh_replay_polls_total/ { n += $2 } END { print n + 0 }'
}

for period in $PERIODS; do
    port=$(free_port); admin=$(free_port)
    PGFRESH_MONITOR_EXTRA="replay_check_period_ms = $period" \
        write_pgfresh_conf "$OUTDIR/p$period.toml" "$port" "$admin" true
    start_pgfresh "$OUTDIR/p$period.toml" "$OUTDIR/p$period.log"
    PROXY_PID=$PGFRESH_PID
    wait_accepting "$port"
    wait_replica_reads "$port"
    wait_standbys_caught_up
    echo "== replay_check_period_ms = $period: $SECS s, $CLIENTS clients"
    polls=$(fast_polls "$admin"); ticks=$(cpu_ticks "$PROXY_PID")
    python3 "$HERE/replay-freshness.py" -d "$CLUSTER_DIR" --port "$port" --admin "$admin" \
        --mix "$OUTDIR/mix.sql" --seconds "$SECS" --clients "$CLIENTS" \
        --label "replay_check_period_ms=$period" --json "$OUTDIR/p$period.json"
    polls=$(( $(fast_polls "$admin") - polls )); ticks=$(( $(cpu_ticks "$PROXY_PID") - ticks ))
    echo "   fast replay polls a second, both standbys: $(( polls / SECS )); proxy CPU: $(awk -v t="$ticks" -v hz="$CLK_TCK" 'BEGIN { printf "%.2f", t / hz }') s" \
        | tee "$OUTDIR/p$period.polls.txt"
    stop_pid "$PROXY_PID"; PROXY_PID=""
done
echo "results in $OUTDIR"
