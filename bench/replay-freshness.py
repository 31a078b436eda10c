#!/usr/bin/env python3
"""How fresh are the replay positions pgfresh routes by, and how many reads of a constantly
written table could a replica have served? Run by bench/replay-freshness.sh.

    bench/replay-freshness.py -d CLUSTER_DIR --port PORT --admin ADMIN --mix FILE [options]

While pgbench runs FILE through pgfresh (PORT), three kinds of samples are taken:

  true replay   each standby's own pg_last_wal_replay_lsn(), asked directly every
                --sample-ms (the time before and after each answer is kept)
  known replay  what pgfresh believes each standby replayed (GET /v1/status on ADMIN), every
                --status-ms
  commits       afterwards, every COMMIT record the primary wrote during the run, with its
                end position and commit time (pg_waldump over the primary's pg_wal)

Staleness of a known position K seen at time t: how long before t the standby had already
replayed past K. The standby passed K after the last sample that still showed K or less
began and no later than the first sample past K ended; the upper bound (reported) uses the
former, so sampling makes the figure larger, never smaller. 0 when the standby had not
moved past K by t.

Ideal offload: the share of the run's time (reads are spread evenly over it) at which some
standby had replayed every commit written before that moment. A commit counts from its
commit time, which precedes its acknowledgement, and a standby's position from the end of
the sample that read it, so the ideal is a slight underestimate. Offload is pgfresh's own count (pgfresh_routed_total): reads sent to a replica over all reads.
"""
import argparse
import bisect
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from pgwire import Conn, load_env, metrics, node_sql  # noqa: E402


def lsn_int(text):
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


class ReplaySampler(threading.Thread):
    """A standby's own replay position, asked every `interval` seconds."""

    def __init__(self, port, interval):
        super().__init__(daemon=True)
        self.port, self.interval = port, interval
        self.samples = []  # (t_start, t_end, lsn)
        self.done = threading.Event()

    def run(self):
        c = Conn("127.0.0.1", self.port, "postgres", "app", timeout=10, application_name="replay-freshness")
        try:
            while not self.done.is_set():
                t0 = time.time()
                rows = c.query("SELECT pg_last_wal_replay_lsn()")
                t1 = time.time()
                self.samples.append((t0, t1, lsn_int(rows[0][0])))
                if self.interval > 0:
                    time.sleep(self.interval)
        finally:
            c.close()


class KnownSampler(threading.Thread):
    """pgfresh's known replay position of each standby, from /v1/status."""

    def __init__(self, admin, names, interval):
        super().__init__(daemon=True)
        self.url = f"http://127.0.0.1:{admin}/v1/status"
        self.names, self.interval = names, interval
        self.samples = {n: [] for n in names}  # name -> [(t_after, lsn)]
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set():
            try:
                status = json.loads(urllib.request.urlopen(self.url, timeout=2).read())
            except (OSError, ValueError):
                continue
            t = time.time()
            for n in status.get("nodes", []):
                if n.get("name") in self.samples and n.get("replay_lsn"):
                    self.samples[n["name"]].append((t, lsn_int(n["replay_lsn"])))
            time.sleep(self.interval)


COMMIT_RE = re.compile(
    r"len \(rec/tot\):\s*\d+/\s*(\d+), tx:\s*\d+, lsn: ([0-9A-F]+/[0-9A-F]+), .*desc: COMMIT "
    r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?) UTC")


def commits(env, start, end):
    """(commit time, end position) of every COMMIT record between two positions."""
    wal = os.path.join(env["BENCH_DIR"], "node0", "pg_wal")
    out = subprocess.run(
        [os.path.join(env["PG_BINDIR"], "pg_waldump"), "-p", wal, "-s", start, "-e", end, "-r", "Transaction"],
        capture_output=True, text=True, env={**os.environ, "TZ": "UTC"}, check=False).stdout
    result = []
    for m in COMMIT_RE.finditer(out):
        tot, lsn, ts = int(m.group(1)), lsn_int(m.group(2)), m.group(3)
        secs = time.mktime(time.strptime(ts[:19], "%Y-%m-%d %H:%M:%S")) - time.timezone
        frac = float("0" + ts[19:]) if len(ts) > 19 else 0.0
        result.append((secs + frac, lsn + tot))
    result.sort()
    return result


