#!/usr/bin/env python3
"""Where two profiled runs of a proxy differ, a statement at a time.

    bench/perf-diff.py A.perf.data STATEMENTS_A B.perf.data STATEMENTS_B [N]

Each perf.data is a `perf record -e cpu-clock` of the proxy's process over a run that
served STATEMENTS statements (bench/mix-parts.sh -r writes both, NAME.ROUND.perf.data and
NAME.ROUND.statements). Prints each run's CPU a statement as perf sampled it, then the N
functions (default 30) whose time a statement grew most from B to A: microseconds a
statement in A, in B, the difference, [k] for the kernel or [.] for user space, and the
function.
"""
import re
import subprocess
import sys


def profile(path, statements):
    """{function: (microseconds a statement, k or .)} and the total."""
    out = subprocess.run(
        ["perf", "report", "-i", path, "--stdio", "--no-children", "--sort", "sym",
         "-g", "none", "--percent-limit", "0.01"],
        capture_output=True, text=True, check=True).stdout
    total_ns = None
    funcs = {}
    for line in out.splitlines():
        m = re.match(r"# Event count \(approx\.\): (\d+)", line)
        if m:
            total_ns = int(m.group(1))
            continue
        m = re.match(r"\s+([\d.]+)%\s+\[(.)\]\s+(.*\S)", line)
        if m and total_ns is not None:
            us = float(m.group(1)) / 100 * total_ns / 1000 / statements
            name = m.group(3)
            prev = funcs.get(name, (0.0, m.group(2)))[0]
            funcs[name] = (prev + us, m.group(2))
    if total_ns is None:
        sys.exit(f"{path}: no samples")
    return funcs, total_ns / 1000 / statements


def main():
    if len(sys.argv) not in (5, 6):
        sys.exit(__doc__)
    a, total_a = profile(sys.argv[1], int(sys.argv[2]))
    b, total_b = profile(sys.argv[3], int(sys.argv[4]))
    n = int(sys.argv[5]) if len(sys.argv) == 6 else 30
    print(f"sampled CPU a statement: {total_a:.2f} us against {total_b:.2f} us")
    kernel = [sum(v for v, k in p.values() if k == "k") for p in (a, b)]
    print(f"of it in the kernel: {kernel[0]:.2f} us against {kernel[1]:.2f} us")
    rows = []
    for name in set(a) | set(b):
        ua, kind = a.get(name, (0.0, None))
        ub, kind_b = b.get(name, (0.0, None))
        rows.append((ua - ub, ua, ub, kind or kind_b, name))
    rows.sort(reverse=True)
    print("    A       B    A - B     function")
    for diff, ua, ub, kind, name in rows[:n]:
        print(f"{ua:6.2f}  {ub:6.2f}  {diff:+6.2f}  [{kind}] {name[:100]}")


if __name__ == "__main__":
    main()
