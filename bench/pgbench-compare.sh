#!/usr/bin/env bash
# pgbench side by side in one run, on one cluster (a primary and two streaming standbys):
# the proxy CPU per statement, throughput and p99 latency of pgfresh (session and transaction
# mode), PgBouncer (session and transaction mode) and pgpool-II, with pgbench straight to the
# primary for reference.
#
#   bench/pgbench-compare.sh [options]
#     -T SECONDS     duration of each pgbench run (default 20)
#     -c CLIENTS     pgbench clients (default 8)
#     -j THREADS     pgbench threads (default 2)
#     -s SCALE       pgbench scale factor (default 10)
#     -R ROUNDS      run every target and workload this many times, round after round
#                    (default 1); the tables then give medians over the rounds, and each
#                    pgfresh / PgBouncer ratio is the median of the ratios within a round
#     -d DIR         use a running cluster made by bench/cluster.sh (default: make one, remove it after)
#     -o DIR         where results and logs go (default: a new temp dir)
#     -B             skip `cargo build --release -p pgfresh`
#
# Workloads, each `pgbench -n -c CLIENTS -j THREADS -T SECONDS` against every target:
#   select-simple     -S -M simple      1 statement a transaction
#   select-extended   -S -M extended    1 statement a transaction
#   mix               -M extended -f OUTDIR/mix.sql (written by this script): 9 point reads of
#                     pgbench_accounts, each with a fresh random aid, then one autocommit
#                     UPDATE of pgbench_accounts: 10 statements a transaction
# Targets, in this order:
#   direct             pgbench to the primary (no proxy)
#   pgfresh-session    pgfresh with write_pgfresh_conf's defaults (lib.sh): parser and routing
#                      on, so reads go to the standbys; pool_size 20
#   pgfresh-tx         the same with pool_mode = "transaction", 20 server connections per node
#   pgfresh-ring-session, pgfresh-ring-tx
#                      the same two with io_engine = "io_uring": the sessions on pgfresh-ring,
#                      one thread whose loop waits in io_uring_enter
#   pgfresh-bolt-session, pgfresh-bolt-tx
#                      the same two with the build bench/bolt.sh lays out (target/release/
#                      pgfresh.bolt, or $PGFRESH_BOLT_BIN); left out when there is none
#   pgfresh-pgo-session, pgfresh-pgo-tx
#                      the same two with the profile-guided build of bench/pgo.sh (target/
#                      release/pgfresh.pgo, or $PGFRESH_PGO_BIN); left out when there is none
#   pgbouncer-session  PgBouncer, pool_mode = session, default_pool_size = 20, primary only
#   pgbouncer-tx       PgBouncer, pool_mode = transaction, default_pool_size = 20, primary only
#   relay              the floor of a tokio proxy: the example bare_relay of pgfresh-proxy (a
#                      byte relay, one server connection per client, no parsing, on the
#                      current_thread runtime pgfresh uses), in front of the primary; built
#                      with the release binary unless -B (then skipped if not built)
#   uring-relay        the same byte relay on one io_uring instead of epoll and a runtime (the
#                      example uring_relay: one io_uring_enter a turn submits every receive and
#                      send and waits): what the proxy's system calls cost; built like relay
#   tokio-ring-relay   the same byte relay on tokio again, its socket I/O through one io_uring
#                      (the example tokio_ring_relay: entries submitted when the runtime parks,
#                      completions waking it through an eventfd in tokio's epoll): whether the
#                      ring's saving survives a tokio runtime; built like relay
#   ring-exec-relay    the same byte relay on pgfresh-ring, the io_uring executor: one task a
#                      client that waits for either side and then reads and writes, as the
#                      session loop does (the example ring_relay of pgfresh-ring): what the
#                      executor adds to the hand-written uring-relay; built like relay
#   pgpool             pgpool-II (Debian package pgpool2), streaming-replication mode,
#                      load_balance_mode = on, weight 1 on each of the three nodes (start_pgpool
#                      in lib.sh); run as the postgres user
# WORKLOADS="..." runs only the workloads named (default: all three).
# SKIP="..." leaves targets out: a target name, or pgfresh / pgbouncer for both of its modes.
# PGFRESH_BIN picks the pgfresh binary (default: see lib.sh). PGPOOL=0 leaves pgpool-II out;
# without it installed (apt-get install -y pgpool2) it is skipped with a message, and
# PgBouncer likewise (apt-get install -y pgbouncer).
#
# Recorded per run, in OUTDIR/results.tsv (with its round): tps, average latency, p99 latency (from pgbench's
# per-transaction log, -l), failed transactions, the proxy's CPU time (utime + stime from
# /proc of the proxy and its child processes, exited ones included, before and after the run)
# per statement in µs, the 1-minute load average at the end; for pgfresh the reads routed to
# the standbys over all reads during the run and the statements routed to the primary by
# reason (pgfresh_routed_total from /metrics before and after; the per-series deltas are in
# OUTDIR/TARGET_WORKLOAD.routed.txt), for pgpool-II the SELECTs sent to the standbys over all
# SELECTs (select_cnt of SHOW pool_nodes before and after).
# At the end OUTDIR/table.md (also printed): CPU per statement per workload and target with
# the ratios pgfresh / PgBouncer per mode, tps and p99 per target, and pgfresh's replica share.
# Each run starts after a CHECKPOINT with both standbys caught up; a pgfresh target starts
# once a standby serves its reads. Run as root, the servers, PgBouncer and pgpool-II run as
# the postgres user. The servers, the proxy and pgbench share the machine: read CPU figures
# as relative within one run.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
SECS=20 CLIENTS=8 THREADS=2 SCALE=10 ROUNDS=1 CLUSTER_DIR="" OUTDIR="" BUILD=1
while getopts "T:c:j:s:R:d:o:B" opt; do
    case $opt in
        T) SECS=$OPTARG ;;
        c) CLIENTS=$OPTARG ;;
        j) THREADS=$OPTARG ;;
        s) SCALE=$OPTARG ;;
        R) ROUNDS=$OPTARG ;;
        d) CLUSTER_DIR=$OPTARG ;;
        o) OUTDIR=$OPTARG ;;
        B) BUILD=0 ;;
        *) sed -n 2,50p "$0"; exit 2 ;;
    esac
