#!/usr/bin/env python3
"""Writes the seed inputs of the `framing` fuzz target: client streams starting with
the startup phase, and one server stream.

Usage: python3 seeds/framing.py [DIR]   (default: seeds/framing next to this script)
"""

import os
import struct
import sys


def msg(tag, body=b""):
    return tag + struct.pack(">I", len(body) + 4) + body


def cstr(s):
    return s.encode() + b"\0"


def startup(user="app", db="app"):
    body = struct.pack(">I", 196608) + cstr("user") + cstr(user) + cstr("database") + cstr(db) + b"\0"
    return struct.pack(">I", len(body) + 4) + body


SSL_REQUEST = struct.pack(">II", 8, 80877103)
SYNC = msg(b"S")
TERMINATE = msg(b"X")


def bind(portal, statement, params):
    body = cstr(portal) + cstr(statement) + struct.pack(">hh", 1, 0) + struct.pack(">h", len(params))
    for p in params:
        body += struct.pack(">i", -1) if p is None else struct.pack(">i", len(p)) + p
    return msg(b"B", body + struct.pack(">hh", 1, 1))


CLIENT_FIRST = b"n,,n=,r=rOprNGfwEbeRWgbNEkqO"

SEEDS = {
    "simple": startup() + msg(b"Q", cstr("SELECT 1")) + TERMINATE,
    "extended": SSL_REQUEST + startup()
    + msg(b"P", cstr("s") + cstr("SELECT $1") + struct.pack(">hI", 1, 23))
    + bind("", "s", [b"42", None])
    + msg(b"D", b"P" + cstr(""))
    + msg(b"E", cstr("") + struct.pack(">i", 0))
    + msg(b"C", b"S" + cstr("s"))
    + msg(b"H") + SYNC,
    "sasl": startup()
    + msg(b"p", cstr("SCRAM-SHA-256") + struct.pack(">i", len(CLIENT_FIRST)) + CLIENT_FIRST)
    + msg(b"p", b"c=biws,r=rOprNGfwEbeRWgbNEkqO,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    + msg(b"p", cstr("md5a3556571e93b0d20722ba62be61e8c2d")),
    "copy": startup()
    + msg(b"Q", cstr("COPY t FROM STDIN"))
    + msg(b"d", b"1\tx\n2\ty\n") + msg(b"c")
    + msg(b"Q", cstr("COPY t FROM STDIN")) + msg(b"f", cstr("no")),
    "cancel": struct.pack(">IIii", 16, 80877102, 1234, 5678),
    "server": msg(b"R", struct.pack(">I", 0))
    + msg(b"S", cstr("server_version") + cstr("17.0"))
    + msg(b"K", struct.pack(">ii", 1, 2))
    + msg(b"Z", b"I")
    + msg(b"T", struct.pack(">h", 1) + cstr("a") + struct.pack(">IhIhih", 0, 0, 25, -1, -1, 0))
    + msg(b"D", struct.pack(">hi", 1, 1) + b"1")
    + msg(b"C", cstr("SELECT 1"))
    + msg(b"E", b"SERROR\0C42601\0Msyntax error\0\0")
    + msg(b"Z", b"E"),
}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "framing")
    os.makedirs(out, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
