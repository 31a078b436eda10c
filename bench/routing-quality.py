#!/usr/bin/env python3
"""Routing-quality benchmark: does pgfresh offload reads without ever serving a stale one?

Both standbys replay WAL with `recovery_min_apply_delay` (default 300 ms), so any read of a
just-written row that reaches a standby misses it. Through pgfresh, each phase runs three
slots one after the other, `--seconds` each (a slot's writes are the only writes in the
database while it runs):

  mixed slot
    same-session  sessions that INSERT a row with a unique id, then SELECT it back at once
    cross-session writer/reader pairs: the writer INSERTs (alternately autocommit and inside
                  BEGIN ... COMMIT), then a *different* connection SELECTs the row at once
    cold          sessions that read random rows of a table nobody writes
  ro-txn slot
    ro-txn        writer connections INSERT a row into rq_ro_a, then pause (uniformly 0 to
                  2 x --ro-write-gap-ms); once the INSERT is acknowledged the writer publishes
                  its id. Other connections loop: BEGIN READ ONLY; SELECT a random row of the
                  cold table; SELECT the newest row of every writer published before the first
                  statement was sent; COMMIT. A miss: such a row is not found.
  trigger slot
    trigger       writer/reader pairs: the writer INSERTs into rq_orders (alternately
                  autocommit and in BEGIN ... COMMIT), whose AFTER INSERT trigger (PL/pgSQL)
                  upserts the customer's row in rq_order_totals; right after the
                  acknowledgement a different connection reads that row. A miss: the row does
                  not show the order.

Every read also returns `inet_server_port()`, so the script knows which node served it. It
reports, per workload, reads served by replicas vs the primary, read-after-write misses,
errors, and the delta of pgfresh's `pgfresh_routed_total{target,reason}` counters.

For ro-txn and trigger it also reports the *ideal* offload: the share of reads that some
standby could have served without staleness at the moment they were issued. A thread polls
every standby directly (not through pgfresh) every --poll-ms for what it has replayed (per
ro-txn writer its largest id; per customer the order rq_order_totals shows); a read counts as
ideal when, at the last poll finished before the read (for ro-txn: before the transaction's
first statement) was sent, one standby had already replayed every write the read must see (for
ro-txn: every write acknowledged in the database before the first statement, which is the
rule pgfresh applies, since a transaction's later reads are not known at its start). Polls
lag the standbys by up to --poll-ms plus a round trip, so the ideal is a slight underestimate.

Phases: `recency` (defaults: recent-access routing on) where the expected miss count is 0, and
`control` (enable_recent_access_routing = false) which shows the check does see stale reads.

Usage: bench/routing-quality.py [-d CLUSTER_DIR] [--seconds 20] [--delay-ms 300] [--no-control]
Exit status 1 when the recency phase had a read-after-write miss or a failed session, or
when the control phase found no miss in a workload that reads just-written rows.
Needs a release build of pgfresh (cargo build --release -p pgfresh) and PostgreSQL binaries.
Python standard library only: the client speaks the PostgreSQL wire protocol (trust auth).
"""

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from pgwire import Conn, PgError, load_env, metrics, node_sql  # noqa: E402


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_until(what, deadline_s, check, interval=0.1):
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval)
    raise RuntimeError(f"timed out waiting for {what}")


class StatusSampler(threading.Thread):
    """Polls GET /v1/status while the workload runs: per standby, the largest lag seen and
    how many samples found it outside the read pool, by reason."""

    def __init__(self, admin_port, interval=0.25):
        super().__init__(daemon=True)
        self.url = f"http://127.0.0.1:{admin_port}/v1/status"
        self.interval = interval
        self.done = threading.Event()
        self.samples = 0
        self.nodes = {}

    def run(self):
        while not self.done.is_set():
            try:
                status = json.loads(urllib.request.urlopen(self.url, timeout=2).read())
            except (OSError, ValueError):
                status = None
            if status:
                self.samples += 1
                for n in status.get("nodes", []):
                    if n.get("role") == "primary":
                        continue
                    d = self.nodes.setdefault(n["name"], {"max_lag_ms": 0, "max_lag_bytes": 0, "out_of_pool": {}})
                    d["max_lag_ms"] = max(d["max_lag_ms"], n.get("lag_ms") or 0)
                    d["max_lag_bytes"] = max(d["max_lag_bytes"], n.get("lag_bytes") or 0)
                    if not n.get("in_pool", True):
                        why = n.get("not_in_pool_reason") or "?"
                        d["out_of_pool"][why] = d["out_of_pool"].get(why, 0) + 1
            self.done.wait(self.interval)

    def result(self):
        return {"samples": self.samples, "standbys": self.nodes}


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.data = {}

    def add(self, workload, key, n=1):
        with self.lock:
            d = self.data.setdefault(workload, {})
            d[key] = d.get(key, 0) + n