done

ulimit -n 65536 2>/dev/null || true

# shellcheck source=bench/lib.sh
source "$HERE/lib.sh"

skipped() {
    local t=$1
    case " ${SKIP:-} " in *" $t "* | *" ${t%%-*} "*) return 0 ;; esac
    return 1
}
# One of the byte relays (examples of pgfresh-proxy) as target NAME, in front of the
# primary: run_relay NAME BINARY EXAMPLE
run_relay() {
    local name=$1 bin=$2 example=$3
    if skipped "$name"; then echo "== $name: skipped (SKIP)"; return; fi
    if [ ! -x "$bin" ]; then
        echo "== $name: no $bin (the example $example, built unless -B): skipped"
        return
    fi
    port=$(free_port); ADMIN="" KIND=other
    "$bin" "127.0.0.1:$port" "127.0.0.1:$PRIMARY_PORT" >"$OUTDIR/$name$ROUND_TAG.server.log" 2>&1 &
    PROXY_PID=$!
    wait_accepting "$port"
    run_suite "$name" "$port"
    stop_pid "$PROXY_PID"; PROXY_PID=""
}
PGBOUNCER_OK=0 PGPOOL_OK=0
if command -v pgbouncer >/dev/null; then PGBOUNCER_OK=1; fi
if [ "${PGPOOL:-1}" != 0 ] && command -v pgpool >/dev/null; then PGPOOL_OK=1; fi

