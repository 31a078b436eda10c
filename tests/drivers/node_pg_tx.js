// node-postgres through a transaction-mode pgfresh (tests/tests/tx_drivers.rs).
//
// Usage: node node_pg_tx.js HOST PORT USER PASSWORD DBNAME TABLE
// (pg is found through NODE_PATH: tests/drivers/node_modules or Debian's /usr/share/nodejs)
//
// Six clients (more than pgfresh has server connections) run ROUNDS rounds of named
// queries: node-postgres sends Parse for a name only the first time a connection uses
// it, then only Bind/Describe/Execute/Sync. 'ins' and 'sel' have the same text on every
// client; 'q_own' has another text on each (SELECT $1::int + <client>) under the same
// name. Each round also runs a transaction of two named statements. At the end each
// client looks at the server connection it runs on from inside a transaction: its
// statements are there under pgfresh's names (__pgfresh_N), 'ins' and 'q_own' are not.
//
// With PGFRESH_TEST_TLS=1 in the environment it connects over TLS (no certificate checks).
//
// Prints "OK <checks>" and exits 0 when every check passed.

'use strict';

const { Client } = require('pg');

const [host, port, user, password, database, table] = process.argv.slice(2, 8);
const CLIENTS = 6;
const ROUNDS = 30;
// Every wait is bounded: a hang in the proxy fails the script instead of blocking it.
const TIMEOUT_MS = 60000;

const INSERT = `INSERT INTO ${table} (client, n, v) VALUES ($1, $2, $3)`;
const SELECT = `SELECT v FROM ${table} WHERE client = $1 AND n = $2`;
const UPDATE = `UPDATE ${table} SET v = $1 WHERE client = $2 AND n = $3`;

function check(cond, what) {
  if (!cond) throw new Error(what);
}

async function connect() {
  const c = new Client({
    host,
    port: Number(port),
    user,
    password,
    database,
    connectionTimeoutMillis: 10000,
    query_timeout: TIMEOUT_MS,
    // PGFRESH_TEST_TLS=1: TLS without certificate checks (sslmode=require).
    ssl: process.env.PGFRESH_TEST_TLS === '1' ? { rejectUnauthorized: false } : false,
  });
  await c.connect();
  return c;
}

async function client(cid, c) {
  let checks = 0;
  const ins = (n, v) => c.query({ name: 'ins', text: INSERT, values: [cid, n, v] });
  const sel = async (n) => {
    const r = await c.query({ name: 'sel', text: SELECT, values: [cid, n] });
    return r.rows.length === 1 ? r.rows[0].v : r.rows;
  };
  for (let n = 0; n < ROUNDS; n++) {
    const r = await ins(n, `c${cid}n${n}`);
    check(r.rowCount === 1, `client ${cid}: INSERT ${n} counted ${r.rowCount}`);
    let v = await sel(n);
    check(v === `c${cid}n${n}`, `client ${cid} read ${JSON.stringify(v)} after inserting ${n}`);
    const own = await c.query({ name: 'q_own', text: `SELECT $1::int + ${cid} AS sum`, values: [n] });
    check(
      own.rows[0].sum === n + cid,
      `client ${cid} got ${own.rows[0].sum} for ${n} + ${cid}: another client's q_own ran`,
    );
    await c.query('BEGIN');
    await ins(1000 + n, 'pending');
    await c.query({ name: 'upd', text: UPDATE, values: [`tx${n}`, cid, 1000 + n] });
    await c.query('COMMIT');
    v = await sel(1000 + n);
    check(v === `tx${n}`, `client ${cid} read ${JSON.stringify(v)} after its transaction ${n}`);
    checks += 4;
  }
  const count = await c.query({
    name: 'count',
    text: `SELECT count(*)::int AS n FROM ${table} WHERE client = $1`,
    values: [cid],
  });
  check(count.rows[0].n === 2 * ROUNDS, `client ${cid} sees ${count.rows[0].n} rows of its own`);
  checks += 1;
  // The server connection this transaction runs on.
  await c.query('BEGIN');
  await ins(5000, 'last');
  const ps = await c.query('SELECT name, statement FROM pg_prepared_statements ORDER BY name');
  await c.query('COMMIT');
  const names = ps.rows.map((r) => r.name);
  check(
    ps.rows.some((r) => r.name.startsWith('__pgfresh_') && r.statement === INSERT),
    `client ${cid}: 'ins' is not prepared on the server under pgfresh's names: ${JSON.stringify(ps.rows)}`,
  );
  check(
    !names.some((n) => ['ins', 'sel', 'upd', 'q_own', 'count'].includes(n)),
    `client ${cid}: the client's names reached the server: ${names}`,
  );
  checks += 2;
  return checks;
}

async function main() {
  const timer = setTimeout(() => {
    console.error(`timed out after ${2 * TIMEOUT_MS} ms`);
    process.exit(2);
  }, 2 * TIMEOUT_MS);
  const setup = await connect();
  await setup.query(
    `CREATE TABLE IF NOT EXISTS ${table} (client int, n int, v text, PRIMARY KEY (client, n))`,
  );
  await setup.end();
  // Every client connected before any starts: all six compete for the pool.
  const clients = await Promise.all(Array.from({ length: CLIENTS }, () => connect()));
  const results = await Promise.allSettled(clients.map((c, cid) => client(cid, c)));
  await Promise.allSettled(clients.map((c) => c.end()));
  clearTimeout(timer);
  let failed = false;
  let checks = 0;
  results.forEach((r, cid) => {
    if (r.status === 'rejected') {
      failed = true;
      console.error(`client ${cid}:`, r.reason);
    } else {
      checks += r.value;
    }
  });
  if (failed) process.exit(1);
  console.log(`OK ${checks}`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