def classify_port(port, env):
    port = int(port)
    if port == int(env["PRIMARY_PORT"]):
        return "primary"
    if port in (int(env["STANDBY1_PORT"]), int(env["STANDBY2_PORT"])):
        return "replica"
    return "unknown"


class ReplayWatcher(threading.Thread):
    """Polls every standby directly (not through pgfresh) with `sql` every `interval`
    seconds and keeps, per standby, `parse(rows)` of the newest answer. Used to count the
    reads a standby could have served fresh at the moment they were issued."""

    def __init__(self, env, sql, parse, interval):
        super().__init__(daemon=True)
        self.ports = [int(env["STANDBY1_PORT"]), int(env["STANDBY2_PORT"])]
        self.sql, self.parse, self.interval = sql, parse, interval
        self.lock = threading.Lock()
        self.latest = {}
        self.done = threading.Event()
        self.polls = 0
        self.ready = threading.Event()

    def run(self):
        conns = {p: Conn("127.0.0.1", p, "postgres", "app", timeout=10) for p in self.ports}
        try:
            while not self.done.is_set():
                for p, c in conns.items():
                    value = self.parse(c.query(self.sql))
                    with self.lock:
                        self.latest[p] = value
                self.polls += 1
                self.ready.set()
                self.done.wait(self.interval)
        finally:
            self.ready.set()
            for c in conns.values():
                c.close()

    def snapshot(self):
        """What each standby had replayed at the last poll that finished."""
        with self.lock:
            return list(self.latest.values())