bench_start pgbench
RELAY_BIN="$(dirname "$PGFRESH_BIN")/examples/bare_relay"
URING_RELAY_BIN="$(dirname "$PGFRESH_BIN")/examples/uring_relay"
TOKIO_RING_RELAY_BIN="$(dirname "$PGFRESH_BIN")/examples/tokio_ring_relay"
RING_EXEC_RELAY_BIN="$(dirname "$PGFRESH_BIN")/examples/ring_relay"
PGFRESH_BOLT_BIN="${PGFRESH_BOLT_BIN:-$(dirname "$PGFRESH_BIN")/pgfresh.bolt}"
PGFRESH_PGO_BIN="${PGFRESH_PGO_BIN:-$(dirname "$PGFRESH_BIN")/pgfresh.pgo}"
if [ "$BUILD" = 1 ] && ! skipped relay; then
    cargo build --release -p pgfresh-proxy --example bare_relay
fi
if [ "$BUILD" = 1 ] && ! skipped uring-relay; then
    cargo build --release -p pgfresh-proxy --example uring_relay
fi
if [ "$BUILD" = 1 ] && ! skipped ring-exec-relay; then
    cargo build --release -p pgfresh-ring --example ring_relay
fi
if [ "$BUILD" = 1 ] && ! skipped tokio-ring-relay; then
    cargo build --release -p pgfresh-proxy --example tokio_ring_relay
fi
if { ! skipped pgfresh-session || ! skipped pgfresh-tx; } && [ ! -x "$PGFRESH_BIN" ]; then
    echo "no pgfresh binary at $PGFRESH_BIN: build it (cargo build --release -p pgfresh), or set PGFRESH_BIN" >&2
    exit 1
fi
bench_cluster
bench_pgbench_init

MIX="$OUTDIR/mix.sql"
write_mix "$MIX"

WORKLOADS="${WORKLOADS:-select-simple select-extended mix}"

RESULTS="$OUTDIR/results.tsv"
printf "round\ttarget\tworkload\tclients\tthreads\tseconds\ttransactions\tstmts_per_tx\tfailed\ttps\tlatency_ms\tp99_ms\tproxy_cpu_s\tproxy_cpu_us_per_stmt\treplica_reads\treads\treplica_share\tprimary_by_reason\tloadavg_1m\tproxy_user_us_per_stmt\n" >"$RESULTS"

# SELECTs pgpool-II on PORT has sent to standbys and to all nodes (select_cnt of SHOW
# pool_nodes): prints "STANDBY TOTAL".
pgpool_select_counts() {
    "$PG_BINDIR/psql" -XAq -F '|' -h 127.0.0.1 -p "$1" -U app -d app -c "SHOW pool_nodes" 2>/dev/null | awk -F'|' '
        NR == 1 { for (i = 1; i <= NF; i++) { if ($i == "role") r = i; if ($i == "select_cnt") s = i }; next }
        r && s && $s ~ /^[0-9]+$/ { total += $s; if ($r == "standby") standby += $s }
        END { printf "%d %d\n", standby, total }'
}

