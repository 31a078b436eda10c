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
#     -R RATE        pgbench transactions a second (-R; default: as fast as they go). The
#                    share of the ideal falls as the rate rises: compare builds at one rate
#     -d DIR         use a running cluster made by bench/cluster.sh (default: make one, remove it after)
#     -o DIR         where results and logs go (default: a new temp dir)
#     -B             skip `cargo build --release -p pgfresh`
#
# Per run it prints (and writes to OUTDIR/PERIOD.json): the staleness of pgfresh's known
# replay positions (percentiles of an upper bound, and the share within 10 ms), the ideal
# offload (the share of the time some standby had replayed every commit made before), the
# offload pgfresh achieved (its own routing counters), the fast replay polls made a second
# (pgfresh_replay_polls_total), the replay samples taken after reads a second
# (pgfresh_replay_samples_total), the primary's polls of the standbys' reports a second
# (pgfresh_standby_report_polls_total) and the proxy's CPU time. $PGFRESH_MONITOR_EXTRA
# adds [monitor] lines (`replay_from_primary = false`). Then, still through the same
# pgfresh, a read-your-writes check for half as long: each transaction raises a random
# account's balance (UPDATE … RETURNING), reads it back 0 to 3 ms later (so that a good
# share of these reads find a standby that replayed the write, and the routing decides
# at the edge), and records the read in
# pgfresh_stale_reads on the primary when it saw less; it reports the checks made, the
# stale reads (must be 0) and the share of the checking reads served by a replica. The samplers add
# load of their own (two direct queries a millisecond, /v1/status every 2 ms): read the CPU
# figures of bench/pgbench-compare.sh, not this run's throughput.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
SECS=20 CLIENTS=8 PERIODS="0 5 2" SCALE=10 RATE=0 CLUSTER_DIR="" OUTDIR="" BUILD=1
while getopts "T:c:p:s:R:d:o:B" opt; do
    case $opt in
        T) SECS=$OPTARG ;;
        c) CLIENTS=$OPTARG ;;
        p) PERIODS=$OPTARG ;;
        s) SCALE=$OPTARG ;;
        R) RATE=$OPTARG ;;
        d) CLUSTER_DIR=$OPTARG ;;
        o) OUTDIR=$OPTARG ;;
        B) BUILD=0 ;;
        *) sed -n 2,24p "$0"; exit 2 ;;
    esac
done

# shellcheck source=bench/lib.sh
source "$HERE/lib.sh"
bench_start freshness
bench_cluster
bench_pgbench_init
write_mix "$OUTDIR/mix.sql"
# The read-your-writes check (balances only grow, so a concurrent update by another
# client can only make the read see more).
cat >"$OUTDIR/check.sql" <<'EOT'
\set aid random(1, 100000 * :scale)
\set delta random(1, 5000)
\set pause random(0, 3)
UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid RETURNING abalance AS written \gset
\sleep :pause ms
SELECT abalance AS seen FROM pgbench_accounts WHERE aid = :aid \gset
\if :seen < :written
INSERT INTO pgfresh_stale_reads VALUES (:aid, :written, :seen);
\endif
EOT
psql_node "$PRIMARY_PORT" "DROP TABLE IF EXISTS pgfresh_stale_reads" \
    "CREATE TABLE pgfresh_stale_reads (aid int, written int, seen int)" \
    "GRANT ALL ON pgfresh_stale_reads TO app" >/dev/null

replica_reads() {
    curl -fsS "http://127.0.0.1:$1/metrics" |
        awk -v t="$2" '/^pgfresh_routed_total/ && $0 ~ "target=\"" t "\"" && $0 !~ "reason=\"write\"" { n += $2 } END { print n + 0 }'
}

# The sum of a counter over its labels, from pgfresh's metrics: counter_sum ADMIN_PORT NAME
counter_sum() {
    curl -fsS "http://127.0.0.1:$1/metrics" | awk -v m="$2" '$1 ~ "^" m "[{ ]" || $1 == m { n += $2 } END { print n + 0 }'
}

for period in $PERIODS; do
    port=$(free_port); admin=$(free_port)
    PGFRESH_MONITOR_EXTRA="replay_check_period_ms = $period
${PGFRESH_MONITOR_EXTRA:-}" \
        write_pgfresh_conf "$OUTDIR/p$period.toml" "$port" "$admin" true
    start_pgfresh "$OUTDIR/p$period.toml" "$OUTDIR/p$period.log"
    PROXY_PID=$PGFRESH_PID
    wait_accepting "$port"
    wait_replica_reads "$port"
    wait_standbys_caught_up
    echo "== replay_check_period_ms = $period: $SECS s, $CLIENTS clients"
    polls=$(counter_sum "$admin" pgfresh_replay_polls_total)
    samples=$(counter_sum "$admin" pgfresh_replay_samples_total); ticks=$(cpu_ticks "$PROXY_PID")
    reports=$(counter_sum "$admin" pgfresh_standby_report_polls_total)
    python3 "$HERE/replay-freshness.py" -d "$CLUSTER_DIR" --port "$port" --admin "$admin" \
        --mix "$OUTDIR/mix.sql" --seconds "$SECS" --clients "$CLIENTS" --rate "$RATE" \
        --label "replay_check_period_ms=$period" --json "$OUTDIR/p$period.json"
    polls=$(( $(counter_sum "$admin" pgfresh_replay_polls_total) - polls ))
    samples=$(( $(counter_sum "$admin" pgfresh_replay_samples_total) - samples ))
    reports=$(( $(counter_sum "$admin" pgfresh_standby_report_polls_total) - reports ))
    ticks=$(( $(cpu_ticks "$PROXY_PID") - ticks ))
    echo "   a second, both standbys: $(( polls / SECS )) fast replay polls, $(( samples / SECS )) samples after reads; the primary: $(( reports / SECS )) polls of the standbys' reports; proxy CPU: $(awk -v t="$ticks" -v hz="$CLK_TCK" 'BEGIN { printf "%.2f", t / hz }') s" \
        | tee "$OUTDIR/p$period.polls.txt"
    r0=$(replica_reads "$admin" replica); p0=$(replica_reads "$admin" primary)
    "$PG_BINDIR/pgbench" -n -c "$CLIENTS" -j 2 -T $(( (SECS + 1) / 2 )) -M extended -f "$OUTDIR/check.sql" \
        -h 127.0.0.1 -p "$port" -U app app >"$OUTDIR/p$period.check.log" 2>&1
    r1=$(( $(replica_reads "$admin" replica) - r0 )); p1=$(( $(replica_reads "$admin" primary) - p0 ))
    checks=$(awk '/actually processed/ { print $NF }' "$OUTDIR/p$period.check.log")
    stale=$(psql_node "$PRIMARY_PORT" "SELECT count(*) FROM pgfresh_stale_reads")
    echo "   read-your-writes check: $checks reads of a row just written, $stale stale; reads served by a replica: $r1 of $(( r1 + p1 ))" \
        | tee "$OUTDIR/p$period.check.txt"
    stop_pid "$PROXY_PID"; PROXY_PID=""
done
echo "results in $OUTDIR"