def run_workload(env, proxy_port, seconds, stats, args, phase_tag, slot):
    stop_at = time.monotonic() + seconds
    errors_seen = []

    def record_read(workload, rows, expect_row):
        if not rows:
            stats.add(workload, "miss" if expect_row else "empty")
            return
        stats.add(workload, classify_port(rows[0][-1], env))

    def guarded(workload, body):
        try:
            body()
        except Exception as e:  # a failed session is reported, not hidden
            stats.add(workload, "error")
            errors_seen.append(f"{workload}: {e}")

    def same_session(idx):
        c = Conn("127.0.0.1", proxy_port, "app", "app")
        n = 0
        while time.monotonic() < stop_at:
            n += 1
            rid = (phase_tag * 1000 + idx) * 10_000_000 + n
            c.query(f"INSERT INTO rq_items (id, writer) VALUES ({rid}, {idx})")
            rows = c.query(f"SELECT id, inet_server_port() FROM rq_items WHERE id = {rid}")
            record_read("same-session", rows, True)
        c.close()

    def cross_session(idx):
        w = Conn("127.0.0.1", proxy_port, "app", "app")
        r = Conn("127.0.0.1", proxy_port, "app", "app")
        n = 0
        while time.monotonic() < stop_at:
            n += 1
            rid = (phase_tag * 1000 + idx) * 10_000_000 + n
            if n % 2:
                w.query(f"INSERT INTO rq_cross (id, writer) VALUES ({rid}, {idx})")
            else:
                w.query("BEGIN")
                w.query(f"INSERT INTO rq_cross (id, writer) VALUES ({rid}, {idx})")
                w.query("COMMIT")
            rows = r.query(f"SELECT id, inet_server_port() FROM rq_cross WHERE id = {rid}")
            record_read("cross-session", rows, True)
        w.close()
        r.close()

    def cold(idx):
        c = Conn("127.0.0.1", proxy_port, "app", "app")
        rng = random.Random(idx)
        while time.monotonic() < stop_at:
            k = rng.randint(1, args.cold_rows)
            rows = c.query(f"SELECT v, inet_server_port() FROM rq_cold WHERE id = {k}")
            record_read("cold", rows, True)
        c.close()

    # ro-txn: the newest acknowledged id per writer, published after the acknowledgement.
    acked = {}
    acked_lock = threading.Lock()

    def ro_writer(idx, writers_started):
        c = Conn("127.0.0.1", proxy_port, "app", "app")
        rng = random.Random(1000 + idx)
        n = 0
        while time.monotonic() < stop_at:
            n += 1
            rid = (phase_tag * 1000 + idx) * 10_000_000 + n
            c.query(f"INSERT INTO rq_ro_a (id, writer) VALUES ({rid}, {idx})")
            with acked_lock:
                acked[idx] = rid
            writers_started.set()
            stats.add("ro-txn", "writes")
            pause = rng.uniform(0, 2 * args.ro_write_gap_ms / 1000.0)
            time.sleep(max(0.0, min(pause, stop_at - time.monotonic())))
        c.close()

    def ro_reader(idx, watcher, writers_started):
        c = Conn("127.0.0.1", proxy_port, "app", "app")
        rng = random.Random(2000 + idx)
        writers_started.wait(10)
        while time.monotonic() < stop_at:
            c.query("BEGIN READ ONLY")
            # The transaction's first statement is sent right after this snapshot: every
            # write acknowledged before it must be visible to every statement of it.
            with acked_lock:
                want = dict(acked)
            replayed = watcher.snapshot()
            ideal = any(all(s.get(w, 0) >= rid for w, rid in want.items()) for s in replayed)
            k = rng.randint(1, args.cold_rows)
            rows_b = c.query(f"SELECT v, inet_server_port() FROM rq_cold WHERE id = {k}")
            found = []
            for w, rid in sorted(want.items()):
                found.append(c.query(f"SELECT id, inet_server_port() FROM rq_ro_a WHERE id = {rid}"))
            c.query("COMMIT")
            stats.add("ro-txn", "txns")
            record_read("ro-txn", rows_b, True)
            for rows in found:
                record_read("ro-txn", rows, True)
            nodes = {r[0][-1] for r in [rows_b] + found if r}
            if len(nodes) > 1:
                stats.add("ro-txn", "split_txn")
            if ideal:
                stats.add("ro-txn", "ideal", 1 + len(found))
        c.close()

    def trigger_pair(idx, watcher):
        w = Conn("127.0.0.1", proxy_port, "app", "app")
        r = Conn("127.0.0.1", proxy_port, "app", "app")
        rng = random.Random(3000 + idx)
        customer = phase_tag * 1000 + idx
        n = 0
        while time.monotonic() < stop_at:
            n += 1
            oid = (phase_tag * 1000 + idx) * 10_000_000 + n
            amount = rng.randint(1, 500)
            ins = f"INSERT INTO rq_orders (id, customer, amount) VALUES ({oid}, {customer}, {amount})"
            if n % 2:
                w.query(ins)
            else:
                w.query("BEGIN")
                w.query(ins)
                w.query("COMMIT")
            replayed = watcher.snapshot()
            rows = r.query(f"SELECT last_order, inet_server_port() FROM rq_order_totals WHERE customer = {customer}")
            if rows and (rows[0][0] is None or int(rows[0][0]) < oid):
                rows = []  # the totals row is there but does not show this order yet
            record_read("trigger", rows, True)
            if any(s.get(customer, 0) >= oid for s in replayed):
                stats.add("trigger", "ideal")
        w.close()
        r.close()

    threads, watcher = [], None
    if slot == "mixed":
        for i in range(args.same_sessions):
            threads.append(threading.Thread(target=guarded, args=("same-session", lambda i=i: same_session(i))))
        for i in range(args.cross_pairs):
            threads.append(threading.Thread(target=guarded, args=("cross-session", lambda i=i: cross_session(100 + i))))
        for i in range(args.cold_sessions):
            threads.append(threading.Thread(target=guarded, args=("cold", lambda i=i: cold(i))))
    elif slot == "ro-txn":
        watcher = ReplayWatcher(env, "SELECT writer, max(id) FROM rq_ro_a GROUP BY writer",
                                lambda rows: {int(w): int(m) for w, m in rows}, args.poll_ms / 1000.0)
        started = threading.Event()
        for i in range(args.ro_writers):
            threads.append(threading.Thread(target=guarded, args=("ro-txn", lambda i=i: ro_writer(200 + i, started))))
        for i in range(args.ro_readers):
            threads.append(threading.Thread(target=guarded, args=("ro-txn", lambda i=i: ro_reader(i, watcher, started))))
    elif slot == "trigger":
        watcher = ReplayWatcher(env, "SELECT customer, last_order FROM rq_order_totals",
                                lambda rows: {int(c): int(o or 0) for c, o in rows}, args.poll_ms / 1000.0)
        for i in range(args.trigger_pairs):
            threads.append(threading.Thread(target=guarded, args=("trigger", lambda i=i: trigger_pair(300 + i, watcher))))
    if watcher:
        watcher.start()
        watcher.ready.wait(10)
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if watcher:
        watcher.done.set()
        watcher.join()
        stats.add(slot, "replay_polls", watcher.polls)
    return errors_seen