# run_pgbench TARGET PORT WORKLOAD; PROXY_PID (empty for direct), ADMIN (pgfresh's admin
# port, or empty) and KIND (pgfresh, pgpool or other) describe the target.
run_pgbench() {
    local target=$1 port=$2 workload=$3
    local tag="${target}_${workload}${ROUND_TAG}" rc=0 before=0 after=0
    local log="$OUTDIR/$tag.log" txlog="$OUTDIR/txlog_$tag"
    local stmts=1 args
    case $workload in
        select-simple) args=(-S -M simple) ;;
        select-extended) args=(-S -M extended) ;;
        # pgbench sets :scale from -s for a custom script (1 without it).
        mix) args=(-M extended -s "$SCALE" -f "$MIX"); stmts=10 ;;
    esac
    echo "== $target: $workload ($SECS s)${ROUND_TAG:+, round $ROUND}"
    psql_node "$PRIMARY_PORT" "CHECKPOINT" >/dev/null
    wait_standbys_caught_up
    local sel_before="0 0" sel_after="0 0"
    if [ "$KIND" = pgfresh ]; then metrics_snapshot "$ADMIN" "$OUTDIR/$tag.metrics.before" || true; fi
    if [ "$KIND" = pgpool ]; then sel_before=$(pgpool_select_counts "$port"); fi
    local ubefore=0 uafter=0
    if [ -n "$PROXY_PID" ]; then before=$(cpu_ticks_tree_reaped "$PROXY_PID"); ubefore=$(cpu_user_ticks_tree_reaped "$PROXY_PID"); fi
    timeout $((SECS + 120)) "$PG_BINDIR/pgbench" -n -c "$CLIENTS" -j "$THREADS" -T "$SECS" \
        -l --log-prefix="$txlog" -h 127.0.0.1 -p "$port" -U app "${args[@]}" app >"$log" 2>&1 || rc=$?
    if [ -n "$PROXY_PID" ]; then after=$(cpu_ticks_tree_reaped "$PROXY_PID"); uafter=$(cpu_user_ticks_tree_reaped "$PROXY_PID"); fi
    if [ "$KIND" = pgfresh ]; then metrics_snapshot "$ADMIN" "$OUTDIR/$tag.metrics.after" || true; fi
    if [ "$KIND" = pgpool ]; then sel_after=$(pgpool_select_counts "$port"); fi
    local load; load=$(cut -d' ' -f1 /proc/loadavg)
    if [ $rc -ne 0 ]; then
        echo "   pgbench exited with $rc (log: $log):"; tail -5 "$log" | sed 's/^/   | /'
    fi
    local tx failed tps lat p99 cpu_s="-" per="-" user_per="-" rep="-" reads="-" share="-"
    tx=$(awk -F': ' '/number of transactions actually processed/ { split($2, a, "/"); print a[1] }' "$log")
    failed=$(awk -F': ' '/number of failed transactions/ { split($2, a, " "); print a[1] }' "$log")
    tps=$(awk '/^tps = / { print $3 }' "$log")
    lat=$(awk '/^latency average = / { print $4 }' "$log")
    # Column 3 of pgbench's transaction log is the latency in microseconds (not a number for
    # a failed transaction).
    p99=$(cat "$txlog".* 2>/dev/null | awk '$3 ~ /^[0-9]+$/ { print $3 }' | sort -n |
        awk '{ v[NR] = $1 } END { if (NR) printf "%.2f", v[int((NR - 1) * 0.99) + 1] / 1000; else print "n/a" }')
    rm -f "$txlog".*
    tx=${tx:-0}; failed=${failed:-0}; tps=${tps:-0}; lat=${lat:-nan}
    if [ -n "$PROXY_PID" ]; then
        cpu_s=$(awk -v d=$((after - before)) -v hz="$CLK_TCK" 'BEGIN { printf "%.2f", d / hz }')
        per=$(awk -v d=$((after - before)) -v hz="$CLK_TCK" -v n="$tx" -v k="$stmts" \
            'BEGIN { if (n > 0) printf "%.1f", d / hz / (n * k) * 1e6; else print "n/a" }')
        user_per=$(awk -v d=$((uafter - ubefore)) -v hz="$CLK_TCK" -v n="$tx" -v k="$stmts" \
            'BEGIN { if (n > 0) printf "%.1f", d / hz / (n * k) * 1e6; else print "n/a" }')
    fi
    local primary="-"
    if [ "$KIND" = pgfresh ] && [ -s "$OUTDIR/$tag.metrics.before" ] && [ -s "$OUTDIR/$tag.metrics.after" ]; then
        metrics_delta "$OUTDIR/$tag.metrics.before" "$OUTDIR/$tag.metrics.after" pgfresh_routed_total >"$OUTDIR/$tag.routed.txt"
        read -r rep reads < <(routed_read_counts <"$OUTDIR/$tag.routed.txt")
        # Statements routed to the primary during the run, by reason: "write=10,hot_relation=2".
        primary=$(grep 'target="primary"' "$OUTDIR/$tag.routed.txt" |
            sed -n 's/.*reason="\([^"]*\)".* \([0-9-]*\)$/\1=\2/p' | paste -sd, -)
        primary=${primary:--}
    elif [ "$KIND" = pgpool ]; then
        local sb0 st0 sb1 st1
        read -r sb0 st0 <<<"$sel_before"; read -r sb1 st1 <<<"$sel_after"
        rep=$((sb1 - sb0)); reads=$((st1 - st0))
    fi
    if [ "$reads" != "-" ]; then
        share=$(awk -v r="$rep" -v n="$reads" 'BEGIN { if (n > 0) printf "%.3f", r / n; else print "n/a" }')
    fi
    printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n" "$ROUND" "$target" "$workload" "$CLIENTS" \
        "$THREADS" "$SECS" "$tx" "$stmts" "$failed" "$tps" "$lat" "$p99" "$cpu_s" "$per" "$rep" "$reads" "$share" "$primary" "$load" "$user_per" >>"$RESULTS"
    local line="   tps=$tps latency=${lat}ms p99=${p99}ms failed=$failed load=$load"
    if [ -n "$PROXY_PID" ]; then line="$line proxy_cpu=${cpu_s}s (${per} us/stmt, ${user_per} in user space)"; fi
    if [ "$reads" != "-" ]; then line="$line replica_share=$share ($rep of $reads reads)"; fi
    if [ "$primary" != "-" ]; then line="$line to the primary: $primary"; fi
    echo "$line"
}

