"""Shared by the Python benchmark scripts: a minimal PostgreSQL client (standard library
only), the bench cluster's environment, psql on a node, and pgfresh's routing counters."""
import os
import socket
import struct
import subprocess
import urllib.request


class PgError(Exception):
    """An ErrorResponse from the server, or a protocol problem."""


class Conn:
    """A minimal PostgreSQL protocol 3.0 client: trust auth, simple query, text results."""

    def __init__(self, host, port, user, database, timeout=30.0, application_name="pgfresh-bench"):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        params = b"".join(
            k.encode() + b"\0" + v.encode() + b"\0"
            for k, v in (("user", user), ("database", database), ("application_name", application_name))
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
