#!/usr/bin/env bash
# What the queries pgfresh pipelines around commits cost: pgbench -N (BEGIN, three UPDATEs,
# an INSERT, COMMIT per transaction) through pgfresh in four settings, alternated over
# several rounds so drifting machine load hits them alike:
#
#   no-probe      lsn_routing = false: nothing is sent after a commit
#   lsn-probe     the default: SELECT pg_current_wal_insert_lsn() pipelined after each commit that wrote
#   track         the default, and every session sets pgfresh.track_commit_lsn = on: the
#                 commit's ReadyForQuery waits for the probe's answer and a ParameterStatus
#   xid-probe     the default with resolve_lost_commits = true: SELECT txid_current_if_assigned(), ...
#                 in the same write as each COMMIT
#
#   bench/commit-probes.sh [-T SECONDS] [-r ROUNDS] [-c CLIENTS] [-s SCALE] [-B]
#
# Records tps, average latency and the proxy's CPU per transaction (utime + stime from
# /proc/PID/stat) in results.tsv in a temp dir. -B skips `cargo build --release -p pgfresh`.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
SECS=10 ROUNDS=3 CLIENTS=4 SCALE=10 BUILD=1
while getopts "T:r:c:s:B" opt; do
    case $opt in
        T) SECS=$OPTARG ;;
        r) ROUNDS=$OPTARG ;;
        c) CLIENTS=$OPTARG ;;
        s) SCALE=$OPTARG ;;
        B) BUILD=0 ;;
        *) sed -n 2,19p "$0"; exit 2 ;;
    esac
done

cd "$HERE/.."
if [ $BUILD = 1 ]; then
    cargo build --release -p pgfresh
fi
OUTDIR=$(mktemp -d /tmp/pgfresh-commit-probes.XXXXXX)
CLK_TCK=$(getconf CLK_TCK)
"$HERE/cluster.sh" start | tee "$OUTDIR/cluster.txt"
CLUSTER_DIR=$(awk '/^cluster dir:/ { print $3 }' "$OUTDIR/cluster.txt")
# shellcheck disable=SC1091
source "$CLUSTER_DIR/cluster.env"
# shellcheck source=bench/lib.sh
source "$HERE/lib.sh"

PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do stop_pid "$pid"; done
    "$HERE/cluster.sh" stop "$CLUSTER_DIR" >/dev/null || true
}
trap cleanup EXIT

"$PG_BINDIR/pgbench" -i -q -s "$SCALE" -h 127.0.0.1 -p "$PRIMARY_PORT" -U app app >"$OUTDIR/init.log" 2>&1
wait_standbys_caught_up

declare -A PORT PID
for name in no-probe lsn-probe track xid-probe; do
    case $name in
        no-probe) extra="lsn_routing = false" ;;
        xid-probe) extra="resolve_lost_commits = true" ;;
        *) extra="" ;;
    esac
    PORT[$name]=$(free_port)
    write_pgfresh_conf "$OUTDIR/$name.toml" "${PORT[$name]}" "$(free_port)" true "$extra"
    start_pgfresh "$OUTDIR/$name.toml" "$OUTDIR/$name.log"
    PID[$name]=$PGFRESH_PID
    PIDS+=("$PGFRESH_PID")
    wait_accepting "${PORT[$name]}"
done

RESULTS="$OUTDIR/results.tsv"
printf "setting\tround\ttransactions\ttps\tlatency_ms\tproxy_cpu_us_per_tx\tloadavg_1m\n" >"$RESULTS"
for round in $(seq 1 "$ROUNDS"); do
    for name in no-probe lsn-probe track xid-probe; do
        options=""
        if [ $name = track ]; then options="-c pgfresh.track_commit_lsn=on"; fi
        log="$OUTDIR/$name.$round.pgbench.log"
        before=$(cpu_ticks "${PID[$name]}")
        PGOPTIONS="$options" "$PG_BINDIR/pgbench" -n -N -M simple -c "$CLIENTS" -j 2 -T "$SECS" \
            -h 127.0.0.1 -p "${PORT[$name]}" -U app app >"$log" 2>&1
        after=$(cpu_ticks "${PID[$name]}")
        tx=$(awk -F': ' '/number of transactions actually processed/ { split($2, a, "/"); print a[1] }' "$log")
        tps=$(awk '/^tps = / { print $3 }' "$log")
        lat=$(awk '/^latency average = / { print $4 }' "$log")
        per_tx=$(awk -v d=$((after - before)) -v hz="$CLK_TCK" -v n="$tx" 'BEGIN { printf "%.1f", d / hz / n * 1e6 }')
        load=$(cut -d' ' -f1 /proc/loadavg)
        printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\n" "$name" "$round" "$tx" "$tps" "$lat" "$per_tx" "$load" >>"$RESULTS"
        echo "round $round $name: tps=$tps latency=${lat}ms proxy_cpu=${per_tx}us/tx load=$load"
    done
done
echo "results: $RESULTS"