run_suite() {
    local target=$1 port=$2 w
    for w in $WORKLOADS; do run_pgbench "$target" "$port" "$w"; done
}

for ROUND in $(seq 1 "$ROUNDS"); do
    ROUND_TAG=""
    if [ "$ROUNDS" -gt 1 ]; then ROUND_TAG="_r$ROUND"; echo "== round $ROUND of $ROUNDS"; fi

    # 1. Direct to the primary.
    if ! skipped direct; then
        PROXY_PID="" ADMIN="" KIND=other
        run_suite direct "$PRIMARY_PORT"
    else
        echo "== direct: skipped (SKIP)"
    fi

    # 2. pgfresh, session and transaction mode, 20 server connections per node; the same
    #    with the BOLT and the profile-guided builds when there are.
    for target in pgfresh-session pgfresh-tx pgfresh-ring-session pgfresh-ring-tx pgfresh-bolt-session pgfresh-bolt-tx pgfresh-pgo-session pgfresh-pgo-tx; do
        if skipped "$target"; then echo "== $target: skipped (SKIP)"; continue; fi
        bin=$PGFRESH_BIN
        engine=epoll
        case $target in pgfresh-ring-*) engine=io_uring ;; esac
        case $target in
            pgfresh-bolt-*)
                bin=$PGFRESH_BOLT_BIN
                if [ ! -x "$bin" ]; then echo "== $target: no $bin (bench/bolt.sh makes it): skipped"; continue; fi
                ;;
            pgfresh-pgo-*)
                bin=$PGFRESH_PGO_BIN
                if [ ! -x "$bin" ]; then echo "== $target: no $bin (bench/pgo.sh makes it): skipped"; continue; fi
                ;;
        esac
        port=$(free_port); ADMIN=$(free_port); KIND=pgfresh
        if [ "${target%-tx}" != "$target" ]; then
            PGFRESH_IO_ENGINE=$engine PGFRESH_POOL_SIZE=20 PGFRESH_POOL_EXTRA='pool_mode = "transaction"' \
                write_pgfresh_conf "$OUTDIR/$target$ROUND_TAG.toml" "$port" "$ADMIN" true
        else
            PGFRESH_IO_ENGINE=$engine write_pgfresh_conf "$OUTDIR/$target$ROUND_TAG.toml" "$port" "$ADMIN" true
        fi
        PGFRESH_BIN=$bin start_pgfresh "$OUTDIR/$target$ROUND_TAG.toml" "$OUTDIR/$target$ROUND_TAG.server.log"
        PROXY_PID=$PGFRESH_PID
        wait_accepting "$port"
        wait_replica_reads "$port"
        run_suite "$target" "$port"
        metrics_snapshot "$ADMIN" "$OUTDIR/$target$ROUND_TAG.metrics.txt" || true
        stop_pid "$PROXY_PID"; PROXY_PID=""
    done

    # 3. PgBouncer, session and transaction mode, in front of the primary (as postgres when root).
    for target in pgbouncer-session pgbouncer-tx; do
        if skipped "$target"; then echo "== $target: skipped (SKIP)"; continue; fi
        if [ $PGBOUNCER_OK = 0 ]; then echo "== $target: PgBouncer is not installed (apt-get install -y pgbouncer): skipped"; continue; fi
        port=$(free_port); ADMIN="" KIND=other
        bdir="$CLUSTER_DIR/$target"
        start_pgbouncer "$bdir" "$port" "$([ "$target" = pgbouncer-tx ] && echo transaction || echo session)"
        run_suite "$target" "$port"
        stop_pid "$PROXY_PID"; PROXY_PID=""
        mv "$OUTDIR/pgbouncer.server.log" "$OUTDIR/$target$ROUND_TAG.server.log" 2>/dev/null || true
        cp "$bdir/pgbouncer.log" "$OUTDIR/$target$ROUND_TAG.log" 2>/dev/null || true
    done

    # 4. The byte relays in front of the primary: tokio, io_uring, then tokio on io_uring.
    run_relay relay "$RELAY_BIN" bare_relay
    run_relay uring-relay "$URING_RELAY_BIN" uring_relay
    run_relay tokio-ring-relay "$TOKIO_RING_RELAY_BIN" tokio_ring_relay
    run_relay ring-exec-relay "$RING_EXEC_RELAY_BIN" ring_relay

    # 5. pgpool-II, streaming-replication mode, load balancing over the three nodes.
    if skipped pgpool || [ "${PGPOOL:-1}" = 0 ]; then
        echo "== pgpool: skipped (SKIP or PGPOOL=0)"
    elif [ $PGPOOL_OK = 0 ]; then
        echo "== pgpool: pgpool-II is not installed (Debian: apt-get install -y pgpool2; PGPOOL=0 silences this): skipped"
    else
        port=$(free_port); ADMIN="" KIND=pgpool
        # Enough child processes for every client (pgpool-II serves one client per child).
        children=$((CLIENTS + 8 > 32 ? CLIENTS + 8 : 32))
        if start_pgpool "$CLUSTER_DIR/pgpool" "$port" on "num_init_children = $children"; then
            run_suite pgpool "$port"
        else
            echo "== pgpool: did not start; its log ($OUTDIR/pgpool.server.log):"; tail -20 "$OUTDIR/pgpool.server.log" | sed 's/^/   | /'
        fi
        stop_pid "$PROXY_PID"; PROXY_PID=""
    fi
