#!/usr/bin/env python3
"""Routing-quality benchmark: does pgfresh offload reads without ever serving a stale one?

Both standbys replay WAL with `recovery_min_apply_delay` (default 300 ms), so any read of a
just-written row that reaches a standby misses it. Through pgfresh, for a fixed duration:

  same-session  sessions that INSERT a row with a unique id, then SELECT it back at once
  cross-session writer/reader pairs: the writer INSERTs (alternately autocommit and inside
                BEGIN ... COMMIT), then a *different* connection SELECTs the row at once
  cold          sessions that read random rows of a table nobody writes

Every read also returns `inet_server_port()`, so the script knows which node served it. It
reports, per workload, reads served by replicas vs the primary, read-after-write misses (row
not found), errors, and the delta of pgfresh's `pgfresh_routed_total{target,reason}` counters.

Phases: `recency` (defaults: recent-access routing on) where the expected miss count is 0, and
`control` (enable_recent_access_routing = false) which shows the check does see stale reads.

Usage: bench/routing-quality.py [-d CLUSTER_DIR] [--seconds 20] [--delay-ms 300] [--no-control]
Exit status 1 when the recency phase had a read-after-write miss or a failed session.
Needs a release build of pgfresh (cargo build --release -p pgfresh) and PostgreSQL binaries.
Python standard library only: the client speaks the PostgreSQL wire protocol (trust auth).
"""

import argparse
import json
import os
import random
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class PgError(Exception):
    """An ErrorResponse from the server, or a protocol problem."""


