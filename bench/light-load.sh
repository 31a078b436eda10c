#!/usr/bin/env bash
# What pgfresh costs when the load is light: one pgbench client runs the read-mostly mix
# (9 point reads + 1 autocommit UPDATE of pgbench_accounts, -M extended) at a fixed rate
# (pgbench -R) through pgfresh in session mode, with the default replay_check_period_ms,
# so the reads keep asking for fresh replay positions. At such rates the proxy is idle
# most of the time and each wake-up is what it pays for; the fast replay polls are most of
# them when they run every period.
#
#   bench/light-load.sh [options]
#     -R "N N"       transaction rates, a second (default "20 100")
#     -b "BIN BIN"   pgfresh binaries to compare, alternated in each round (default: the
#                    release build, $PGFRESH_BIN)
#     -r ROUNDS      rounds (default 2)
#     -T SECONDS     duration of each run (default 10)
#     -s SCALE       pgbench scale factor (default 10)
#     -d DIR         use a running cluster made by bench/cluster.sh (default: make one, remove it after)
#     -o DIR         where results and logs go (default: a new temp dir)
#     -B             skip `cargo build --release -p pgfresh`
#
# Per run, in results.tsv: the proxy's CPU over the run in ms a second (utime + stime from
# /proc/PID/stat, then user and system apart), its context switches a second
# (/proc/PID/status, voluntary and involuntary, every thread), the fast replay polls and
# the replay samples a second (pgfresh_replay_polls_total, pgfresh_replay_samples_total)
# and the share of reads sent to a replica (pgfresh_routed_total).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
RATES="20 100" BINS="" ROUNDS=2 SECS=10 SCALE=10 CLUSTER_DIR="" OUTDIR="" BUILD=1
while getopts "R:b:r:T:s:d:o:B" opt; do
    case $opt in
        R) RATES=$OPTARG ;;
        b) BINS=$OPTARG ;;
        r) ROUNDS=$OPTARG ;;
        T) SECS=$OPTARG ;;
        s) SCALE=$OPTARG ;;
        d) CLUSTER_DIR=$OPTARG ;;
        o) OUTDIR=$OPTARG ;;
        B) BUILD=0 ;;
        *) sed -n 2,24p "$0"; exit 2 ;;
    esac
done

# shellcheck source=bench/lib.sh
source "$HERE/lib.sh"
bench_start light
BINS=${BINS:-$PGFRESH_BIN}
bench_cluster
bench_pgbench_init
write_mix "$OUTDIR/mix.sql"

# Context switches of every thread of PID so far.
ctx_switches() {
    cat /proc/"$1"/task/*/status 2>/dev/null |
        awk '/^(voluntary|nonvoluntary)_ctxt_switches/ { s += $2 } END { print s + 0 }'
}

# "POLLS SAMPLES REPLICA_READS READS" between two metrics snapshots: counts BEFORE AFTER
counts() {
    local polls samples
    polls=$(metrics_delta "$1" "$2" pgfresh_replay_polls_total | awk '{ s += $NF } END { print s + 0 }')
    samples=$(metrics_delta "$1" "$2" pgfresh_replay_samples_total | awk '{ s += $NF } END { print s + 0 }')
    echo "$polls $samples $(metrics_delta "$1" "$2" pgfresh_routed_total | routed_read_counts)"
}

RESULTS="$OUTDIR/results.tsv"
printf "binary\trate\tround\ttps\tcpu_ms_per_s\tuser_ms_per_s\tsys_ms_per_s\tctx_switches_per_s\tpolls_per_s\tsamples_per_s\treplica_read_pct\n" >"$RESULTS"

run_one() {
    local bin=$1 rate=$2 round=$3 port admin pid t0 t1 c0 c1 m tps
    port=$(free_port); admin=$(free_port)
    write_pgfresh_conf "$OUTDIR/pgfresh.toml" "$port" "$admin" true
    PGFRESH_BIN=$bin start_pgfresh "$OUTDIR/pgfresh.toml" "$OUTDIR/pgfresh.log"
    pid=$PGFRESH_PID; PROXY_PID=$pid
    wait_accepting "$port"
    wait_replica_reads "$port"
    "$PG_BINDIR/pgbench" -n -c 1 -j 1 -T 2 -R "$rate" -M extended -f "$OUTDIR/mix.sql" -s "$SCALE" \
        -h 127.0.0.1 -p "$port" -U app app >/dev/null 2>&1
    metrics_snapshot "$admin" "$OUTDIR/metrics.before"; c0=$(ctx_switches "$pid"); t0=$(awk '{ print $14, $15 }' /proc/"$pid"/stat)
    "$PG_BINDIR/pgbench" -n -c 1 -j 1 -T "$SECS" -R "$rate" -M extended -f "$OUTDIR/mix.sql" -s "$SCALE" \
        -h 127.0.0.1 -p "$port" -U app app >"$OUTDIR/pgbench.log" 2>&1
    t1=$(awk '{ print $14, $15 }' /proc/"$pid"/stat); c1=$(ctx_switches "$pid")
    metrics_snapshot "$admin" "$OUTDIR/metrics.after"; m=$(counts "$OUTDIR/metrics.before" "$OUTDIR/metrics.after")
    stop_pid "$pid"; PROXY_PID=""
    tps=$(awk '/^tps = / { printf "%.0f", $3 }' "$OUTDIR/pgbench.log")
    awk -v bin="$bin" -v rate="$rate" -v round="$round" -v tps="$tps" -v t0="$t0" -v t1="$t1" \
        -v c0="$c0" -v c1="$c1" -v m="$m" -v secs="$SECS" -v hz="$CLK_TCK" 'BEGIN {
        split(t0, a, " "); split(t1, b, " "); split(m, q, " ")
        u = (b[1] - a[1]) / hz * 1000 / secs; s = (b[2] - a[2]) / hz * 1000 / secs
        printf "%s\t%s\t%s\t%s\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.1f\n", bin, rate, round, tps, u + s, u, s,
            (c1 - c0) / secs, q[1] / secs, q[2] / secs, (q[4] > 0 ? 100 * q[3] / q[4] : 0) }' |
        tee -a "$RESULTS"
}

for round in $(seq 1 "$ROUNDS"); do
    for rate in $RATES; do
        for bin in $BINS; do
            run_one "$bin" "$rate" "$round"
        done
    done
done
echo
echo "results: $RESULTS"
column -t -s $'\t' "$RESULTS"