done

# 6. The tables.
COMMIT=$(git -C "$BENCH_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git -C "$BENCH_ROOT" status --porcelain --untracked-files=no 2>/dev/null)" ]; then COMMIT="$COMMIT+changes"; fi
python3 - "$RESULTS" "$OUTDIR/table.md" "$COMMIT" "$CLIENTS" "$THREADS" "$SECS" "$SCALE" "$ROUNDS" <<'PY'
import csv, sys, datetime, statistics
results, out, commit, clients, threads, secs, scale, rounds = sys.argv[1:9]
rounds = int(rounds)
rows = list(csv.DictReader(open(results), delimiter="\t"))
order = ["direct", "pgfresh-session", "pgfresh-tx", "pgfresh-ring-session", "pgfresh-ring-tx", "pgfresh-bolt-session", "pgfresh-bolt-tx", "pgfresh-pgo-session", "pgfresh-pgo-tx", "pgbouncer-session", "pgbouncer-tx", "relay", "uring-relay", "tokio-ring-relay", "ring-exec-relay", "pgpool"]
targets = [t for t in order if any(r["target"] == t for r in rows)]
proxies = [t for t in targets if t != "direct"]
workloads = [("select-simple", "select-only, `-S -M simple` (1 stmt/tx)"),
             ("select-extended", "select-only, `-S -M extended` (1 stmt/tx)"),
             ("mix", "read-mostly mix, `-M extended` (9 reads + 1 UPDATE: 10 stmts/tx)")]
