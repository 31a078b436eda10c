"""psycopg 3 through a transaction-mode pgfresh (tests/tests/tx_drivers.rs).

Usage: psycopg_tx.py HOST PORT USER PASSWORD DBNAME TABLE THRESHOLD [PREPARED_MAX]

THRESHOLD is "0" (psycopg prepares every statement the first time it runs it) or
"default" (psycopg's own threshold: prepared from the sixth run on). PREPARED_MAX sets
how many statements psycopg keeps prepared (default 100); past it psycopg sends
DEALLOCATE <name> for the least recently used one.

Six threads, each on its own connection (more clients than pgfresh has server
connections), run ROUNDS rounds of: a prepared INSERT, a prepared SELECT of the row just
inserted, a statement whose text differs per client (psycopg names its statements
_pg3_0, _pg3_1, ... on every connection, so the same name has another text on each
client), and a transaction of two statements. A DROP makes psycopg send DEALLOCATE ALL
(it forgets its statements and prepares them again under new names). At the end each
client looks at the server connection it runs on from inside a transaction: the
statements it prepared are there under pgfresh's names (__pgfresh_N), psycopg's own
names are not.

With PGFRESH_TEST_TLS=1 in the environment it connects with sslmode=require.

Prints "OK <checks>" and exits 0 when every check passed.
"""

import os
import sys
import threading
import traceback

import psycopg
from psycopg.conninfo import make_conninfo

host, port, user, password, dbname, table, threshold = sys.argv[1:8]
prepared_max = int(sys.argv[8]) if len(sys.argv) > 8 else None
CLIENTS = 6
ROUNDS = 30
# Every wait is bounded: a hang in the proxy fails the script instead of blocking it.
TIMEOUT = 60

conninfo = make_conninfo(
    host=host,
    port=port,
    user=user,
    password=password,
    dbname=dbname,
    connect_timeout=10,
    options="-c statement_timeout=30000",
    sslmode="require" if os.environ.get("PGFRESH_TEST_TLS") == "1" else "prefer",
)

INSERT = f"INSERT INTO {table} (client, n, v) VALUES (%s, %s, %s)"
SELECT = f"SELECT v FROM {table} WHERE client = %s AND n = %s"
UPDATE = f"UPDATE {table} SET v = %s WHERE client = %s AND n = %s"


def connect():
    if threshold == "default":
        conn = psycopg.connect(conninfo, autocommit=True)
    else:
        conn = psycopg.connect(conninfo, autocommit=True, prepare_threshold=int(threshold))
    if prepared_max is not None:
        conn.prepared_max = prepared_max
    return conn


class Failed(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failed(what)


def client(cid, barrier, results):
    checks = 0
    with connect() as conn:
        if threshold == "default":
            check(conn.prepare_threshold == 5, f"default threshold {conn.prepare_threshold}")
        else:
            check(conn.prepare_threshold == int(threshold), "threshold")
        # Every client connected before any starts: all six compete for the pool.
        barrier.wait(TIMEOUT)
        for n in range(ROUNDS):
            conn.execute(INSERT, (cid, n, f"c{cid}n{n}"))
            row = conn.execute(SELECT, (cid, n)).fetchone()
            check(row == (f"c{cid}n{n}",), f"client {cid} read {row} after inserting {n}")
            own = conn.execute(f"SELECT %s::int + {cid}", (n,)).fetchone()[0]
            check(own == n + cid, f"client {cid} got {own} for {n} + {cid}: another text ran")
            with conn.transaction():
                conn.execute(INSERT, (cid, 1000 + n, "pending"))
                conn.execute(UPDATE, (f"tx{n}", cid, 1000 + n))
            row = conn.execute(SELECT, (cid, 1000 + n)).fetchone()
            check(row == (f"tx{n}",), f"client {cid} read {row} after its transaction {n}")
            checks += 3
            if n == ROUNDS // 2:
                # psycopg forgets its prepared statements after a DROP and sends
                # DEALLOCATE ALL before the next statement.
                conn.execute(f"DROP TABLE IF EXISTS {table}_none_{cid}")
        count = conn.execute(
            f"SELECT count(*) FROM {table} WHERE client = %s", (cid,)
        ).fetchone()[0]
        check(count == 2 * ROUNDS, f"client {cid} sees {count} rows of its own")
        checks += 1
        # The server connection this transaction runs on: psycopg's statements are there
        # under pgfresh's names, never under psycopg's.
        with conn.transaction():
            conn.execute(INSERT, (cid, 5000, "last"))
            rows = conn.execute(
                "SELECT name, statement FROM pg_prepared_statements ORDER BY name"
            ).fetchall()
        names = [r[0] for r in rows]
        mine = [name for name, text in rows if f"INSERT INTO {table} " in text]
        check(
            any(name.startswith("__pgfresh_") for name in mine),
            f"client {cid}: the INSERT is not prepared on the server under pgfresh's names: {rows}",
        )
        check(
            not any(name.startswith("_pg3_") for name in names),
            f"client {cid}: psycopg's own names reached the server: {names}",
        )
        # psycopg did prepare its statements (and keeps preparing after DEALLOCATE ALL).
        prepared = dict(conn._prepared._names)
        check(len(prepared) >= min(3, conn.prepared_max), f"psycopg prepared {prepared}")
        checks += 3
    results[cid] = checks


def main():
    with psycopg.connect(conninfo, autocommit=True) as setup:
        setup.execute(
            f"CREATE TABLE IF NOT EXISTS {table} (client int, n int, v text, PRIMARY KEY (client, n))"
        )
    barrier = threading.Barrier(CLIENTS)
    results = {}
    errors = []

    def run(cid):
        try:
            client(cid, barrier, results)
        except BaseException:
            barrier.abort()
            errors.append(f"client {cid}:\n{traceback.format_exc()}")

    threads = [threading.Thread(target=run, args=(cid,)) for cid in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        for e in errors:
            print(e, file=sys.stderr)
        sys.exit(1)
    if len(results) != CLIENTS:
        sys.exit(f"only {len(results)} clients finished")
    print(f"OK {sum(results.values())}")


main()
