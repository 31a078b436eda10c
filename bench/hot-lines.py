#!/usr/bin/env python3
"""The code a statement runs, by cache line and by function, from a callgrind profile
made with --dump-instr=yes (bench/statement-cost.sh with CALLGRIND_OPTS=--dump-instr=yes):

    bench/hot-lines.py OUT/callgrind.out.1 STATEMENTS [PER_STATEMENT]

A 64-byte line of code is hot when one of its instructions ran at least PER_STATEMENT
times a statement (default 0.5). Prints how many lines are hot (what the statement loop
asks of the 32 KiB first-level instruction cache), the bytes of hot instructions among
them (an instruction's size taken as the distance to the next one the profile lists, at
most 15), and both by function: a function whose hot lines hold few hot bytes has its
hot path spread among code that seldom runs.
"""
import collections
import re
import sys


def main():
    path, stmts = sys.argv[1], int(sys.argv[2])
    thresh = float(sys.argv[3]) if len(sys.argv) > 3 else 0.5
    names = {}

    def name(kind, v):
        m = re.match(r"\((\d+)\)(?: (.*))?", v)
        if not m:
            return v
        k = (kind, m.group(1))
        if m.group(2):
            names[k] = m.group(2)
        return names.get(k, "?")

    fn = ob = None
    addr = 0
    skip = False
    count = collections.Counter()
    fn_of = {}
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            if line[0].isalpha():
                if line.startswith("fn="):
                    fn = name("fn", line[3:])
                elif line.startswith("ob="):
                    ob = name("ob", line[3:])
                elif line.startswith("cfn="):
                    name("fn", line[4:])
                elif line.startswith("cob="):
                    name("ob", line[4:])
                elif line.startswith("calls="):
                    # The next cost line is the call's inclusive cost, not an instruction's.
                    skip = True
                continue
            parts = line.split()
            a = parts[0]
            if a.startswith("0x"):
                addr = int(a, 16)
            elif a.startswith("+"):
                addr += int(a[1:])
            elif a.startswith("-"):
                addr -= int(a[1:])
            elif a != "*":
                continue
            if skip:
                skip = False
                continue
            key = (ob, addr)
            count[key] += int(parts[-1]) if len(parts) >= 3 else 0
            fn_of[key] = fn

    hot_max = collections.defaultdict(int)
    by_line = collections.defaultdict(collections.Counter)
    for (o, a), ir in count.items():
        hot_max[(o, a >> 6)] = max(hot_max[(o, a >> 6)], ir)
        by_line[(o, a >> 6)][fn_of[(o, a)]] += ir
    hot = [l for l, m in hot_max.items() if m >= thresh * stmts]
    lines_of = collections.Counter(by_line[l].most_common(1)[0][0] for l in hot)
    instr_of = collections.Counter()
    for key, ir in count.items():
        instr_of[fn_of[key]] += ir
    hot_bytes = collections.Counter()
    addrs = sorted(count)
    for i, (o, a) in enumerate(addrs):
        if count[(o, a)] < thresh * stmts:
            continue
        nxt = addrs[i + 1] if i + 1 < len(addrs) else None
        size = nxt[1] - a if nxt and nxt[0] == o and 0 < nxt[1] - a <= 15 else 4
        hot_bytes[fn_of[(o, a)]] += size
    print(f"hot lines (>= {thresh} a statement): {len(hot)} = {len(hot) * 64} bytes; "
          f"hot instructions: {sum(hot_bytes.values())} bytes")
    print("bytes in hot lines / of hot instructions / instructions a statement / function")
    for f, n in lines_of.most_common(40):
        print(f"{n * 64:6d} {hot_bytes[f]:6d} {instr_of[f] / stmts:7.0f}  {f[:120]}")


if __name__ == "__main__":
    main()