# (target, workload) -> {round: row}
runs = {}
for r in rows:
    runs.setdefault((r["target"], r["workload"]), {})[r["round"]] = r

def num(s):
    try:
        return float(s)
    except (TypeError, ValueError):
        return None

def values(t, w, key):
    return [v for v in (num(r.get(key)) for r in runs.get((t, w), {}).values()) if v is not None]

def median(t, w, key):
    v = values(t, w, key)
    return statistics.median(v) if v else None

def cell(t, w, key, fmt):
    v = median(t, w, key)
    return fmt(v) if v is not None else "–"

def ratio(a, b, w, key="proxy_cpu_us_per_stmt"):
    # Within each round, then the median: both ran minutes apart, not a whole run apart.
    ra, rb = runs.get((a, w), {}), runs.get((b, w), {})
    rs = []
    for k in ra:
        x = num(ra[k].get(key))
        y = num(rb.get(k, {}).get(key))
        if x is not None and y:
            rs.append(x / y)
    if not rs:
        return "–"
    text = f"{statistics.median(rs):.2f}×"
    if len(rs) > 1:
        text += f" ({min(rs):.2f}–{max(rs):.2f})"
    return text

L = []
L.append(f"pgbench `-c {clients} -j {threads} -T {secs}`, scale {scale}"
         + (f", {rounds} rounds" if rounds > 1 else "")
         + f"; commit {commit}; "
         f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')} (`bench/pgbench-compare.sh`)")
L.append("")
if rounds > 1:
    L.append(f"Each figure is the median of the {rounds} rounds; each ratio is the median of the "
             "ratios within a round, with their range.")
    L.append("")
L.append("### Proxy CPU per statement (µs)")
L.append("")
pairs = [(a, b) for a, b in (("pgfresh-session", "pgbouncer-session"), ("pgfresh-tx", "pgbouncer-tx"),
                             ("pgfresh-ring-session", "pgbouncer-session"), ("pgfresh-ring-tx", "pgbouncer-tx"),
                             ("pgfresh-bolt-session", "pgbouncer-session"), ("pgfresh-bolt-tx", "pgbouncer-tx"),
                             ("pgfresh-pgo-session", "pgbouncer-session"), ("pgfresh-pgo-tx", "pgbouncer-tx"))
         if a in targets and b in targets]
head = ["workload"] + proxies + [f"{a} / {b}" for a, b in pairs]
L.append("| " + " | ".join(head) + " |")
L.append("|---|" + "---:|" * (len(head) - 1))
for w, label in workloads:
    cells = [cell(t, w, "proxy_cpu_us_per_stmt", lambda v: f"{v:.1f}") for t in proxies]
    cells += [ratio(a, b, w) for a, b in pairs]
    L.append(f"| {label} | " + " | ".join(cells) + " |")
L.append("")
L.append("### Of which user space (µs per statement)")
L.append("")
L.append("The rest is the kernel's work for the proxy's system calls, the same calls for every "
         "proxy (2 `recvfrom`, 2 `sendto` and about half an `epoll_wait` a statement).")
L.append("")
L.append("| " + " | ".join(head) + " |")
L.append("|---|" + "---:|" * (len(head) - 1))
for w, label in workloads:
    cells = [cell(t, w, "proxy_user_us_per_stmt", lambda v: f"{v:.1f}") for t in proxies]
    cells += [ratio(a, b, w, "proxy_user_us_per_stmt") for a, b in pairs]
    L.append(f"| {label} | " + " | ".join(cells) + " |")
L.append("")
L.append("### Throughput and latency: tps / p99 (ms)")
L.append("")
L.append("| workload | " + " | ".join(targets) + " |")
L.append("|---|" + "---:|" * len(targets))
for w, label in workloads:
    cells = []
    for t in targets:
        tps, p99 = median(t, w, "tps"), median(t, w, "p99_ms")
        if tps is None:
            cells.append("–")
            continue
        cells.append(f"{tps:.0f} / " + (f"{p99:.2f}" if p99 is not None else "n/a"))
    L.append(f"| {label} | " + " | ".join(cells) + " |")
L.append("")
share_targets = [t for t in ("pgfresh-session", "pgfresh-tx", "pgfresh-ring-session", "pgfresh-ring-tx", "pgfresh-bolt-session", "pgfresh-bolt-tx",
                            "pgfresh-pgo-session", "pgfresh-pgo-tx", "pgpool")
                 if t in targets]
if share_targets:
    L.append("### Reads sent to the standbys during the run")
    L.append("")
    L.append("pgfresh: replica-routed reads over all reads (`pgfresh_routed_total`); "
             "pgpool-II: SELECTs on the standbys over all SELECTs (`SHOW pool_nodes` select_cnt)"
             + ("; summed over the rounds." if rounds > 1 else "."))
    L.append("")
    L.append("| workload | " + " | ".join(share_targets) + " |")
    L.append("|---|" + "---:|" * len(share_targets))
    for w, label in workloads:
        cells = []
        for t in share_targets:
            rep, reads = sum(values(t, w, "replica_reads")), sum(values(t, w, "reads"))
            cells.append(f"{100 * rep / reads:.1f} % ({rep:.0f} of {reads:.0f})" if reads else "–")
        L.append(f"| {label} | " + " | ".join(cells) + " |")
    L.append("")
    for t in ("pgfresh-session", "pgfresh-tx", "pgfresh-ring-session", "pgfresh-ring-tx", "pgfresh-bolt-session", "pgfresh-bolt-tx",
              "pgfresh-pgo-session", "pgfresh-pgo-tx"):
        by = {}
        for r in runs.get((t, "mix"), {}).values():
            for part in (r.get("primary_by_reason") or "-").split(","):
                if "=" in part:
                    k, v = part.split("=", 1)
                    by[k] = by.get(k, 0) + (num(v) or 0)
        if by:
            L.append(f"{t}, mix: statements routed to the primary, by reason: "
                     + ", ".join(f"{k} {v:.0f}" for k, v in by.items()) + ".")
    L.append("")
failed = [(r["target"], r["workload"], r["failed"]) for r in rows if r["failed"] not in ("0", "")]
L.append("Failed transactions: " + ("0 in every run." if not failed else
         ", ".join(f"{t} {w}: {f}" for t, w, f in failed) + "."))
loads = [num(r["loadavg_1m"]) for r in rows if num(r["loadavg_1m"]) is not None]
if loads:
    L.append(f"Load average (1 min, at the end of each run): {min(loads):.2f}–{max(loads):.2f}.")
missing = [t for t in order if t not in targets]
if missing:
    L.append("Not run: " + ", ".join(missing) + ".")
open(out, "w").write("\n".join(L) + "\n")
PY

echo
echo "results: $RESULTS"
column -t -s $'\t' "$RESULTS"
echo
echo "table: $OUTDIR/table.md"
echo
cat "$OUTDIR/table.md"
