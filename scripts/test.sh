#!/usr/bin/env bash
# Runs the whole test suite: unit, property and integration tests (the integration
# tests start a real primary + 2 streaming standbys on free loopback ports).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/prereqs.sh --browser
cargo test --workspace --locked
# The io_uring engine ([proxy] io_engine): the routing, pooling, driver, TLS and protocol
# suites again with the client sessions on the ring (already built: no second compile).
PGFRESH_TEST_IO_ENGINE=io_uring cargo test --workspace --locked \
    --test routing --test transaction_pooling --test tx_drivers --test clients --test tls \
    --test protocol --test bad_input --test large_batches --test concurrency
