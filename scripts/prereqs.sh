#!/usr/bin/env bash
# Installs what building and testing pgfresh needs, when it is missing:
#   - libclang-dev: pg_query builds libpg_query with bindgen
#   - PostgreSQL server and client binaries (initdb, pg_ctl, pg_basebackup, psql, pgbench)
#   - python3-psycopg: the token tests drive pgfresh with psycopg (Debian's python3)
#   - chromium (only with --browser): the status page test renders the page headless
# Safe to run repeatedly; does nothing when everything is present.
set -euo pipefail

want_browser=0
[ "${1:-}" = "--browser" ] && want_browser=1

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  sudo_cmd=(sudo)
fi

missing=()
if ! dpkg -s libclang-dev >/dev/null 2>&1; then
  missing+=(libclang-dev)
fi
if ! command -v pg_config >/dev/null 2>&1 || [ ! -x "$(pg_config --bindir 2>/dev/null)/initdb" ]; then
  missing+=(postgresql postgresql-contrib libpq-dev)
fi
if ! command -v psql >/dev/null 2>&1 || ! command -v pgbench >/dev/null 2>&1; then
  missing+=(postgresql-client)
fi
if ! dpkg -s python3-psycopg >/dev/null 2>&1; then
  missing+=(python3-psycopg)
fi
if [ "$want_browser" = 1 ] && [ ! -x /usr/bin/chromium ]; then
  missing+=(chromium)
fi
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# A freshly installed Debian postgresql package starts its own cluster on 5432; pgfresh's
# tests and demo make their own clusters on free ports and do not need it.
echo "prerequisites present: $(pg_config --bindir)"
