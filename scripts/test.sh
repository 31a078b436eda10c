#!/usr/bin/env bash
# Runs the whole test suite: unit, property and integration tests (the integration
# tests start a real primary + 2 streaming standbys on free loopback ports).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/prereqs.sh --browser
cargo test --workspace --locked
