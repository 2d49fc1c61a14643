"""A real etcd (Debian's ``etcd-server``) on free loopback ports with a temporary data folder."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def needs_etcd() -> None:
    if shutil.which("etcd") is None:
        pytest.skip("etcd is not installed (Debian: apt-get install etcd-server; .ci/system-packages does)")


class EtcdServer:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port, self.peer = free_port(), free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start etcd and wait for it to be healthy. free_port() only finds a port free for a moment: when
        something else binds it first, etcd exits ("address already in use") and a first start tries fresh
        ports (a restart keeps its ports and data: its clients know them)."""
        data = self.folder / "etcd"
        fresh = not data.exists()
        for _attempt in range(3):
            if self._start_once():
                return
            if not fresh or "address already in use" not in (self.folder / "etcd.log").read_text():
                break
            shutil.rmtree(data, ignore_errors=True)
            self.port, self.peer = free_port(), free_port()
        raise RuntimeError("etcd did not start: " + (self.folder / "etcd.log").read_text()[-1000:])

    def _start_once(self) -> bool:
        args = [
            "etcd",
            "--name", "test",
            "--data-dir", str(self.folder / "etcd"),
            "--listen-client-urls", self.url,
            "--advertise-client-urls", self.url,
            "--listen-peer-urls", f"http://127.0.0.1:{self.peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer}",
            "--initial-cluster", f"test=http://127.0.0.1:{self.peer}",
        ]  # fmt: skip
        log = open(self.folder / "etcd.log", "ab")  # noqa: SIM115 (the server's stderr for its lifetime)
        self.proc = subprocess.Popen(args, stdout=log, stderr=log)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and self.proc.poll() is None:
            with (
                contextlib.suppress(OSError, ValueError),
                urllib.request.urlopen(self.url + "/health", timeout=1) as r,
            ):
                if json.loads(r.read()).get("health") == "true":
                    return True
            time.sleep(0.1)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        return False

    def keys(self, prefix: str) -> dict[str, str]:
        from streamd.cluster.etcd import Etcd

        client = Etcd([self.url], 2.0)
        try:
            entries, _ = client.prefix(prefix)
        finally:
            client.close()
        return {e.key: e.value for e in entries}

    def put(self, key: str, value: str) -> None:
        from streamd.cluster.etcd import Etcd

        client = Etcd([self.url], 2.0)
        try:
            client.put(key, value)
        finally:
            client.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
