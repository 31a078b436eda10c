#!/usr/bin/env bash
# Installs what building and testing pgfresh needs, when it is missing:
#   - libclang-dev: pg_query builds libpg_query with bindgen
#   - PostgreSQL server and client binaries (initdb, pg_ctl, pg_basebackup, psql, pgbench)
#   - python3-psycopg: the token tests drive pgfresh with psycopg (Debian's python3)
#   - python3-asyncpg, node-postgres, a JDK (java Program.java compiles the source, which
#     needs the jdk.compiler module a JRE lacks) and libpostgresql-jdbc-java: the
#     transaction-pooling driver tests (tests/tests/tx_drivers.rs). node-postgres is
#     Debian's node-pg where apt can install it; where it cannot (a nodejs not from
#     Debian, e.g. NodeSource's, which node-pg's dependencies refuse), npm installs the
#     pinned pg of tests/drivers/package-lock.json into tests/drivers/node_modules.
#   - chromium (only with --browser): the status page test renders the page headless
# Safe to run repeatedly; does nothing when everything is present.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

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
if ! dpkg -s python3-asyncpg >/dev/null 2>&1; then
  missing+=(python3-asyncpg)
fi
if [ ! -f /usr/share/java/postgresql.jar ]; then
  missing+=(libpostgresql-jdbc-java)
fi
java_modules=""
if command -v java >/dev/null 2>&1; then
  java_modules="$(java --list-modules 2>/dev/null || true)"
fi
if ! grep -q '^jdk\.compiler@' <<<"$java_modules"; then
  missing+=(default-jdk-headless)
fi
# node-postgres: the tests look in tests/drivers/node_modules, then in Debian's folder.
node_pg_found() {
  NODE_PATH="$root/tests/drivers/node_modules:/usr/share/nodejs" \
    node -e "require('pg')" >/dev/null 2>&1
}
need_pg=0
if ! command -v node >/dev/null 2>&1; then
  missing+=(nodejs node-pg)
elif ! node_pg_found; then
  need_pg=1
fi
if [ "$want_browser" = 1 ] && [ ! -x /usr/bin/chromium ]; then
  missing+=(chromium)
fi
export DEBIAN_FRONTEND=noninteractive
if [ "${#missing[@]}" -gt 0 ] || [ "$need_pg" = 1 ]; then
  "${sudo_cmd[@]}" apt-get update -qq
fi
if [ "$need_pg" = 1 ] && apt-get install -s -qq node-pg >/dev/null 2>&1; then
  missing+=(node-pg)
  need_pg=0
fi
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing: ${missing[*]}"
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ "$need_pg" = 1 ]; then
  echo "installing: pg (npm, into tests/drivers/node_modules)"
  if ! command -v npm >/dev/null 2>&1; then
    echo "node-pg cannot be installed with apt here and npm is missing" >&2
    exit 1
  fi
  (cd "$root/tests/drivers" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  node_pg_found || { echo "pg still not found after npm ci" >&2; exit 1; }
fi
# A freshly installed Debian postgresql package starts its own cluster on 5432; pgfresh's
# tests and demo make their own clusters on free ports and do not need it.
echo "prerequisites present: $(pg_config --bindir)"
