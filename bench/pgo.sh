#!/usr/bin/env bash
# A release build of pgfresh optimised from a profile of the statement loop under pgbench
# (profile-guided optimisation: rustc's -Cprofile-generate, then -Cprofile-use), and
# optionally laid out by BOLT afterwards.
#
#   bench/pgo.sh [options]
#     -d DIR         use a running cluster made by bench/cluster.sh (default: make one, remove it after)
#     -o FILE        the optimised binary (default: target/release/pgfresh.pgo)
#     -t SECONDS     how long each training workload runs (default 8)
#     -b             also lay the optimised binary out with bench/bolt.sh, into FILE.bolt
#
# Why: the statement loop's code does not fit the first-level instruction cache
# (docs/benchmarks.md). With a profile, LLVM inlines where the calls are hot, lays each
# function's hot blocks out together and moves the cold ones away; BOLT then orders whole
# functions, which the compiler cannot.
#
# Steps:
# 1. `cargo build --release -p pgfresh` into target/pgo-gen with -Cprofile-generate (every
#    crate but build scripts and proc macros: the build names its target, so RUSTFLAGS
#    reach only what runs in the binary).
# 2. That binary runs the training workloads (train_statement_loop in bench/lib.sh), each
#    process writing its counts when it exits.
# 3. llvm-profdata merges the counts; the same build again into target/pgo with
#    -Cprofile-use, linked with --emit-relocs so that BOLT can move its functions.
# Needs an llvm-profdata of rustc's own LLVM version (`rustc -vV`; Debian: apt-get install
# llvm-22 for rustc 1.95), and for -b what bench/bolt.sh needs.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
CLUSTER_DIR="" OUTFILE="" SECS=8 WITH_BOLT=0
while getopts "d:o:t:b" opt; do
    case $opt in
        d) CLUSTER_DIR=$OPTARG ;;
        o) OUTFILE=$OPTARG ;;
        t) SECS=$OPTARG ;;
        b) WITH_BOLT=1 ;;
        *) sed -n 2,26p "$0"; exit 2 ;;
    esac
done

LLVM_MAJOR=$(rustc -vV | awk '/^LLVM version:/ { split($3, v, "."); print v[1] }')
PROFDATA=""
for p in "llvm-profdata-$LLVM_MAJOR" "/usr/lib/llvm-$LLVM_MAJOR/bin/llvm-profdata" llvm-profdata; do
    if command -v "$p" >/dev/null &&
        "$p" --version 2>/dev/null | grep -q "LLVM version $LLVM_MAJOR\."; then
        PROFDATA=$p
        break
    fi
done
if [ -z "$PROFDATA" ]; then
    echo "no llvm-profdata of LLVM $LLVM_MAJOR, rustc's (Debian: apt-get install llvm-$LLVM_MAJOR)" >&2
    exit 1
fi

ROOT="$(cd "$HERE/.." && pwd)"
HOST=$(rustc -vV | awk '/^host:/ { print $2 }')
OUTFILE="${OUTFILE:-$ROOT/target/release/pgfresh.pgo}"
case $OUTFILE in /*) ;; *) OUTFILE="$PWD/$OUTFILE" ;; esac

USER_CLUSTER=$CLUSTER_DIR
BUILD=0
SCALE=10
# shellcheck source=bench/lib.sh
source "$HERE/lib.sh"
bench_start pgo
# A fixed place for the counts: the instrumented build names it, so a second run of the same
# source reuses that build.
COUNTS="$ROOT/target/pgo-gen/profraw"
rm -rf "$COUNTS"
mkdir -p "$COUNTS"

echo "== instrumented build (target/pgo-gen)"
CARGO_TARGET_DIR="$ROOT/target/pgo-gen" RUSTFLAGS="-Cprofile-generate=$COUNTS" \
    cargo build --release -p pgfresh --target "$HOST"

bench_cluster
bench_pgbench_init
PGFRESH_BIN="$ROOT/target/pgo-gen/$HOST/release/pgfresh"
export LLVM_PROFILE_FILE="$COUNTS/pgfresh-%p-%m.profraw"
no_more() { :; }
train_statement_loop no_more
unset LLVM_PROFILE_FILE
if ! ls "$COUNTS"/*.profraw >/dev/null 2>&1; then
    echo "the instrumented build wrote no counts (did it exit normally?)" >&2
    exit 1
fi
"$PROFDATA" merge -o "$OUTDIR/pgfresh.profdata" "$COUNTS"/*.profraw

echo "== optimised build (target/pgo)"
CARGO_TARGET_DIR="$ROOT/target/pgo" \
    RUSTFLAGS="-Cprofile-use=$OUTDIR/pgfresh.profdata -Clink-arg=-Wl,--emit-relocs" \
    cargo build --release -p pgfresh --target "$HOST"
cp "$ROOT/target/pgo/$HOST/release/pgfresh" "$OUTFILE"
# The optimised binary must still start and read a config.
"$OUTFILE" check -c "$OUTDIR/session.toml" >"$OUTDIR/check.log" 2>&1 ||
    { echo "the optimised binary failed 'pgfresh check' (see $OUTDIR/check.log)" >&2; exit 1; }
echo "optimised: $OUTFILE (logs in $OUTDIR)"

if [ "$WITH_BOLT" = 1 ]; then
    bench_cleanup
    trap - EXIT
    "$HERE/bolt.sh" -i "$OUTFILE" -o "$OUTFILE.bolt" -t "$SECS" ${USER_CLUSTER:+-d "$USER_CLUSTER"}
fi