def write_conf(path, env, port, admin, recency):
    with open(path, "w") as f:
        f.write(f"""[proxy]
listen = "127.0.0.1:{port}"
admin_listen = "127.0.0.1:{admin}"
log_level = "warn"

[monitor]
user = "postgres"
password = ""
database = "postgres"

[routing]
enable_recent_access_routing = {"true" if recency else "false"}

""")
        for name, key in (("pg0", "PRIMARY_PORT"), ("pg1", "STANDBY1_PORT"), ("pg2", "STANDBY2_PORT")):
            f.write(f'[[nodes]]\nname = "{name}"\nhost = "127.0.0.1"\nport = {env[key]}\n\n')
        f.write('[[users]]\nname = "app"\nauth = "trust"\n')


def run_phase(env, args, phase, recency, workdir, phase_tag):
    port, admin = free_port(), free_port()
    conf = os.path.join(workdir, f"{phase}.toml")
    write_conf(conf, env, port, admin, recency)
    log_path = os.path.join(workdir, f"{phase}.pgfresh.log")
    log = open(log_path, "w")
    proc = subprocess.Popen([args.pgfresh, "run", "-c", conf], stdout=log, stderr=subprocess.STDOUT)
    try:
        def replica_read():
            try:
                c = Conn("127.0.0.1", port, "app", "app", timeout=5)
                try:
                    rows = c.query("SELECT inet_server_port() FROM rq_cold LIMIT 1")
                    return classify_port(rows[0][0], env) == "replica"
                finally:
                    c.close()
            except (OSError, PgError):
                return False
        # A read of a table, not a bare SELECT: relation-free reads skip the recency check, so
        # only a table read proves the cold-start window (every read hot) is over.
        wait_until("pgfresh to serve table reads from a standby", 60, replica_read, 0.2)
        stats = Stats()
        errors, slots = [], {}
        for i, slot in enumerate(SLOTS):
            if i:
                # Let the standbys replay the previous slot's writes: each slot's ideal
                # counts only its own writes.
                time.sleep(2 * args.delay_ms / 1000.0 + 0.5)
            before = metrics(admin)
            sampler = StatusSampler(admin)
            sampler.start()
            errors += run_workload(env, port, args.seconds, stats, args, phase_tag, slot)
            sampler.done.set()
            sampler.join()
            after = metrics(admin)
            routed = {k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before)}
            slots[slot] = {"routed_delta": {f"{t}/{r}": int(v) for (t, r), v in sorted(routed.items()) if v},
                           "status_samples": sampler.result()}
    finally:
        proc.send_signal(2)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    return {"phase": phase, "recent_access_routing": recency, "stats": stats.data,
            "slots": slots, "errors": errors[:20], "pgfresh_log": log_path}


SLOTS = ("mixed", "ro-txn", "trigger")
WORKLOADS = ("same-session", "cross-session", "cold", "ro-txn", "trigger")
# Workloads whose reads look for a row written just before: the control phase must miss some.
FRESH_READS = ("same-session", "cross-session", "ro-txn", "trigger")


