"""Cluster nodes as real ``streamd run`` processes on one machine, each with its own JSONL sink, and readers
of what they wrote."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.cluster._etcd import EtcdServer, free_port
from tests.conftest import MODEL, ROOT

PREFIX = "/streamd"


def stream_yaml(streams: dict[str, str], fps: dict[str, float] | None = None) -> str:
    """``streams:`` YAML: files loop, paced like live cameras; rtsp:// URLs as they are; detect_fps 1 unless
    ``fps`` says otherwise."""
    out = ["streams:"]
    for sid, url in streams.items():
        out += [f"  - id: {sid}", f"    url: {url}", f"    detect_fps: {(fps or {}).get(sid, 1.0)}"]
        if not url.startswith("rtsp://"):
            out += ["    realtime: true", "    loop: true"]
    return "\n".join(out) + "\n"


class Node:
    """One ``streamd run`` process (its own session: a kill takes its workers too, like a box dying)."""

    def __init__(self, name: str, folder: Path, etcd: EtcdServer, streams: str, ttl_s: int, extra: str = ""):
        self.name, self.folder = name, folder
        folder.mkdir(parents=True, exist_ok=True)
        self.out, self.config, self.err = folder / "out.jsonl", folder / "streamd.yaml", folder / "stderr.txt"
        self.port = free_port()
        self.etcd, self.ttl_s, self.extra = etcd, ttl_s, extra
        self.write_config(streams)
        self.proc: subprocess.Popen | None = None

    def write_config(self, streams: str) -> None:
        self.config.write_text(
            streams
            + f"model:\n  path: {MODEL}\n"
            + "pipeline:\n  workers: 1\n  spare_worker: false\n"
            + f"sinks:\n  - type: jsonl\n    path: {self.out}\n"
            + f"metrics:\n  enabled: true\n  port: {self.port}\n"
            + f"cluster:\n  enabled: true\n  etcd: [{self.etcd.url}]\n  node: {self.name}\n  capacity: 4\n"
            + f"  lease_ttl_s: {self.ttl_s}\n  resume_every_s: 0.5\n  prefix: {PREFIX}\n"
            + self.extra
        )

    def start(self) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "RUNTIME_DIRECTORY": str(self.folder)}
        with open(self.err, "a") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "streamd", "run", str(self.config), "--no-status"],
                cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
            )  # fmt: skip

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int, group: bool = False) -> None:
        assert self.proc is not None
        if group:
            os.killpg(self.proc.pid, sig)
        else:
            os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        """kill -9 the node and its workers (the box dies)."""
        if self.alive:
            self.signal(signal.SIGKILL, group=True)
            assert self.proc is not None
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if not self.alive:
            return
        assert self.proc is not None
        self.signal(signal.SIGCONT)
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL, group=True)
            self.proc.wait(timeout=10)

    def status(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/status", timeout=2) as r:
            return json.loads(r.read())

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as r:
            return r.read().decode()

    def log(self) -> str:
        return self.err.read_text() if self.err.exists() else ""


class Lines:
    """Every node's sink, read as it grows: per line, the node, when the test saw it (monotonic) and the
    record."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, float, dict]] = []
        self._offsets: dict[Path, int] = {}

    def poll(self, nodes: list[Node]) -> None:
        now = time.monotonic()
        for node in nodes:
            if not node.out.exists():
                continue
            start = self._offsets.get(node.out, 0)
            with open(node.out, "rb") as f:
                f.seek(start)
                data = f.read()
            end = data.rfind(b"\n") + 1  # a line still being written waits for the next poll
            self._offsets[node.out] = start + end
            for raw in data[:end].splitlines():
                rec = json.loads(raw)
                if "type" not in rec:  # frame lines only
                    self.seen.append((node.name, now, rec))

    def of(self, stream: str, node: str | None = None) -> list[tuple[str, float, dict]]:
        return [x for x in self.seen if x[2]["stream"] == stream and (node is None or x[0] == node)]

    def first_after(self, stream: str, t: float, nodes: set[str]) -> tuple[str, float, dict] | None:
        return next((x for x in self.of(stream) if x[1] > t and x[0] in nodes), None)


def owners(etcd: EtcdServer) -> dict[str, str]:
    """Stream -> owner node, as etcd says."""
    keys = etcd.keys(PREFIX + "/owners/")
    return {k.rsplit("/", 1)[1]: json.loads(v)["node"] for k, v in keys.items()}


def node_names(etcd: EtcdServer) -> list[str]:
    """The live nodes, as etcd says."""
    return sorted(k.rsplit("/", 1)[1] for k in etcd.keys(PREFIX + "/nodes/"))
