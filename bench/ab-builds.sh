#!/usr/bin/env bash
# Two pgfresh builds side by side, their runs interleaved: both builds run at once (each
# on its own ports, same cluster and config), and short pgbench runs alternate between
# them, A B B A A B ..., so the machine's drifting load hits both alike. For each run, the
# proxy's user and system CPU a statement (from /proc/PID/stat); at the end the medians
# and the median of the pairwise ratios B / A.
#
#   bench/ab-builds.sh -a BIN_A -b BIN_B [options]
#     -M PROTOCOL    pgbench protocol: simple (default), extended or prepared
#     -m MODE        pool_mode: session (default) or transaction
#     -w WORKLOAD    select (default: pgbench -S), mix (see write_mix in lib.sh) or tpcb
#                    (pgbench -N: BEGIN, UPDATE, SELECT, INSERT, END, 5 statements)
#     -T SECONDS     each run (default 5)
#     -n PAIRS       pairs of runs (default 8)
#     -c CLIENTS     pgbench clients (default 8)
#     -d DIR         use a running cluster made by bench/cluster.sh (default: make one)
#     -o DIR         where results and logs go (default: a new temp dir)
#
# Nothing is built: name the two binaries (e.g. the build before a change, copied aside,
# and the build after it).
# shellcheck disable=SC1091
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
BIN_A="" BIN_B="" PROTO=simple MODE=session WORKLOAD=select SECS=5 PAIRS=8 CLIENTS=8
while getopts "a:b:M:m:w:T:n:c:d:o:" opt; do
    case $opt in
        a) BIN_A=$OPTARG ;;
        b) BIN_B=$OPTARG ;;
        M) PROTO=$OPTARG ;;
        m) MODE=$OPTARG ;;
        w) WORKLOAD=$OPTARG ;;
        T) SECS=$OPTARG ;;
        n) PAIRS=$OPTARG ;;
        c) CLIENTS=$OPTARG ;;
        d) CLUSTER_DIR=$OPTARG ;;
        o) OUTDIR=$OPTARG ;;
        *) sed -n 2,21p "$0"; exit 2 ;;
    esac
done
[ -x "$BIN_A" ] && [ -x "$BIN_B" ] || { echo "name two pgfresh binaries with -a and -b" >&2; exit 2; }
BUILD=0
# shellcheck source=bench/lib.sh
source "$HERE/lib.sh"
bench_start ab-builds
bench_cluster
SCALE=1
bench_pgbench_init
if [ "$WORKLOAD" = mix ]; then
    write_mix "$OUTDIR/mix.sql"
    SCRIPT=(-f "$OUTDIR/mix.sql")
    PER_TX=10
elif [ "$WORKLOAD" = tpcb ]; then
    SCRIPT=(-N)
    PER_TX=5
else
    SCRIPT=(-S)
    PER_TX=1
fi

declare -A PID PORT
for side in a b; do
    PORT[$side]=$(free_port)
    pool=""
    [ "$MODE" = transaction ] && pool='pool_mode = "transaction"'
    PGFRESH_POOL_EXTRA=$pool write_pgfresh_conf "$OUTDIR/$side.toml" "${PORT[$side]}" "$(free_port)" true
    bin=$BIN_A; [ "$side" = b ] && bin=$BIN_B
    PGFRESH_BIN=$bin start_pgfresh "$OUTDIR/$side.toml" "$OUTDIR/$side.log"
    PID[$side]=$PGFRESH_PID
    wait_accepting "${PORT[$side]}"
done
trap 'stop_pid "${PID[a]}"; stop_pid "${PID[b]}"' EXIT

# run SIDE N: one pgbench run through SIDE; prints "statements user_us system_us".
run() {
    local side=$1 n=$2 u0 s0 u1 s1 tx log="$OUTDIR/$1.$2.pgbench.log"
    read -r u0 s0 < <(awk '{ print $14, $15 }' "/proc/${PID[$side]}/stat")
    "$PG_BINDIR/pgbench" -n "${SCRIPT[@]}" -M "$PROTO" -c "$CLIENTS" -j 2 -T "$SECS" \
        -h 127.0.0.1 -p "${PORT[$side]}" -U app app >"$log" 2>&1
    read -r u1 s1 < <(awk '{ print $14, $15 }' "/proc/${PID[$side]}/stat")
    tx=$(awk '/number of transactions actually processed/ { print $NF }' "$log")
    awk -v st=$((tx * PER_TX)) -v hz="$CLK_TCK" -v du=$((u1 - u0)) -v ds=$((s1 - s0)) \
        'BEGIN { printf "%d %.3f %.3f\n", st, du * 1e6 / hz / st, ds * 1e6 / hz / st }'
}

# Warm both up, then the pairs, alternating which goes first.
for side in a b; do run "$side" 0 >/dev/null; done
: >"$OUTDIR/runs.tsv"
for i in $(seq 1 "$PAIRS"); do
    order="a b"; [ $((i % 2)) = 0 ] && order="b a"
    for side in $order; do
        printf "%s\t%s\t%s\n" "$i" "$side" "$(run "$side" "$i" | tr ' ' '\t')" | tee -a "$OUTDIR/runs.tsv"
    done
done
python3 - "$OUTDIR/runs.tsv" "$BIN_A" "$BIN_B" <<'PY' | tee "$OUTDIR/results.txt"
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    i, side, st, u, s = line.split()
    runs[(int(i), side)] = (int(st), float(u), float(s))
pairs = sorted({i for i, _ in runs})
def med(side, f):
    return statistics.median(f(runs[(i, side)]) for i in pairs)
for side, name in (("a", sys.argv[2]), ("b", sys.argv[3])):
    print(f"{side} {name}: median user {med(side, lambda r: r[1]):.2f} us, system {med(side, lambda r: r[2]):.2f} us, "
          f"all {med(side, lambda r: r[1] + r[2]):.2f} us a statement, {med(side, lambda r: r[0]):.0f} statements a run")
for what, f in (("user", lambda r: r[1]), ("all", lambda r: r[1] + r[2])):
    ratios = sorted(f(runs[(i, "b")]) / f(runs[(i, "a")]) for i in pairs)
    print(f"b / a, {what}: median {statistics.median(ratios):.3f} (range {ratios[0]:.3f}-{ratios[-1]:.3f}, {len(ratios)} pairs)")
PY
