"""Failover on CPU with a real etcd: three ``streamd run`` nodes on one machine share 12 streams (11 looping
live-paced files and one camera from a real RTSP server), each node writing its own JSONL sink.

- kill -9 of a node: its streams run on the survivors within lease TTL + 5 s, their frame indices continue
  past the dead node's last line; the other streams show no gap;
- the node comes back: at most ceil(S/N) + 1 streams move; a fourth node: at most ceil(S/4) + 1;
- a node paused past its lease (SIGSTOP, SIGCONT) writes no further line for its streams: over the whole
  run no stream has lines from two nodes for overlapping pts, and no frame index is written twice.
"""

from __future__ import annotations

import itertools
import math
import signal
import time
from pathlib import Path

import pytest

from tests.cluster._etcd import EtcdServer
from tests.cluster._nodes import Lines, Node, node_names, owners, stream_yaml
from tests.conftest import CLIP
from tests.sources.conftest import RtspServer, _rtsp_server_missing

TTL = 3
S = 12
STEP = 10  # detect_fps 1 on a 10 fps clip: a line every 10 frames
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("assets")]


def _wait(what: str, cond, nodes: list[Node], lines: Lines, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while True:
        lines.poll(nodes)
        if cond():
            return time.monotonic()
        for n in nodes:
            assert n.alive, f"node {n.name} ended:\n{n.log()[-3000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n" + "\n".join(
            f"--- {n.name}\n{n.log()[-2000:]}" for n in nodes
        )
        time.sleep(0.1)


def _settle(etcd: EtcdServer, nodes: list[Node], lines: Lines, timeout: float = 60.0) -> dict[str, str]:
    """Wait until every node has joined, every stream has an owner that writes its lines, and nothing moved
    for 3 s."""
    state: dict[str, object] = {"owners": None, "since": 0.0}
    members = {n.name for n in nodes}

    def settled() -> bool:
        if set(node_names(etcd)) != members:
            return False
        now, current = time.monotonic(), owners(etcd)
        if current != state["owners"]:
            state["owners"], state["since"] = current, now
            return False
        if len(current) < S or now - float(state["since"]) < 3.0:  # type: ignore[arg-type]
            return False
        return all(  # each owner writes its streams' lines, and has for a few seconds
            len(mine := lines.of(sid, node)) >= 4 and mine[-1][1] > now - 3.0 for sid, node in current.items()
        )

    _wait("placement to settle", settled, nodes, lines, timeout)
    return dict(state["owners"])  # type: ignore[arg-type]


def _gaps(records: list[dict]) -> list[int]:
    frames = [r["frame"] for r in records]
    return [b - a for a, b in itertools.pairwise(frames) if b - a > 2 * STEP or b <= a]


def _runs(lines: Lines, sid: str) -> list[str]:
    """The nodes that wrote a stream, in frame order, one entry per run of consecutive lines by one node."""
    ordered = sorted(lines.of(sid), key=lambda x: x[2]["frame"])
    return [node for node, _ in itertools.groupby(n for n, _, _ in ordered)]


def test_failover_rebalance_and_fencing(tmp_path: Path, etcd_server: EtcdServer) -> None:
    pytest.importorskip("etcd3gw")
    if why := _rtsp_server_missing():
        pytest.skip(why)
    camera = RtspServer(CLIP)
    camera.start()
    streams = {f"cam{k:02d}": str(CLIP) for k in range(S - 1)}
    streams["rtsp"] = camera.url
    yaml = stream_yaml(streams)
    nodes = {n: Node(n, tmp_path / n, etcd_server, yaml, TTL) for n in ("a", "b", "c")}
    lines = Lines()
    running = list(nodes.values())
    try:
        for n in running:
            n.start()
        before = _settle(etcd_server, running, lines, timeout=90)

        # 1. kill -9 one node: its streams move to the survivors within TTL + 5 s, frame indices continue
        victim = nodes[before["rtsp"]]  # the camera's node: the live stream fails over too
        moved = sorted(sid for sid, n in before.items() if n == victim.name)
        killed_at = time.monotonic()
        victim.kill()
        survivors = [n for n in running if n is not victim]
        _wait(
            "the dead node's streams on the survivors",
            lambda: all(lines.first_after(s, killed_at, {n.name for n in survivors}) for s in moved),
            survivors, lines, TTL + 15,
        )  # fmt: skip
        for sid in moved:
            node, seen, first = lines.first_after(sid, killed_at, {n.name for n in survivors})  # type: ignore[misc]
            took = seen - killed_at
            print(f"failover: {sid} on {node} after {took:.2f} s")
            assert took <= TTL + 5, f"{sid} took {took:.1f} s to run again on {node}"
            last = lines.of(sid, victim.name)[-1][2]
            jump = first["frame"] - last["frame"]
            print(f"failover: {sid} frame {last['frame']} -> {first['frame']}")
            assert 0 < jump <= 10 * (took + 4), (  # + the first frame of the new session (3.4 s seen)
                f"{sid}: frame {last['frame']} on {victim.name} -> {first['frame']}"
            )
        after_death = _settle(etcd_server, survivors, lines)
        assert {s for s in streams if after_death[s] != before[s]} == set(moved)  # only the dead node's
        for sid in streams:
            if sid in moved:
                continue
            recs = [r for _, _, r in lines.of(sid, before[sid])]
            assert len(recs) >= 8 and _gaps(recs) == [], f"{sid}: {len(recs)} lines, gaps {_gaps(recs)}"

        # 2. the node comes back: only its share moves back
        victim.proc = None
        victim.start()
        running = [*survivors, victim]
        back = _settle(etcd_server, running, lines)
        back_moves = [s for s in streams if back[s] != after_death[s]]
        print(f"rejoin: {len(back_moves)} move(s): {back_moves}")
        assert 0 < len(back_moves) <= math.ceil(S / 3) + 1
        assert all(back[s] == victim.name for s in back_moves)

        # 3. a fourth node
        nodes["d"] = Node("d", tmp_path / "d", etcd_server, yaml, TTL)
        nodes["d"].start()
        running.append(nodes["d"])
        four = _settle(etcd_server, running, lines)
        four_moves = [s for s in streams if four[s] != back[s]]
        print(f"fourth node: {len(four_moves)} move(s): {four_moves}")
        assert 0 < len(four_moves) <= math.ceil(S / 4) + 1
        for sid in four_moves:  # the log names every move and its reason
            assert (
                f"cluster: stream {sid} moved to d from {back[sid]}: handed over by {back[sid]}"
                in nodes["d"].log()
            )
            assert (
                f"cluster: stream {sid} moved off {back[sid]}: rebalance: placed on d"
                in nodes[back[sid]].log()
            )
        # visible: every node's /api/status and /metrics show every node, its streams and its lease age
        for n in running:
            view = n.status()["cluster"]
            assert view["node"] == n.name and view["lease_valid"] and view["streams_total"] == S
            assert sorted(view["nodes"]) == ["a", "b", "c", "d"]
            assert {s: m for m, v in view["nodes"].items() for s in v["streams"]} == four
            assert all(0 <= v["lease_age_s"] <= TTL for v in view["nodes"].values()), view["nodes"]
            text = n.metrics()
            for m in "abcd":
                count = sum(v == m for v in four.values())
                assert f'streamd_cluster_node_streams{{node="{m}"}} {count}.0' in text
                assert f'streamd_cluster_node_lease_age_seconds{{node="{m}"}}' in text
        assert (
            'streamd_cluster_moves_total{direction="in",node="d",reason="handed over by'
            in nodes["d"].metrics()
        )

        # 4. a node paused past its lease stops its streams before it writes another line for them
        paused = nodes["a"]
        held = sorted(s for s, n in four.items() if n == "a")
        paused.signal(signal.SIGSTOP)  # the supervisor only: its workers go on and queue lines for it
        stopped_at = time.monotonic()
        others = {n.name for n in running if n is not paused}
        while time.monotonic() < stopped_at + TTL + 2:
            lines.poll(running)
            time.sleep(0.1)
        paused.signal(signal.SIGCONT)
        _wait(
            "the paused node's streams elsewhere",
            lambda: all(lines.first_after(s, stopped_at, others) for s in held),
            running, lines, TTL + 15,
        )  # fmt: skip
        for sid in held:
            node, seen, _r = lines.first_after(sid, stopped_at, others)  # type: ignore[misc]
            print(f"paused: {sid} on {node} {seen - stopped_at:.2f} s after the SIGSTOP")
            assert seen - stopped_at <= TTL + 5
        _settle(etcd_server, running, lines)
        assert "lost its lease" in paused.log()
        status = paused.status()["cluster"]
        print(f"paused node: {status['fenced_lines']} line(s) fenced, leases lost {status['leases_lost']}")
        assert status["leases_lost"] == 1 and status["fenced_lines"] > 0, status
        assert "streamd_cluster_fenced_lines_total" in paused.metrics()
    finally:
        for n in nodes.values():  # all at once: a node leaving first would hand its streams to the others
            if n.alive:
                n.signal(signal.SIGCONT)
                n.signal(signal.SIGTERM)
        for n in nodes.values():
            n.stop()
        camera.stop()
    lines.poll(list(nodes.values()))

    # Over the whole run: never two owners. In frame order a stream's pts only increase (two nodes running
    # it at once would write overlapping pts), no frame index is written twice, and the writer changes only
    # where the logs say the stream moved (two owners at once would alternate).
    logs = "\n".join(n.log() for n in nodes.values())
    for sid in streams:
        ordered = sorted((r["frame"], r["pts"], node) for node, _, r in lines.of(sid))
        frames = [f for f, _, _ in ordered]
        assert len(frames) == len(set(frames)), f"{sid}: a frame index written twice"
        for (f1, p1, n1), (f2, p2, n2) in itertools.pairwise(ordered):
            assert p1 < p2, f"{sid}: frame {f1} on {n1} has pts {p1}, frame {f2} on {n2} has pts {p2}"
        arrivals = logs.count(f"cluster: stream {sid} moved to ")
        assert len(_runs(lines, sid)) <= arrivals, (
            f"{sid}: writers {_runs(lines, sid)}, {arrivals} arrival(s)"
        )