def staleness(known, replay):
    """Upper bounds (seconds) of the age of each known position, see the module doc."""
    values = [s[2] for s in replay]
    out = []
    for t, k in known:
        i = bisect.bisect_right(values, k)  # replay[i] is the first sample past k
        if i == 0:
            out.append(0.0)
            continue
        last_at_or_below = replay[i - 1][0]
        out.append(max(0.0, t - last_at_or_below))
    return out


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def ideal_share(grid, commit_list, series, pick):
    """Share of grid instants at which some standby's position (from `series`, as chosen by
    `pick`) covers every commit made before the instant."""
    times = [c[0] for c in commit_list]
    prefix_max, m = [], 0
    for _, e in commit_list:
        m = max(m, e)
        prefix_max.append(m)
    keyed = [([pick(s)[0] for s in ser], [pick(s)[1] for s in ser]) for ser in series]
    good = 0
    for t in grid:
        i = bisect.bisect_right(times, t)
        need = prefix_max[i - 1] if i else 0
        best = 0
        for ts, vs in keyed:
            j = bisect.bisect_right(ts, t)
            if j:
                best = max(best, vs[j - 1])
        if best >= need:
            good += 1
    return good / len(grid) if grid else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-d", "--cluster-dir", required=True)
    ap.add_argument("--port", type=int, required=True, help="pgfresh's client port")
    ap.add_argument("--admin", type=int, required=True, help="pgfresh's admin port")
    ap.add_argument("--mix", required=True, help="pgbench script to run through pgfresh")
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--rate", type=int, default=0,
                    help="pgbench transactions a second (-R); 0: as fast as they go")
    ap.add_argument("--sample-ms", type=float, default=1.0, help="pause between two direct replay samples")
    ap.add_argument("--status-ms", type=float, default=2.0, help="pause between two /v1/status samples")
    ap.add_argument("--label", default="")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()

    env = load_env(args.cluster_dir)
    standbys = {"pg1": int(env["STANDBY1_PORT"]), "pg2": int(env["STANDBY2_PORT"])}
    start = node_sql(env, env["PRIMARY_PORT"], "SELECT pg_current_wal_lsn()")
    before = metrics(args.admin)
    replay = {n: ReplaySampler(p, args.sample_ms / 1000.0) for n, p in standbys.items()}
    known = KnownSampler(args.admin, list(standbys), args.status_ms / 1000.0)
    for s in list(replay.values()) + [known]:
        s.start()
    t0 = time.time()
    bench = subprocess.run(
        [os.path.join(env["PG_BINDIR"], "pgbench"), "-n", "-c", str(args.clients), "-j", "2",
         "-T", str(args.seconds), "-M", "extended", "-f", args.mix]
        + (["-R", str(args.rate)] if args.rate else [])
        + ["-h", "127.0.0.1", "-p", str(args.port), "-U", "app", "app"],
        capture_output=True, text=True, check=False)
    t1 = time.time()
    for s in list(replay.values()) + [known]:
        s.done.set()
    for s in list(replay.values()) + [known]:
        s.join(10)
    after = metrics(args.admin)
    end = node_sql(env, env["PRIMARY_PORT"], "SELECT pg_current_wal_lsn()")
    if bench.returncode != 0:
        print(bench.stdout, bench.stderr, file=sys.stderr)
        sys.exit("pgbench failed")
    tps = float(re.search(r"tps = ([0-9.]+)", bench.stdout).group(1))

    lo, hi = t0 + 0.5, t1 - 0.5
    report = {"label": args.label, "seconds": args.seconds, "clients": args.clients, "tps": tps}
    ages = []
    for n in standbys:
        ks = [(t, k) for t, k in known.samples[n] if lo <= t <= hi]
        a = staleness(ks, replay[n].samples)
        ages += a
        report[f"{n}_known_samples"] = len(ks)
        report[f"{n}_true_samples"] = len(replay[n].samples)
    report["staleness_ms"] = {p: round(1000 * percentile(ages, p), 2) for p in (50, 90, 99, 100)}
    report["staleness_within_10ms"] = round(sum(1 for a in ages if a <= 0.010) / len(ages), 4) if ages else None

    commit_list = commits(env, start, end)
    grid = [lo + i * 0.001 for i in range(int((hi - lo) / 0.001))]
    report["commits"] = len(commit_list)
    report["ideal_offload"] = round(ideal_share(
        grid, commit_list, [replay[n].samples for n in standbys], lambda s: (s[1], s[2])), 4)
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before)}
    reads = sum(v for (target, reason), v in delta.items() if reason != "write")
    to_replica = sum(v for (target, _), v in delta.items() if target == "replica")
    report["reads"] = int(reads)
    report["offload"] = round(to_replica / reads, 4) if reads else None
    report["offload_of_ideal"] = (round(report["offload"] / report["ideal_offload"], 3)
                                  if report["ideal_offload"] else None)
    report["routed"] = {f"{t}/{r}": int(v) for (t, r), v in sorted(delta.items()) if v}
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
