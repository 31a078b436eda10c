#!/usr/bin/env bash
# A release build of pgfresh with its hot code laid out together by BOLT (LLVM's post-link
# optimizer), from a profile of the statement loop under pgbench.
#
#   bench/bolt.sh [options]
#     -d DIR         use a running cluster made by bench/cluster.sh (default: make one, remove it after)
#     -o FILE        the optimized binary (default: target/release/pgfresh.bolt)
#     -t SECONDS     how long each training workload runs (default 8)
#     -B             skip the build (target/bolt/release/pgfresh must exist)
#     -i BINARY      lay out BINARY instead of building (it must be linked with
#                    --emit-relocs, as bench/pgo.sh links its build)
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
# Needs llvm-bolt (Debian: apt-get install bolt-22 or bolt-19, or any on PATH as llvm-bolt).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
CLUSTER_DIR="" OUTFILE="" SECS=8 BUILD=1 INPUT=""
while getopts "d:o:t:i:B" opt; do
    case $opt in
        d) CLUSTER_DIR=$OPTARG ;;
        o) OUTFILE=$OPTARG ;;
        t) SECS=$OPTARG ;;
        B) BUILD=0 ;;
        i) INPUT=$(readlink -f "$OPTARG"); BUILD=0 ;;
        *) sed -n 2,27p "$0"; exit 2 ;;
    esac
done

BOLT=""
for b in llvm-bolt llvm-bolt-22 llvm-bolt-21 llvm-bolt-20 llvm-bolt-19; do
    if command -v "$b" >/dev/null; then BOLT=$b; break; fi
done
if [ -z "$BOLT" ]; then
    echo "llvm-bolt not found (Debian: apt-get install bolt-22, or bolt-19)" >&2
    exit 1
fi
# The instrumentation runtime (an absolute path: llvm-bolt reads a relative one from its own
# library directory).
# (That of the same LLVM version first, when several are installed.)
BOLT_LIB=$(dirname "$(dirname "$(readlink -f "$(command -v "$BOLT")")")")/lib
RT=$( (find "$BOLT_LIB" /usr/lib -name libbolt_rt_instr.a 2>/dev/null || true) | head -1)
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
BUILT="${INPUT:-$TARGET/release/pgfresh}"

BUILD=0
SCALE=10
# shellcheck source=bench/lib.sh
source "$HERE/lib.sh"
bench_start bolt
bench_cluster
bench_pgbench_init

PROFILE="$OUTDIR/pgfresh.fdata"
"$BOLT" "$BUILT" -instrument -o "$OUTDIR/pgfresh.instrumented" \
    --runtime-instrumentation-lib="$RT" \
    --instrumentation-file="$PROFILE" >"$OUTDIR/instrument.log" 2>&1
PGFRESH_BIN="$OUTDIR/pgfresh.instrumented"

# Each mode's counts in a file of their own (the instrumented binary writes $PROFILE).
keep_counts() { mv "$PROFILE" "$OUTDIR/$1.fdata"; }
train_statement_loop keep_counts

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
