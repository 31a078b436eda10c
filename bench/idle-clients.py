#!/usr/bin/env python3
"""Holds N idle client connections to a PostgreSQL endpoint (trust auth), for load runs.

    bench/idle-clients.py HOST PORT USER DB N

Logs every client in (StartupMessage, waits for ReadyForQuery), prints
"ready N LOGINS_PER_SECOND", then holds them until a line arrives on stdin. Then each
client runs `SELECT 1` and must get its row back; prints "alive OK FAILED" and exits
(status 1 if any failed). Standard library only.
"""
import socket
import struct
import sys
import time


def message(tag, body):
    return tag + struct.pack("!I", len(body) + 4) + body


def read_until(sock, want):
    """Reads messages until one of type `want`; returns the types seen."""
    buf = b""
    seen = []
    while True:
        while len(buf) >= 5:
            tag = buf[:1]
            length = struct.unpack("!I", buf[1:5])[0]
            if len(buf) < 1 + length:
                break
            seen.append(tag)
            buf = buf[1 + length:]
            if tag == want:
                return seen
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed by the proxy after %r" % seen)
        buf += chunk


def login(host, port, user, db):
    s = socket.create_connection((host, port))
    params = b"user\0" + user.encode() + b"\0database\0" + db.encode() + b"\0\0"
    body = struct.pack("!I", 196608) + params
    s.sendall(struct.pack("!I", len(body) + 4) + body)
    seen = read_until(s, b"Z")
    if b"E" in seen:
        raise ConnectionError("login refused")
    return s


def main():
    host, port, user, db, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
    started = time.monotonic()
    clients = [login(host, port, user, db) for _ in range(n)]
    rate = n / (time.monotonic() - started)
    print("ready %d %.0f" % (n, rate), flush=True)
    sys.stdin.readline()
    ok = failed = 0
    for s in clients:
        try:
            s.sendall(message(b"Q", b"SELECT 1\0"))
            seen = read_until(s, b"Z")
            if b"D" in seen and b"E" not in seen:
                ok += 1
            else:
                failed += 1
        except OSError:
            failed += 1
    print("alive %d %d" % (ok, failed), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
