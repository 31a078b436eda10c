#!/usr/bin/env bash
# Builds pgfresh and runs `pgfresh demo`: a throwaway primary + 2 streaming standbys
# and the proxy on 127.0.0.1:6432. Ctrl-C stops and removes everything.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/prereqs.sh
cargo build --release --locked -p pgfresh
exec ./target/release/pgfresh demo "$@"
