"""Cluster-wide changes with single-node reload's rules, on two real ``streamd run`` nodes and a real etcd:
the stream list in an etcd key (every node follows it) or in the config file (SIGHUP on every node). Added
streams start on one node, removed ones stop, a changed one restarts with its new settings, untouched ones
never pause; an invalid list is refused by every node and the running one stays."""

from __future__ import annotations

import itertools
import signal
import time
from pathlib import Path

import pytest

from tests.cluster._etcd import EtcdServer
from tests.cluster._nodes import PREFIX, Lines, Node, node_names, owners, stream_yaml
from tests.conftest import CLIP

TTL = 3
KEY = PREFIX + "/streams"
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("assets")]


def _wait(what: str, cond, nodes: list[Node], lines: Lines, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        lines.poll(nodes)
        if cond():
            return
        for n in nodes:
            assert n.alive, f"node {n.name} ended:\n{n.log()[-3000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n" + "\n".join(
            f"--- {n.name}\n{n.log()[-2000:]}" for n in nodes
        )
        time.sleep(0.2)


def _writing(lines: Lines, sid: str, since: float, count: int = 2) -> bool:
    return sum(1 for _, t, _r in lines.of(sid) if t > since) >= count


def _steps(lines: Lines, sid: str, since: float) -> set[int]:
    frames = [r["frame"] for _, t, r in lines.of(sid) if t > since]
    return {b - a for a, b in itertools.pairwise(frames)}


def _run_changes(etcd: EtcdServer, nodes: list[Node], change, refusal: str) -> None:
    """``change(streams, fps)`` publishes a stream list to every node."""
    lines = Lines()
    first = {f"s{k}": str(CLIP) for k in range(1, 5)}
    try:
        for n in nodes:
            n.start()
        _wait("every node", lambda: node_names(etcd) == sorted(n.name for n in nodes), nodes, lines)
        t0 = time.monotonic()
        _wait("the first list", lambda: all(_writing(lines, s, t0, 3) for s in first), nodes, lines, 90)
        before = owners(etcd)
        assert set(before) == set(first) and set(before.values()) == {n.name for n in nodes}

        # remove s1, change s2 (detect_fps 1 -> 2), add s5; s3 and s4 untouched
        changed_at = time.monotonic()
        change({"s2": str(CLIP), "s3": str(CLIP), "s4": str(CLIP), "s5": str(CLIP)}, {"s2": 2.0})
        _wait("s5 to start", lambda: _writing(lines, "s5", changed_at), nodes, lines)
        _wait("s2 with its new settings", lambda: 5 in _steps(lines, "s2", changed_at + 3), nodes, lines)
        time.sleep(2.0)
        lines.poll(nodes)
        s1_last = max(t for _, t, _r in lines.of("s1"))
        assert s1_last < time.monotonic() - 1.5, "s1 still writes after it was removed"
        assert set(owners(etcd)) == {"s2", "s3", "s4", "s5"}
        for sid in ("s3", "s4"):  # untouched: same node, no gap (a line every 10 frames at detect_fps 1)
            assert owners(etcd)[sid] == before[sid]
            assert _steps(lines, sid, t0) == {10}, f"{sid}: frame steps {_steps(lines, sid, t0)}"

        # an invalid list (detect_fps -3): refused by every node, the running list goes on
        refused_at = time.monotonic()
        change({"s2": str(CLIP)}, {"s2": -3.0})
        _wait("every node to refuse", lambda: all(refusal in n.log() for n in nodes), nodes, lines, 30)
        time.sleep(2.0)
        lines.poll(nodes)
        for sid in ("s2", "s3", "s4", "s5"):
            assert _writing(lines, sid, refused_at, 2), f"{sid} stopped after the refused change"
        assert not _writing(lines, "s1", refused_at, 1)
        assert set(owners(etcd)) == {"s2", "s3", "s4", "s5"}
        for n in nodes:  # the problem names where the list came from and the key
            assert "streams[0].detect_fps" in n.log(), n.log()[-2000:]
            if n.extra:
                assert n.status()["cluster"]["stream_list"]["refused"], n.name
    finally:
        for n in nodes:
            if n.alive:
                n.signal(signal.SIGTERM)
        for n in nodes:
            n.stop()


def test_stream_list_in_an_etcd_key(tmp_path: Path, etcd_server: EtcdServer) -> None:
    pytest.importorskip("etcd3gw")
    etcd_server.put(KEY, stream_yaml({f"s{k}": str(CLIP) for k in range(1, 5)}))
    extra = f"  streams_key: {KEY}\n"
    nodes = [Node(n, tmp_path / n, etcd_server, "", TTL, extra) for n in ("a", "b")]

    def change(streams: dict[str, str], fps: dict[str, float]) -> None:
        etcd_server.put(KEY, stream_yaml(streams, fps))

    _run_changes(etcd_server, nodes, change, "cluster: stream list refused (1 problem(s))")
    assert all(f"etcd key {KEY}:" in n.log() for n in nodes)


def test_stream_list_in_the_file_and_sighup_on_every_node(tmp_path: Path, etcd_server: EtcdServer) -> None:
    pytest.importorskip("etcd3gw")
    first = stream_yaml({f"s{k}": str(CLIP) for k in range(1, 5)})
    nodes = [Node(n, tmp_path / n, etcd_server, first, TTL) for n in ("a", "b")]

    def change(streams: dict[str, str], fps: dict[str, float]) -> None:
        for n in nodes:
            n.write_config(stream_yaml(streams, fps))
            n.signal(signal.SIGHUP)

    _run_changes(etcd_server, nodes, change, "reload refused (1 problem(s))")
