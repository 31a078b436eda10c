"""asyncpg through a transaction-mode pgfresh (tests/tests/tx_drivers.rs).

Usage: asyncpg_tx.py HOST PORT USER PASSWORD DBNAME TABLE

Six connections in one event loop (more clients than pgfresh has server connections).
Each prepares its statements with conn.prepare() (Parse + Describe + Flush, then Sync
once answered: the later Binds run in other units, on whatever server connection is
free), then runs ROUNDS rounds of: the prepared INSERT ... RETURNING, the prepared
SELECT of the row just inserted (fetchrow: Execute with row limit 1), a prepared
statement whose text differs per client, executemany (Binds and Executes under one
Sync) and a transaction of two statements. Odd clients have a statement cache of 3, so
asyncpg keeps closing the statements it evicts (Close) and preparing them again. At the
end each client looks at the server connection it runs on from inside a transaction:
its statements are there under pgfresh's names (__pgfresh_N), asyncpg's own
(__asyncpg_stmt_N__) are not. Then a pool whose connections log in with settings of
their own releases and acquires a connection: the reset a release runs (RESET ALL) brings
the login values back.

With PGFRESH_TEST_TLS=1 in the environment it connects with ssl="require".

Prints "OK <checks>" and exits 0 when every check passed.
"""

import asyncio
import os
import sys
import traceback

import asyncpg

host, port, user, password, dbname, table = sys.argv[1:7]
CLIENTS = 6
ROUNDS = 30
# Every wait is bounded: a hang in the proxy fails the script instead of blocking it.
TIMEOUT = 60

INSERT = f"INSERT INTO {table} (client, n, v) VALUES ($1, $2, $3)"
INSERT_RETURNING = INSERT + " RETURNING n"
SELECT = f"SELECT v FROM {table} WHERE client = $1 AND n = $2"
UPDATE = f"UPDATE {table} SET v = $1 WHERE client = $2 AND n = $3"


class Failed(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failed(what)


def target():
    """Where and how every connection of this script connects."""
    return dict(
        host=host,
        port=int(port),
        user=user,
        password=password,
        database=dbname,
        timeout=10,
        command_timeout=TIMEOUT,
        **({"ssl": "require"} if os.environ.get("PGFRESH_TEST_TLS") == "1" else {}),
    )


async def connect(cache_size=100):
    return await asyncpg.connect(statement_cache_size=cache_size, **target())


async def client(cid, conn):
    checks = 0
    ins = await conn.prepare(INSERT_RETURNING)
    sel = await conn.prepare(SELECT)
    own = await conn.prepare(f"SELECT $1::int + {cid}")
    # What Describe answered: parameter and column types of each client's own statement.
    check([t.name for t in own.get_parameters()] == ["int4"], "own statement's parameters")
    check([a.name for a in sel.get_attributes()] == ["v"], "SELECT's columns")
    check([a.name for a in ins.get_attributes()] == ["n"], "INSERT's columns")
    for n in range(ROUNDS):
        # fetch, not fetchval: fetchval's Execute has row limit 1, and pgfresh does not
        # mark an autocommit write that ends in PortalSuspended (tx_drivers.rs,
        # a_write_stopped_at_its_row_limit_is_marked); inside transactions it does.
        got = await ins.fetch(cid, n, f"c{cid}n{n}")
        check([r["n"] for r in got] == [n], f"client {cid}: INSERT returned {got} for {n}")
        row = await sel.fetchrow(cid, n)
        check(
            row is not None and row["v"] == f"c{cid}n{n}",
            f"client {cid} read {row} after inserting {n}",
        )
        got = await own.fetchval(n)
        check(got == n + cid, f"client {cid} got {got} for {n} + {cid}: another text ran")
        await conn.executemany(
            INSERT, [(cid, 2000 + 2 * n, "many"), (cid, 2001 + 2 * n, "many")]
        )
        async with conn.transaction():
            await ins.fetchval(cid, 1000 + n, "pending")
            await conn.execute(UPDATE, f"tx{n}", cid, 1000 + n)
        row = await sel.fetchrow(cid, 1000 + n)
        check(
            row is not None and row["v"] == f"tx{n}",
            f"client {cid} read {row} after its transaction {n}",
        )
        checks += 4
    count = await conn.fetchval(f"SELECT count(*) FROM {table} WHERE client = $1", cid)
    check(count == 4 * ROUNDS, f"client {cid} sees {count} rows of its own, not {4 * ROUNDS}")
    checks += 1
    # The server connection this transaction runs on.
    async with conn.transaction():
        await ins.fetchval(cid, 5000, "last")
        rows = await conn.fetch(
            "SELECT name, statement FROM pg_prepared_statements ORDER BY name"
        )
    names = [r["name"] for r in rows]
    mine = [r["name"] for r in rows if r["statement"] == INSERT_RETURNING]
    check(
        any(name.startswith("__pgfresh_") for name in mine),
        f"client {cid}: the INSERT is not prepared on the server under pgfresh's names: {rows}",
    )
    check(
        not any(name.startswith("__asyncpg_") for name in names),
        f"client {cid}: asyncpg's own names reached the server: {names}",
    )
    checks += 2
    return checks


async def pooled():
    """An asyncpg pool whose connections log in with settings of their own: a release
    resets the connection (asyncpg's reset query ends in RESET ALL), which must bring the
    login values back, as on PostgreSQL, not the server's defaults."""
    checks = 0
    path = "pgfresh_pool_path, public"
    pool = await asyncpg.create_pool(
        min_size=1,
        max_size=1,
        server_settings={"search_path": path, "application_name": "pooled"},
        **target(),
    )
    for round in range(3):
        async with pool.acquire() as conn:
            got = await conn.fetchval("SELECT current_setting('search_path')")
            check(got == path, f"pool round {round}: search_path {got!r}, not {path!r}")
            name = conn.get_settings().application_name
            check(name == "pooled", f"pool round {round}: application_name {name!r}")
            await conn.execute("SET search_path = public; SET application_name = 'changed'")
        checks += 2
    await pool.close()
    return checks


async def main():
    setup = await connect()
    await setup.execute(
        f"CREATE TABLE IF NOT EXISTS {table} (client int, n int, v text, PRIMARY KEY (client, n))"
    )
    await setup.close()
    # Every client connected before any starts: all six compete for the pool.
    conns = await asyncio.gather(*(connect(3 if cid % 2 else 100) for cid in range(CLIENTS)))
    results = await asyncio.wait_for(
        asyncio.gather(
            *(client(cid, c) for cid, c in enumerate(conns)), return_exceptions=True
        ),
        timeout=TIMEOUT * 2,
    )
    failed = False
    for cid, r in enumerate(results):
        if isinstance(r, BaseException):
            failed = True
            print(
                f"client {cid}:\n" + "".join(traceback.format_exception(r)),
                file=sys.stderr,
            )
    await asyncio.gather(*(c.close(timeout=10) for c in conns), return_exceptions=True)
    if failed:
        sys.exit(1)
    print(f"OK {sum(results) + await pooled()}")


asyncio.run(main())
