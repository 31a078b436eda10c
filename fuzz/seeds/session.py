#!/usr/bin/env python3
"""Writes the seed inputs of the `session` fuzz target (format: fuzz/src/script.rs).

Usage: python3 seeds/session.py [DIR]   (default: seeds/session next to this script)
"""

import os
import sys

# Flags (first byte).
TRANSACTION_POOL, SSL_REQUEST, MD5, TERMINATE = 1, 2, 4, 8
NAMES = {"": 0, "a": 1, "b": 2}


def blob(b):
    assert len(b) < 128, "lengths from 128 up pick canned statements"
    return bytes([len(b)]) + b


def sql(text):
    return blob(text.encode())


def query(text):
    return bytes([0]) + sql(text)


def parse(name, text, types=0):
    return bytes([1, NAMES[name]]) + sql(text) + bytes([types])


def bind(portal, statement, params=(), formats=0):
    out = bytes([2, NAMES[portal], NAMES[statement], len(params)])
    for p in params:
        out += bytes([255]) if p is None else blob(p)
    return out + bytes([formats])


def describe(kind, name):
    return bytes([3, 0 if kind == "S" else 1, NAMES[name]])


def execute(portal, max_rows=0):
    return bytes([4, NAMES[portal], max_rows])


def close(kind, name):
    return bytes([5, 0 if kind == "S" else 1, NAMES[name]])


SYNC, FLUSH, COPY_DONE, TERMINATE_MSG, READ = b"\x06", b"\x07", b"\x09", b"\x0b", b"\x0f"


def copy_data(b):
    return bytes([8]) + blob(b)


def copy_fail(text):
    return bytes([10]) + sql(text)


def raw(b):
    return bytes([12]) + blob(b)


def cancel(right_key=True):
    return bytes([13, 0 if right_key else 1])


def send(chunk):
    return bytes([14, chunk])


SEEDS = {
    "simple": [0, query("SELECT 1"), READ, query("SELECT 'a' FROM t; SELECT 2"), READ],
    "extended": [
        0,
        parse("", "SELECT $1"), bind("", "", [b"7"]), describe("P", ""), execute(""), SYNC, READ,
    ],
    "named_binary": [
        TRANSACTION_POOL,
        parse("a", "SELECT $1, $2", 2), describe("S", "a"), SYNC, READ,
        bind("b", "a", [b"1", None], 1), execute("b"), close("P", "b"), close("S", "a"), SYNC, READ,
    ],
    "flush_then_sync": [
        0,
        parse("a", "SELECT 'x'"), describe("S", "a"), FLUSH, READ,
        bind("", "a"), execute(""), SYNC, READ,
    ],
    "suspended_portal": [
        0,
        query("BEGIN"), parse("", "SELECT generate_series(1, 10)"), bind("a", ""),
        execute("a", 3), execute("a", 3), execute("a"), SYNC, query("COMMIT"), READ,
    ],
    "copy_in": [
        0,
        query("COPY t FROM STDIN"), READ, copy_data(b"1\n2\n"), send(3), COPY_DONE, READ,
        query("COPY t FROM STDIN"), READ, copy_fail("stop"), READ,
    ],
    "copy_extended": [
        TRANSACTION_POOL,
        parse("", "COPY t FROM STDIN"), bind("", ""), execute(""), SYNC, READ,
        copy_data(b"1\n"), COPY_DONE, SYNC, READ, query("COPY t TO STDOUT"), READ,
    ],
    "transaction_with_error": [
        TRANSACTION_POOL,
        query("BEGIN"), query("INSERT INTO t VALUES (1)"), query("SELECT fail"),
        query("SELECT 1"), READ, query("ROLLBACK"), query("SELECT a FROM t"), READ,
    ],
    "extended_error": [
        0,
        parse("", "SELECT fail"), bind("", ""), execute(""), parse("a", "SELECT 1"), SYNC,
        bind("", "a"), execute(""), SYNC, READ,
    ],
    "cancel": [
        0,
        query("SELECT pg_sleep(1)"), send(0), cancel(), READ, cancel(False), query("SELECT 1"), READ,
    ],
    "lost_commit": [
        TRANSACTION_POOL,
        query("BEGIN"), query("INSERT INTO t VALUES (1)"), query("COMMIT -- die"), READ,
        query("SELECT 1"), READ,
    ],
    "settings_and_hints": [
        SSL_REQUEST | MD5 | TERMINATE,
        query("SET application_name = 'x'"), query("/* pgfresh:replica */ SELECT 1"),
        query("SET search_path = s"), query("UPDATE t SET a = 1"), query("SELECT a FROM t"), READ,
    ],
    "split_writes": [
        TRANSACTION_POOL | TERMINATE,
        query("SELECT 1"), parse("", "SELECT 2"), bind("", ""), execute(""), SYNC, send(1), READ,
        query("BEGIN"), query("SELECT 3"), send(7), query("COMMIT"), send(2), READ,
    ],
    "garbage_after_login": [0, query("SELECT 1"), raw(b"Z\x00\x00\x00\x04garbage"), READ],
}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "session")
    os.makedirs(out, exist_ok=True)
    for name, parts in SEEDS.items():
        data = bytes([parts[0]]) + b"".join(parts[1:])
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