def print_report(result):
    print(f"\n== phase {result['phase']} (enable_recent_access_routing = "
          f"{str(result['recent_access_routing']).lower()})")
    print(f"{'workload':<14} {'reads':>7} {'replica':>8} {'primary':>8} {'offload':>8} {'ideal':>8} "
          f"{'misses':>7} {'errors':>7}")
    for wl in WORKLOADS:
        d = result["stats"].get(wl, {})
        rep, pri, miss, err = d.get("replica", 0), d.get("primary", 0), d.get("miss", 0), d.get("error", 0)
        reads = rep + pri + miss
        offload = f"{100.0 * (rep + miss) / reads:.1f}%" if reads else "-"
        ideal = f"{100.0 * d.get('ideal', 0) / reads:.1f}%" if reads and wl in ("ro-txn", "trigger") else "-"
        print(f"{wl:<14} {reads:>7} {rep:>8} {pri:>8} {offload:>8} {ideal:>8} {miss:>7} {err:>7}")
    ro = result["stats"].get("ro-txn", {})
    print(f"ro-txn: {ro.get('txns', 0)} read-only transactions, {ro.get('writes', 0)} writes, "
          f"{ro.get('split_txn', 0)} transactions whose reads came from two nodes; replay polls: "
          f"ro-txn {ro.get('replay_polls', 0)}, trigger {result['stats'].get('trigger', {}).get('replay_polls', 0)}")
    for slot, d in result["slots"].items():
        print(f"[{slot}] pgfresh_routed_total delta (target/reason): " + json.dumps(d["routed_delta"]))
        print(f"[{slot}] standby lag / out-of-pool samples from /v1/status: " + json.dumps(d["status_samples"]))
    for e in result["errors"]:
        print("  error: " + e)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-d", "--cluster-dir", help="running cluster from bench/cluster.sh (default: make one)")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--delay-ms", type=int, default=300)
    ap.add_argument("--same-sessions", type=int, default=4)
    ap.add_argument("--cross-pairs", type=int, default=2)
    ap.add_argument("--cold-sessions", type=int, default=2)
    ap.add_argument("--cold-rows", type=int, default=10000)
    ap.add_argument("--ro-writers", type=int, default=1)
    ap.add_argument("--ro-readers", type=int, default=3)
    ap.add_argument("--ro-write-gap-ms", type=int, default=1000,
                    help="mean pause between a ro-txn writer's INSERTs (uniform 0 to twice this)")
    ap.add_argument("--trigger-pairs", type=int, default=2)
    ap.add_argument("--poll-ms", type=int, default=10, help="how often the ideal-offload watcher polls the standbys")
    ap.add_argument("--no-control", action="store_true", help="skip the recency-off control phase")
    ap.add_argument("--pgfresh", default=os.path.join(ROOT, "target", "release", "pgfresh"))
    ap.add_argument("--json", help="also write the results as JSON to this file")
    args = ap.parse_args()

    own = args.cluster_dir is None
    if own:
        out = subprocess.run([os.path.join(HERE, "cluster.sh"), "start"], check=True,
                             capture_output=True, text=True).stdout
        print(out.strip())
        args.cluster_dir = next(l.split(": ", 1)[1] for l in out.splitlines() if l.startswith("cluster dir:"))
    env = load_env(args.cluster_dir)
    standbys = (env["STANDBY1_PORT"], env["STANDBY2_PORT"])
    workdir = tempfile.mkdtemp(prefix="pgfresh-rq.")
    results = []
    try:
        p = env["PRIMARY_PORT"]
        node_sql(env, p, "DROP TABLE IF EXISTS rq_items, rq_cross, rq_cold, rq_ro_a, rq_orders, rq_order_totals")
        node_sql(env, p, "DROP FUNCTION IF EXISTS rq_orders_total()")
        node_sql(env, p, "CREATE TABLE rq_items (id bigint PRIMARY KEY, writer int NOT NULL)")
        node_sql(env, p, "CREATE TABLE rq_cross (id bigint PRIMARY KEY, writer int NOT NULL)")
        node_sql(env, p, "CREATE TABLE rq_cold (id int PRIMARY KEY, v text NOT NULL)")
        node_sql(env, p, f"INSERT INTO rq_cold SELECT g, md5(g::text) FROM generate_series(1, {args.cold_rows}) g")
        node_sql(env, p, "CREATE TABLE rq_ro_a (id bigint PRIMARY KEY, writer int NOT NULL)")
        node_sql(env, p, "CREATE TABLE rq_orders (id bigint PRIMARY KEY, customer int NOT NULL, amount int NOT NULL)")
        node_sql(env, p, "CREATE TABLE rq_order_totals (customer int PRIMARY KEY, orders bigint NOT NULL, "
                         "total bigint NOT NULL, last_order bigint NOT NULL)")
        node_sql(env, p, """CREATE FUNCTION rq_orders_total() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO rq_order_totals AS t (customer, orders, total, last_order)
  VALUES (NEW.customer, 1, NEW.amount, NEW.id)
  ON CONFLICT (customer) DO UPDATE
    SET orders = t.orders + 1, total = t.total + EXCLUDED.total, last_order = EXCLUDED.last_order;
  RETURN NEW;
END
$$""")
        node_sql(env, p, "CREATE TRIGGER rq_orders_total AFTER INSERT ON rq_orders "
                         "FOR EACH ROW EXECUTE FUNCTION rq_orders_total()")
        node_sql(env, p, "GRANT ALL ON rq_items, rq_cross, rq_cold, rq_ro_a, rq_orders, rq_order_totals TO app")
        lsn = node_sql(env, p, "SELECT pg_current_wal_lsn()")
        for s in standbys:
            wait_until(f"standby {s} to replay the setup", 60,
                       lambda s=s: node_sql(env, s, f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn") == "t")
            node_sql(env, s, f"ALTER SYSTEM SET recovery_min_apply_delay = '{args.delay_ms}ms'", db="postgres")
            node_sql(env, s, "SELECT pg_reload_conf()", db="postgres")
        for s in standbys:
            wait_until(f"standby {s} to apply the delay setting", 30,
                       lambda s=s: node_sql(env, s, "SHOW recovery_min_apply_delay", db="postgres") == f"{args.delay_ms}ms")
        print(f"standbys {standbys} replay with recovery_min_apply_delay = {args.delay_ms}ms; "
              f"{args.seconds:g}s per slot ({', '.join(SLOTS)}), {len(SLOTS) * args.seconds:g}s per phase; load average {open('/proc/loadavg').read().split()[0]}")

        phases = [("recency", True)] + ([] if args.no_control else [("control", False)])
        for tag, (phase, recency) in enumerate(phases, start=1):
            r = run_phase(env, args, phase, recency, workdir, tag)
            r["loadavg_1m"] = float(open("/proc/loadavg").read().split()[0])
            results.append(r)
            print_report(r)
    finally:
        for s in standbys:
            try:
                node_sql(env, s, "ALTER SYSTEM RESET recovery_min_apply_delay", db="postgres")
                node_sql(env, s, "SELECT pg_reload_conf()", db="postgres")
            except subprocess.CalledProcessError:
                pass
        if own:
            subprocess.run([os.path.join(HERE, "cluster.sh"), "stop", args.cluster_dir], check=False,
                           capture_output=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    print(f"\nlogs: {workdir}")
    recency_misses = sum(d.get("miss", 0) for r in results if r["recent_access_routing"]
                         for d in r["stats"].values())
    recency_errors = sum(d.get("error", 0) for r in results if r["recent_access_routing"]
                         for d in r["stats"].values())
    blind = [f"{r['phase']}/{wl}" for r in results if not r["recent_access_routing"]
             for wl in FRESH_READS if not r["stats"].get(wl, {}).get("miss", 0)]
    if recency_misses or recency_errors:
        print(f"FAIL: recency phase had {recency_misses} misses and {recency_errors} failed sessions")
    if blind:
        print("FAIL: the control phase found no stale read in " + ", ".join(blind) + " (the check is blind)")
    return 1 if recency_misses or recency_errors or blind else 0


if __name__ == "__main__":
    sys.exit(main())