class Conn:
    """A minimal PostgreSQL protocol 3.0 client: trust auth, simple query, text results."""

    def __init__(self, host, port, user, database, timeout=30.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        params = b"".join(
            k.encode() + b"\0" + v.encode() + b"\0"
            for k, v in (("user", user), ("database", database), ("application_name", "routing-quality"))
        ) + b"\0"
        body = struct.pack("!I", 196608) + params
        self.sock.sendall(struct.pack("!I", len(body) + 4) + body)
        while True:
            kind, payload = self._read()
            if kind == b"R":
                (code,) = struct.unpack("!I", payload[:4])
                if code != 0:
                    raise PgError(f"authentication method {code} requested; this client supports trust only")
            elif kind == b"E":
                raise PgError(self._error_text(payload))
            elif kind == b"Z":
                return

    def _recv_exact(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise PgError("connection closed by the server")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _read(self):
        head = self._recv_exact(5)
        kind = head[:1]
        (length,) = struct.unpack("!I", head[1:])
        return kind, self._recv_exact(length - 4)

    @staticmethod
    def _error_text(payload):
        fields = {}
        for part in payload.split(b"\0"):
            if part:
                fields[chr(part[0])] = part[1:].decode(errors="replace")
        return f"{fields.get('S', 'ERROR')} {fields.get('C', '?????')}: {fields.get('M', '')}"

    def query(self, sql):
        """Runs one simple query; returns the rows of its last result (lists of str/None)."""
        data = sql.encode() + b"\0"
        self.sock.sendall(b"Q" + struct.pack("!I", len(data) + 4) + data)
        rows, error = [], None
        while True:
            kind, payload = self._read()
            if kind == b"T":
                rows = []
            elif kind == b"D":
                (ncols,) = struct.unpack("!H", payload[:2])
                pos, row = 2, []
                for _ in range(ncols):
                    (n,) = struct.unpack("!i", payload[pos:pos + 4])
                    pos += 4
                    if n < 0:
                        row.append(None)
                    else:
                        row.append(payload[pos:pos + n].decode())
                        pos += n
                rows.append(row)
            elif kind == b"E":
                error = self._error_text(payload)
            elif kind == b"Z":
                if error:
                    raise PgError(error)
                return rows

    def close(self):
        try:
            self.sock.sendall(b"X\0\0\0\4")
        except OSError:
            pass
        self.sock.close()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def load_env(cluster_dir):
    env = {}
    with open(os.path.join(cluster_dir, "cluster.env")) as f:
        for line in f:
            if "=" in line:
                k, v = line.strip().split("=", 1)
                env[k] = v
    return env


def node_sql(env, port, sql, db="app"):
    """Runs SQL as the superuser on one node over its Unix socket (psql)."""
    cmd = [os.path.join(env["PG_BINDIR"], "psql"), "-XAtq", "-v", "ON_ERROR_STOP=1",
           "-h", env["PG_SOCKDIR"], "-p", str(port), "-U", "postgres", "-d", db, "-c", sql]
    if os.geteuid() == 0:
        cmd = ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"] + cmd
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


def wait_until(what, deadline_s, check, interval=0.1):
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval)
    raise RuntimeError(f"timed out waiting for {what}")


def metrics(admin_port):
    """pgfresh_routed_total counters as {(target, reason): value}."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if not line.startswith("pgfresh_routed_total{"):
            continue
        labels_part, value = line[len("pgfresh_routed_total{"):].rsplit("} ", 1)
        labels = {}
        for item in labels_part.split(","):
            if "=" in item:
                k, v = item.split("=", 1)
                labels[k.strip()] = v.strip().strip('"')
        out[(labels.get("target", "?"), labels.get("reason", "?"))] = float(value)
    return out


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


def run_workload(env, proxy_port, seconds, stats, args, phase_tag):
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

    threads = []
    for i in range(args.same_sessions):
        threads.append(threading.Thread(target=guarded, args=("same-session", lambda i=i: same_session(i))))
    for i in range(args.cross_pairs):
        threads.append(threading.Thread(target=guarded, args=("cross-session", lambda i=i: cross_session(100 + i))))
    for i in range(args.cold_sessions):
        threads.append(threading.Thread(target=guarded, args=("cold", lambda i=i: cold(i))))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
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
        before = metrics(admin)
        stats = Stats()
        sampler = StatusSampler(admin)
        sampler.start()
        errors = run_workload(env, port, args.seconds, stats, args, phase_tag)
        sampler.done.set()
        sampler.join()
        after = metrics(admin)
    finally:
        proc.send_signal(2)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    routed = {k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before)}
    routed = {f"{t}/{r}": int(v) for (t, r), v in sorted(routed.items()) if v}
    return {"phase": phase, "recent_access_routing": recency, "stats": stats.data,
            "routed_delta": routed, "status_samples": sampler.result(), "errors": errors[:20], "pgfresh_log": log_path}


def print_report(result):
    print(f"\n== phase {result['phase']} (enable_recent_access_routing = "
          f"{str(result['recent_access_routing']).lower()})")
    print(f"{'workload':<14} {'reads':>7} {'replica':>8} {'primary':>8} {'offload':>8} {'misses':>7} {'errors':>7}")
    for wl in ("same-session", "cross-session", "cold"):
        d = result["stats"].get(wl, {})
        rep, pri, miss, err = d.get("replica", 0), d.get("primary", 0), d.get("miss", 0), d.get("error", 0)
        reads = rep + pri + miss
        offload = f"{100.0 * (rep + miss) / reads:.1f}%" if reads else "-"
        print(f"{wl:<14} {reads:>7} {rep:>8} {pri:>8} {offload:>8} {miss:>7} {err:>7}")
    print("pgfresh_routed_total delta (target/reason): " + json.dumps(result["routed_delta"]))
    print("standby lag / out-of-pool samples from /v1/status: " + json.dumps(result["status_samples"]))
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
        node_sql(env, p, "DROP TABLE IF EXISTS rq_items, rq_cross, rq_cold")
        node_sql(env, p, "CREATE TABLE rq_items (id bigint PRIMARY KEY, writer int NOT NULL)")
        node_sql(env, p, "CREATE TABLE rq_cross (id bigint PRIMARY KEY, writer int NOT NULL)")
        node_sql(env, p, "CREATE TABLE rq_cold (id int PRIMARY KEY, v text NOT NULL)")
        node_sql(env, p, f"INSERT INTO rq_cold SELECT g, md5(g::text) FROM generate_series(1, {args.cold_rows}) g")
        node_sql(env, p, "GRANT ALL ON rq_items, rq_cross, rq_cold TO app")
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
              f"{args.seconds:g}s per phase; load average {open('/proc/loadavg').read().split()[0]}")

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
    return 1 if recency_misses or recency_errors else 0


if __name__ == "__main__":
    sys.exit(main())
