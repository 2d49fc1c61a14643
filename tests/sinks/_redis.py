"""A real Redis server (Debian's redis-server) on a free loopback port, which a test can kill and start again.

Append-only file with ``appendfsync always``: what the server acknowledged survives a ``kill -9``, so what a
test reads back after an outage is what the sink really delivered."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sinks._helpers import free_port


class RedisServer:
    def __init__(self, folder: Path, *extra: str) -> None:
        self.port = free_port()
        self.folder = folder
        self.extra = list(extra)  # more redis-server options, e.g. "--requirepass", "pw"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder)]
        args += ["--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no"]
        args += ["--logfile", str(self.folder / "redis.log"), *self.extra]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64).startswith((b"+PONG", b"-NOAUTH")):  # "-LOADING": reading its AOF
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"redis-server did not answer on {self.port}: {self.log()}")

    def kill(self) -> None:
        """kill -9: no goodbye to clients; what it acknowledged is in its append-only file."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def client(self, password: str | None = None):
        import redis

        return redis.Redis(
            host="127.0.0.1", port=self.port, password=password, socket_timeout=10, decode_responses=True
        )

    def entries(self, key: str) -> list[dict]:
        """Every entry of a Redis Stream, oldest first: {"line": parsed JSON, "node": ...}."""
        out = []
        with self.client() as c:
            for _id, fields in c.xrange(key):
                out.append({"line": json.loads(fields["line"]), "node": fields["node"]})
        return out

    def log(self) -> str:
        path = self.folder / "redis.log"
        return path.read_text()[-3000:] if path.exists() else ""


def keys_of(entries: list[dict]) -> Counter:
    """How often each (stream, frame index) line arrived."""
    return Counter((e["line"]["stream"], e["line"]["frame"]) for e in entries)


@contextlib.contextmanager
def running_redis(folder: Path) -> Iterator[RedisServer]:
    """A started server in ``folder`` (the test module's ``redis_server`` fixture), killed at the end."""
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed (Debian redis-server; .ci/system-packages installs it)")
    folder.mkdir()
    server = RedisServer(folder)
    server.start()
    try:
        yield server
    finally:
        server.kill()
