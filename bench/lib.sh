# Shared helpers for the benchmark scripts (sourced, not run).
# shellcheck shell=bash
# shellcheck disable=SC2034  # PGFRESH_PID, CLK_TCK, ... are set here for the scripts that source this
#
# The node helpers expect cluster.env (from bench/cluster.sh start) to be sourced first;
# bench_cluster does that.

BENCH_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The release binary: $PGFRESH_BIN, else where `cargo build --release` puts it for this
# checkout ($CARGO_TARGET_DIR when that is set, e.g. a git worktree with its own target dir).
if [ -z "${PGFRESH_BIN:-}" ]; then
    case "${CARGO_TARGET_DIR:-}" in
        "") PGFRESH_BIN="$BENCH_ROOT/target/release/pgfresh" ;;
        /*) PGFRESH_BIN="$CARGO_TARGET_DIR/release/pgfresh" ;;
        *) PGFRESH_BIN="$BENCH_ROOT/$CARGO_TARGET_DIR/release/pgfresh" ;;
    esac
fi

as_pg() {
    if [ "$(id -u)" -eq 0 ]; then
        setpriv --reuid=postgres --regid=postgres --init-groups -- "$@"
    else
        "$@"
    fi
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# psql as the superuser over a node's Unix socket: psql_node PORT SQL...
psql_node() {
    local port=$1; shift
    local args=()
    local s
    for s in "$@"; do args+=(-c "$s"); done
    as_pg "$PG_BINDIR/psql" -XAtq -v ON_ERROR_STOP=1 -h "$PG_SOCKDIR" -p "$port" -U postgres -d app "${args[@]}"
}

# Waits (at most 60 s) until both standbys have replayed the primary's current WAL position.
wait_standbys_caught_up() {
    local lsn port deadline=$((SECONDS + 60))
    lsn=$(psql_node "$PRIMARY_PORT" "SELECT pg_current_wal_lsn()")
    for port in "$STANDBY1_PORT" "$STANDBY2_PORT"; do
        until [ "$(psql_node "$port" "SELECT pg_last_wal_replay_lsn() >= '$lsn'::pg_lsn")" = t ]; do
            if [ $SECONDS -ge $deadline ]; then echo "standby on $port did not catch up" >&2; return 1; fi
            sleep 0.1
        done
    done
}

# Writes a pgfresh config for the cluster: write_pgfresh_conf FILE LISTEN_PORT ADMIN_PORT PARSER(true|false) [EXTRA_ROUTING_LINES]
# ($PGFRESH_POOL_SIZE and $PGFRESH_POOL_EXTRA go into [pool], $PGFRESH_MONITOR_EXTRA into
# [monitor]; max_client_connections is $PGFRESH_MAX_CLIENTS, 10000 unless set.)
write_pgfresh_conf() {
    local file=$1 port=$2 admin=$3 parser=$4 extra=${5:-}
    cat >"$file" <<EOF
[proxy]
listen = "127.0.0.1:$port"
admin_listen = "127.0.0.1:$admin"
log_level = "${PGFRESH_LOG_LEVEL:-warn}"
worker_threads = ${PGFRESH_WORKERS:-0}
io_engine = "${PGFRESH_IO_ENGINE:-epoll}"
max_client_connections = ${PGFRESH_MAX_CLIENTS:-10000}

[pool]
pool_size = ${PGFRESH_POOL_SIZE:-20}
${PGFRESH_POOL_EXTRA:-}

[monitor]
user = "postgres"
password = ""
database = "postgres"
${PGFRESH_MONITOR_EXTRA:-}

[routing]
enable_query_parser = $parser
$extra

[[nodes]]
name = "pg0"
host = "127.0.0.1"
port = $PRIMARY_PORT

[[nodes]]
name = "pg1"
host = "127.0.0.1"
port = $STANDBY1_PORT

[[nodes]]
name = "pg2"
host = "127.0.0.1"
port = $STANDBY2_PORT

[[users]]
name = "app"
auth = "trust"
EOF
}

# Starts pgfresh in the background: start_pgfresh CONF LOG; sets PGFRESH_PID.
start_pgfresh() {
    local conf=$1 log=$2
    "$PGFRESH_BIN" run -c "$conf" >"$log" 2>&1 &
    PGFRESH_PID=$!
}

# Polls until `SELECT 1` works on 127.0.0.1:PORT as app (at most 30 s).
wait_accepting() {
    local port=$1 deadline=$((SECONDS + 30))
    until "$PG_BINDIR/psql" -XAtq -h 127.0.0.1 -p "$port" -U app -d app -c "SELECT 1" >/dev/null 2>&1; do
        if [ $SECONDS -ge $deadline ]; then echo "nothing accepting on $port" >&2; return 1; fi
        sleep 0.1
    done
}

# Polls until a table read through the proxy on PORT is served by a standby (at most 30 s):
# the monitor has seen both roles and the cold-start window (every table read hot) is over.
# A relation-free SELECT would not do: it skips the recency check.
wait_replica_reads() {
    local port=$1 deadline=$((SECONDS + 30)) got
    while :; do
        got=$("$PG_BINDIR/psql" -XAtq -h 127.0.0.1 -p "$port" -U app -d app -c "SELECT inet_server_port() FROM pgbench_branches LIMIT 1" 2>/dev/null || true)
        if [ "$got" = "$STANDBY1_PORT" ] || [ "$got" = "$STANDBY2_PORT" ]; then return 0; fi
        if [ $SECONDS -ge $deadline ]; then echo "proxy on $port never served a read from a standby (last: '$got')" >&2; return 1; fi
        sleep 0.2
    done
}

# Stops a process we started and waits for it: stop_pid PID
stop_pid() {
    local pid=$1
    kill -INT "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + 15))
    while kill -0 "$pid" 2>/dev/null; do
        if [ $SECONDS -ge $deadline ]; then kill -KILL "$pid" 2>/dev/null || true; fi
        sleep 0.1
    done
    wait "$pid" 2>/dev/null || true
}

# utime + stime of PID in clock ticks.
cpu_ticks() {
    awk '{ print $14 + $15 }' "/proc/$1/stat"
}

# utime + stime, in clock ticks, of PID and all its live descendants (pgpool-II forks one
# process per client slot; a parent's own counters do not include live children).
cpu_ticks_tree() {
    local pid=$1 total child
    total=$(cpu_ticks "$pid" 2>/dev/null || echo 0)
    for child in $(ps -o pid= --ppid "$pid" 2>/dev/null); do
        total=$((total + $(cpu_ticks_tree "$child")))
    done
    echo "$total"
}

# The sum of the awk expression EXPR over the fields of /proc/PID/stat, for PID and all its
# live descendants: stat_sum_tree EXPR PID.
stat_sum_tree() {
    local expr=$1 pid=$2 total child
    total=$(awk "{ print $expr }" "/proc/$pid/stat" 2>/dev/null || echo 0)
    for child in $(ps -o pid= --ppid "$pid" 2>/dev/null); do
        total=$((total + $(stat_sum_tree "$expr" "$child")))
    done
    echo "$total"
}

# Like cpu_ticks_tree, plus the CPU time of children that have already exited and been
# reaped (cutime + cstime of every process in the tree): a proxy that replaces its worker
# processes (pgpool-II) keeps their time in the count.
cpu_ticks_tree_reaped() { stat_sum_tree '$14 + $15 + $16 + $17' "$1"; }

# Like cpu_ticks_tree_reaped, user space only (utime + cutime): what the proxy's own code
# costs, apart from the kernel's work for its system calls.
cpu_user_ticks_tree_reaped() { stat_sum_tree '$14 + $16' "$1"; }

# Saves pgfresh's Prometheus metrics (admin port) to FILE: metrics_snapshot ADMIN_PORT FILE.
# An unreachable admin port leaves FILE empty and returns 1.
metrics_snapshot() {
    curl -fsS "http://127.0.0.1:$1/metrics" >"$2" 2>/dev/null || { : >"$2"; return 1; }
}

# The change of every series of metric NAME between two metrics snapshots, one
# "SERIES DELTA" line each (the series as exposed, labels included; a series absent
# before counts from 0; unchanged series are left out): metrics_delta BEFORE AFTER NAME
metrics_delta() {
    awk -v name="$3" '
        FNR == 1 { file++ }
        /^#/ || NF < 2 { next }
        {
            # "name{labels} value [timestamp]" or "name value [timestamp]"
            if (match($0, /^[^{ ]*\{.*\}/)) { series = substr($0, 1, RLENGTH); rest = substr($0, RLENGTH + 1) }
            else { series = $1; rest = substr($0, length($1) + 1) }
            if (series != name && index(series, name "{") != 1) next
            split(rest, v, " ")
            if (file == 1) before[series] = v[1] + 0
            else if (!(series in after)) { order[++n] = series; after[series] = v[1] + 0 }
        }
        END {
            for (i = 1; i <= n; i++) {
                s = order[i]; d = after[s] - before[s]
                if (d != 0) printf "%s %.0f\n", s, d
            }
        }' "$1" "$2"
}

# Reads routed to replicas and all reads, from metrics_delta lines of pgfresh_routed_total
# on stdin: prints "REPLICA_READS READS". Reads are the routing reasons of a statement a
# replica could have served (READ_REASONS in crates/proxy/src/admin.rs, which /v1/status
# uses for its offload ratio).
routed_read_counts() {
    awk '
        BEGIN {
            split("replica read_only_txn hot_relation hot_relation_lsn read_only_snapshot token token_primary no_eligible_replica wal_feed", r, " ")
            for (i in r) reads[r[i]] = 1
        }
        {
            n = $NF + 0
            if ($0 ~ /target="replica"/) replica += n
            if (match($0, /reason="[^"]*"/)) {
                reason = substr($0, RSTART + 8, RLENGTH - 9)
                if (reason in reads) total += n
            }
        }
        END { printf "%d %d\n", replica, total }'
}

# The read-mostly mix as a pgbench script: 9 point reads of pgbench_accounts, then one
# autocommit UPDATE of it (10 statements a transaction): write_mix FILE
write_mix() {
    {
        for _ in 1 2 3 4 5 6 7 8 9; do
            echo '\set aid random(1, 100000 * :scale)'
            echo 'SELECT abalance FROM pgbench_accounts WHERE aid = :aid;'
        done
        echo '\set aid random(1, 100000 * :scale)'
        echo '\set delta random(-5000, 5000)'
        echo 'UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;'
    } >"$1"
}

# The benchmark cluster: the one in $CLUSTER_DIR (made by cluster.sh), or a new one that
# bench_cleanup removes. Sources its cluster.env. Needs HERE and OUTDIR.
bench_cluster() {
    OWN_CLUSTER=0
    if [ -z "${CLUSTER_DIR:-}" ]; then
        "$HERE/cluster.sh" start | tee "$OUTDIR/cluster.txt"
        CLUSTER_DIR=$(awk '/^cluster dir:/ { print $3 }' "$OUTDIR/cluster.txt")
        OWN_CLUSTER=1
    fi
    # shellcheck disable=SC1091
    source "$CLUSTER_DIR/cluster.env"
    PROXY_PID=""
    trap bench_cleanup EXIT
}

# Stop the proxy under test ($PROXY_PID) and remove the cluster bench_cluster made.
bench_cleanup() {
    if [ -n "${PROXY_PID:-}" ]; then stop_pid "$PROXY_PID"; fi
    if [ "${OWN_CLUSTER:-0}" = 1 ]; then "$HERE/cluster.sh" stop "$CLUSTER_DIR" >/dev/null; fi
}

# pgbench's tables at scale $SCALE on the primary, vacuumed and on every standby.
bench_pgbench_init() {
    echo "== pgbench -i -s $SCALE on the primary"
    "$PG_BINDIR/pgbench" -i -q -s "$SCALE" -h 127.0.0.1 -p "$PRIMARY_PORT" -U app app >"$OUTDIR/init.log" 2>&1
    psql_node "$PRIMARY_PORT" "VACUUM ANALYZE" "CHECKPOINT" >/dev/null
    wait_standbys_caught_up
}

# The start every comparison script shares, after its options: cd to the repository, build
# the release binary unless BUILD=0, make OUTDIR (default: a new temp dir named after $1),
# set CLK_TCK.
bench_start() {
    cd "$BENCH_ROOT" || return 1
    if [ "${BUILD:-1}" = 1 ]; then
        cargo build --release -p pgfresh
    fi
    OUTDIR="${OUTDIR:-$(mktemp -d "/tmp/pgfresh-$1.XXXXXX")}"
    mkdir -p "$OUTDIR"
    CLK_TCK=$(getconf CLK_TCK)
}

# Starts PgBouncer in front of the primary (trust auth, user app): start_pgbouncer DIR PORT
# POOL_MODE [EXTRA_INI_LINES]; sets PROXY_PID and returns once it accepts. Runs as the
# postgres user when we are root (PgBouncer refuses root), with a raised file limit.
# PGBOUNCER_WRAP, when set, is a command PgBouncer runs under (valgrind); PROXY_PID is then
# that command's process.
start_pgbouncer() {
    local bdir=$1 port=$2 mode=$3 extra=${4:-}
    as_pg mkdir -p "$bdir"
    as_pg tee "$bdir/pgbouncer.ini" >/dev/null <<EOT
[databases]
app = host=127.0.0.1 port=$PRIMARY_PORT dbname=app

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $bdir/userlist.txt
pool_mode = $mode
default_pool_size = 20
max_client_conn = 2000
logfile = $bdir/pgbouncer.log
$extra
EOT
    echo '"app" ""' | as_pg tee "$bdir/userlist.txt" >/dev/null
    if [ "$(id -u)" -eq 0 ]; then
        setpriv --reuid=postgres --regid=postgres --init-groups -- bash -c "ulimit -n 65536 2>/dev/null; exec ${PGBOUNCER_WRAP:-} pgbouncer '$bdir/pgbouncer.ini'" >"$OUTDIR/pgbouncer.server.log" 2>&1 &
    else
        ${PGBOUNCER_WRAP:-} pgbouncer "$bdir/pgbouncer.ini" >"$OUTDIR/pgbouncer.server.log" 2>&1 &
    fi
    PROXY_PID=$!
    wait_accepting "$port"
}

# Starts pgpool-II (Debian 12's pgpool2, 4.3) in streaming-replication mode over the cluster:
# the primary as node 0 (ALWAYS_PRIMARY), the two standbys, weight 1 each, connection cache
# on, no health checks: start_pgpool DIR PORT LOAD_BALANCE(on|off) [EXTRA_CONF_LINES]. Sets
# PROXY_PID and returns once it accepts (status 1 if it does not; its output is in
# $OUTDIR/pgpool.server.log). Runs as the postgres user when we are root, like PgBouncer.
# -D discards a pgpool_status an earlier run left in DIR (it would keep nodes marked down).
start_pgpool() {
    local pdir=$1 port=$2 lb=$3 extra=${4:-} pcp
    pcp=$(free_port)
    as_pg mkdir -p "$pdir"
    as_pg tee "$pdir/pgpool.conf" >/dev/null <<EOT
backend_clustering_mode = 'streaming_replication'
listen_addresses = '127.0.0.1'
port = $port
socket_dir = '$pdir'
pcp_listen_addresses = ''
pcp_port = $pcp
pcp_socket_dir = '$pdir'
wd_ipc_socket_dir = '$pdir'
pid_file_name = '$pdir/pgpool.pid'
logdir = '$pdir'
pool_passwd = ''
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
num_init_children = 32
max_pool = 2
connection_cache = on
load_balance_mode = $lb
sr_check_period = 1
sr_check_user = 'postgres'
sr_check_password = ''
sr_check_database = 'postgres'
health_check_period = 0
enable_pool_hba = off
failover_on_backend_error = off
log_min_messages = warning
$extra
EOT
    as_pg touch "$pdir/pcp.conf"
    if [ "$(id -u)" -eq 0 ]; then
        setpriv --reuid=postgres --regid=postgres --init-groups -- pgpool -n -D -f "$pdir/pgpool.conf" -F "$pdir/pcp.conf" \
            >"$OUTDIR/pgpool.server.log" 2>&1 &
    else
        pgpool -n -D -f "$pdir/pgpool.conf" -F "$pdir/pcp.conf" >"$OUTDIR/pgpool.server.log" 2>&1 &
    fi
    PROXY_PID=$!
    wait_accepting "$port"
}

# The training the profile-guided builds share (bench/bolt.sh, bench/pgo.sh): $PGFRESH_BIN,
# an instrumented build, runs pgbench through the cluster for $SECS seconds a workload,
# first in session mode (select-only with -M simple, extended and prepared, then the
# read-mostly mix), then in transaction mode with 50 clients (select-only, TPC-B-like).
# The instrumented process writes its counts when it exits; AFTER MODE runs after each
# mode's process has exited: train_statement_loop AFTER. Needs OUTDIR and SCALE.
train_statement_loop() {
    local after=$1 mode port admin
    write_mix "$OUTDIR/mix.sql"
    for mode in session transaction; do
        echo "== training: $mode mode"
        port=$(free_port); admin=$(free_port)
        PGFRESH_POOL_EXTRA="pool_mode = \"$mode\"" write_pgfresh_conf "$OUTDIR/$mode.toml" "$port" "$admin" true
        start_pgfresh "$OUTDIR/$mode.toml" "$OUTDIR/$mode.log"
        PROXY_PID=$PGFRESH_PID
        wait_accepting "$port"
        wait_replica_reads "$port"
        if [ "$mode" = session ]; then
            train_pgbench "$port" -c 8 -S -M simple
            train_pgbench "$port" -c 8 -S -M extended
            train_pgbench "$port" -c 8 -S -M prepared
            train_pgbench "$port" -c 8 -M extended -f "$OUTDIR/mix.sql" -s "$SCALE"
        else
            train_pgbench "$port" -c 50 -S -M extended
            train_pgbench "$port" -c 50 -M extended
        fi
        stop_pid "$PROXY_PID"; PROXY_PID=""
        "$after" "$mode"
    done
}

# One training workload through PORT: train_pgbench PORT PGBENCH_ARGS...
train_pgbench() {
    local port=$1; shift
    "$PG_BINDIR/pgbench" -n -j 2 -T "$SECS" -h 127.0.0.1 -p "$port" -U app "$@" app \
        >>"$OUTDIR/pgbench.log" 2>&1
}
