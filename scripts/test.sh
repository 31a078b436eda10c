#!/usr/bin/env bash
# Runs the whole test suite: unit, property and integration tests (the integration
# tests start a real primary + 2 streaming standbys on free loopback ports).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/prereqs.sh --browser
cargo test --workspace --locked
# The proxies above run their client sessions on the io_uring engine ([proxy] io_engine =
# "auto", the default, where the kernel allows it). The routing, pooling, driver, TLS and
# protocol suites again on tokio's epoll (already built: no second compile).
PGFRESH_TEST_IO_ENGINE=epoll cargo test --workspace --locked \
    --test routing --test transaction_pooling --test tx_drivers --test clients --test tls \
    --test protocol --test bad_input --test large_batches --test concurrency
