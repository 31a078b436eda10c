#!/usr/bin/env bash
# A release build of pgfresh with its hot code laid out together by BOLT (LLVM's post-link
# optimizer), from a profile of the statement loop under pgbench.
#
#   bench/bolt.sh [options]
#     -d DIR         use a running cluster made by bench/cluster.sh (default: make one, remove it after)
#     -o FILE        the optimized binary (default: target/release/pgfresh.bolt)
#     -t SECONDS     how long each training workload runs (default 8)
#     -B             skip the build (target/bolt/release/pgfresh must exist)
#
# Why: the statement loop's code does not fit the first-level instruction cache (callgrind
# simulates about 750 misses a statement, PgBouncer about 1; docs/benchmarks.md). BOLT puts
# the code that runs per statement next to each other and moves the rest away.
#
# Steps:
# 1. `cargo build --release -p pgfresh` into target/bolt, linked with --emit-relocs (BOLT
#    needs the relocations to move functions).
# 2. `llvm-bolt -instrument`: a binary that counts its own branches and writes them out.
# 3. That binary runs the training workloads through a cluster: pgbench select-only with
#    -M simple, extended and prepared, the read-mostly mix (write_mix in bench/lib.sh), in
#    session mode, then select-only and TPC-B-like in transaction mode with 50 clients.
# 4. `llvm-bolt` lays the build out from the counts into FILE.
# Needs llvm-bolt (Debian: apt-get install bolt-19, or any later one on PATH as llvm-bolt).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
CLUSTER_DIR="" OUTFILE="" SECS=8 BUILD=1
while getopts "d:o:t:B" opt; do
    case $opt in
        d) CLUSTER_DIR=$OPTARG ;;
        o) OUTFILE=$OPTARG ;;
        t) SECS=$OPTARG ;;
        B) BUILD=0 ;;
        *) sed -n 2,25p "$0"; exit 2 ;;
    esac
done

BOLT=""
for b in llvm-bolt llvm-bolt-19 llvm-bolt-20 llvm-bolt-21 llvm-bolt-22; do
    if command -v "$b" >/dev/null; then BOLT=$b; break; fi
done
if [ -z "$BOLT" ]; then
    echo "llvm-bolt not found (Debian: apt-get install bolt-19)" >&2
    exit 1
fi
# The instrumentation runtime, looked up by llvm-bolt relative to /usr/lib.
RT=$(find /usr/lib -name libbolt_rt_instr.a 2>/dev/null | head -1)
if [ -z "$RT" ]; then
    echo "libbolt_rt_instr.a not found (it comes with the bolt package)" >&2
    exit 1
fi

ROOT="$(cd "$HERE/.." && pwd)"
TARGET="$ROOT/target/bolt"
OUTFILE="${OUTFILE:-$ROOT/target/release/pgfresh.bolt}"
if [ "$BUILD" = 1 ]; then
    (cd "$ROOT" && CARGO_TARGET_DIR="$TARGET" RUSTFLAGS="-C link-arg=-Wl,--emit-relocs" \
        cargo build --release -p pgfresh)
fi
BUILT="$TARGET/release/pgfresh"

BUILD=0
SCALE=10
# shellcheck source=bench/lib.sh
source "$HERE/lib.sh"
bench_start bolt
bench_cluster
bench_pgbench_init

PROFILE="$OUTDIR/pgfresh.fdata"
"$BOLT" "$BUILT" -instrument -o "$OUTDIR/pgfresh.instrumented" \
    --runtime-instrumentation-lib="${RT#/usr/lib/}" \
    --instrumentation-file="$PROFILE" >"$OUTDIR/instrument.log" 2>&1
PGFRESH_BIN="$OUTDIR/pgfresh.instrumented"
write_mix "$OUTDIR/mix.sql"

pgbench_for() {
    local port=$1; shift
    "$PG_BINDIR/pgbench" -n -j 2 -T "$SECS" -h 127.0.0.1 -p "$port" -U app "$@" app \
        >>"$OUTDIR/pgbench.log" 2>&1
}

train() {
    local mode=$1; shift
    local port admin
    port=$(free_port); admin=$(free_port)
    PGFRESH_POOL_EXTRA="pool_mode = \"$mode\"" write_pgfresh_conf "$OUTDIR/$mode.toml" "$port" "$admin" true
    start_pgfresh "$OUTDIR/$mode.toml" "$OUTDIR/$mode.log"
    PROXY_PID=$PGFRESH_PID
    wait_accepting "$port"
    wait_replica_reads "$port"
    "$@" "$port"
    # The counts are written when the process exits.
    stop_pid "$PROXY_PID"; PROXY_PID=""
}

session_workloads() {
    local port=$1
    pgbench_for "$port" -c 8 -S -M simple
    pgbench_for "$port" -c 8 -S -M extended
    pgbench_for "$port" -c 8 -S -M prepared
    pgbench_for "$port" -c 8 -M extended -f "$OUTDIR/mix.sql" -s "$SCALE"
}
transaction_workloads() {
    local port=$1
    pgbench_for "$port" -c 50 -S -M extended
    pgbench_for "$port" -c 50 -M extended
}

echo "== training: session mode"
train session session_workloads
mv "$PROFILE" "$OUTDIR/session.fdata"
echo "== training: transaction mode"
train transaction transaction_workloads
mv "$PROFILE" "$OUTDIR/transaction.fdata"

echo "== laying out $OUTFILE"
MERGE=$(dirname "$(readlink -f "$(command -v "$BOLT")")")/merge-fdata
"$MERGE" "$OUTDIR/session.fdata" "$OUTDIR/transaction.fdata" >"$PROFILE" 2>"$OUTDIR/merge.log"
"$BOLT" "$BUILT" -o "$OUTFILE" -data "$PROFILE" \
    -reorder-blocks=ext-tsp -reorder-functions=cdsort -split-functions -split-all-cold \
    -split-eh -icf=1 -use-gnu-stack -dyno-stats >"$OUTDIR/optimize.log" 2>&1
grep -E "non-empty execution profile|basic block reordering" "$OUTDIR/optimize.log" || true
# The laid-out binary must still start and read a config.
"$OUTFILE" check -c "$OUTDIR/session.toml" >"$OUTDIR/check.log" 2>&1 ||
    { echo "the optimized binary failed 'pgfresh check' (see $OUTDIR/check.log)" >&2; exit 1; }
echo "optimized: $OUTFILE (logs in $OUTDIR)"
