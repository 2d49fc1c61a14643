"""etcd lost while a node runs (its server paused: every request times out): the node keeps writing its
streams' lines only until its lease deadline, then stops them (fenced) and keeps retrying; once etcd answers
again it rejoins and its streams run again, frame numbering continuing."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.cluster._etcd import EtcdServer
from tests.cluster._nodes import Lines, Node, owners, stream_yaml
from tests.conftest import CLIP

TTL = 4
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("assets")]


def test_etcd_away_fences_at_the_deadline_then_the_node_comes_back(tmp_path: Path, etcd_server: EtcdServer):
    streams = {"s1": str(CLIP), "s2": str(CLIP)}
    node = Node("n1", tmp_path / "n1", etcd_server, stream_yaml(streams), TTL, "  timeout_s: 0.5\n")
    lines = Lines()
    node.start()
    try:
        deadline = time.monotonic() + 90
        while not all(len(lines.of(s)) >= 4 for s in streams):
            assert node.alive and time.monotonic() < deadline, node.log()[-3000:]
            lines.poll([node])
            time.sleep(0.1)
        etcd_server.proc.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
        away = time.monotonic()
        while time.monotonic() < away + TTL + 3:
            lines.poll([node])
            time.sleep(0.1)
        last = max(t for _, t, _r in lines.seen)
        margin = max(0.5, TTL / 5)
        print(f"etcd away: last line {last - away:.2f} s after (deadline at most {TTL - margin:.1f} s)")
        assert last - away <= TTL - margin + 0.5  # nothing written past the lease deadline
        assert last - away >= TTL - margin - TTL / 4 - 1.0  # but written until then (a line a second)
        assert node.alive and "etcd unreachable" in node.log()
        before = {s: lines.of(s)[-1][2]["frame"] for s in streams}
        etcd_server.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
        back = time.monotonic()
        while not all(any(t > back for _, t, _r in lines.of(s)) for s in streams):
            assert node.alive and time.monotonic() < back + 30, node.log()[-3000:]
            lines.poll([node])
            time.sleep(0.1)
        print(f"etcd back: lines again after {time.monotonic() - back:.2f} s")
        for s in streams:
            first = next(r for _, t, r in lines.of(s) if t > back)
            assert first["frame"] > before[s], (s, before[s], first["frame"])
        assert set(owners(etcd_server)) == set(streams)
        assert "lost its lease" in node.log() and "rejoined with a new lease" in node.log()
    finally:
        if etcd_server.proc is not None:
            etcd_server.proc.send_signal(signal.SIGCONT)
        node.stop()
