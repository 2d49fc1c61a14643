"""A reload that moves streams between worker processes keeps their counters (CPU engine, real supervisor and
workers): per-stream counters and the run's totals never go back — /metrics exports them as Prometheus
counters, and a drop reads as a counter reset — and the exit summary counts the whole run, including a
stream the reload removed (counted until it was removed).

One worker carries a, b and c. The reload changes b (new ``detect_fps``) and removes c, so the worker is
retired: the unchanged a moves to a new worker, the changed b starts again in another one. Both keep their
counters (same stream id) and their frame numbering (a's frames stay contiguous, b's keep increasing)."""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
import time
from collections import Counter

import pytest

from streamd.config import load_config
from streamd.latency import StageHistogram
from streamd.protocol import COUNTER_NAMES, StreamCounters, StreamReport, WorkerStats
from streamd.supervisor.lifecycle import Supervisor
from streamd.supervisor.metrics import COUNTERS as METRIC_COUNTERS
from streamd.supervisor.metrics import render
from streamd.supervisor.pool import WorkerSlot
from tests.conftest import CLIP_HEVC, MODEL, ROOT
from tests.test_reference_detections import NANODET_MODEL
from tests.test_supervisor import _lines

TOTALS = ("results", "dropped", "decode_errors", "skipped")


def _write(path, out, b_fps: float, with_c: bool) -> None:
    streams = f"  - id: a\n    url: {CLIP_HEVC}\n    loop: true\n"
    streams += f"  - id: b\n    url: {CLIP_HEVC}\n    loop: true\n    detect_fps: {b_fps}\n"
    if with_c:
        streams += f"  - id: c\n    url: {CLIP_HEVC}\n    loop: true\n    detect_fps: 5\n"
    path.write_text(
        f"streams:\n{streams}{NANODET_MODEL}engine:\n  type: onnxruntime\n  threads: 1\n"
        f"pipeline:\n  workers: 1\n  batch_size: 2\n  spare_worker: false\n"
        f"sinks:\n  - type: jsonl\n    path: {out}\n    flush_every: 1\n"
    )


def _exported(snap: dict) -> dict[tuple[str, str], float]:
    """(metric, stream) -> value of every ``streamd_stream_*_total`` in /metrics (one series per stream: a
    moved stream keeps its series), plus ``streamd_frames_total``."""
    values: Counter[tuple[str, str]] = Counter()
    for line in render(snap).splitlines():
        m = re.match(r'(streamd_stream_\w+_total)\{stream="(\w+)"\} (\S+)$', line)
        if m:
            values[(m.group(1), m.group(2))] += float(m.group(3))
        elif line.startswith("streamd_frames_total "):
            values[("streamd_frames_total", "")] = float(line.split()[1])
    return dict(values)


@pytest.mark.slow
def test_a_reload_that_changes_streams_in_place_keeps_their_counters(tmp_path, assets, caplog) -> None:
    """b changed and c removed in the worker that carries a, b and c: b continues in place with its
    counters, c's counts stay in the totals, nothing goes back."""
    out, cfg = tmp_path / "out.jsonl", tmp_path / "reload.yaml"
    _write(cfg, out, b_fps=5, with_c=True)
    sup = Supervisor(load_config(cfg), status_line=False)
    codes: list[int] = []
    runner = threading.Thread(target=lambda: codes.append(sup.run()), daemon=True)
    back: list[str] = []  # every counter that went back between two snapshots
    seen: list[dict] = []
    exported: dict[tuple[str, str], float] = {}
    last: dict[tuple[str, str], tuple[int, int]] = {}  # (stream, counter) -> (value, worker) last seen

    def poll() -> dict:
        snap = sup.snapshot()
        prev = seen[-1] if seen else None
        for sid, s in snap["per_stream"].items():
            for key in COUNTER_NAMES:
                old, worker = last.get((sid, key), (0, s["worker"]))
                if s[key] < old:
                    back.append(f"{sid}.{key}: {old} -> {s[key]} (worker {worker} -> {s['worker']})")
                last[sid, key] = (s[key], s["worker"])
        for key in TOTALS:
            if prev is not None and snap[key] < prev[key]:
                back.append(f"total {key}: {prev[key]} -> {snap[key]}")
        for name, value in _exported(snap).items():
            if value < exported.get(name, 0):
                back.append(f"/metrics {name}: {exported[name]} -> {value}")
            exported[name] = value
        seen.append(snap)
        return snap

    def wait(predicate, what: str, timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            snap = poll()
            if predicate(snap):
                return snap
            assert runner.is_alive(), f"the supervisor ended: {codes}"
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; last snapshot: {seen[-1]['per_stream']}")

    def counted(snap: dict, sid: str, key: str = "inferred") -> int:
        return int(snap["per_stream"].get(sid, {}).get(key, 0))

    with caplog.at_level(logging.INFO, logger="streamd"):
        runner.start()
        try:
            before = wait(
                lambda s: (
                    all(counted(s, sid) >= 10 and counted(s, sid, "skipped") >= 5 for sid in "bc")
                    and counted(s, "a") >= 20
                ),
                "the first results",
            )
            _write(cfg, out, b_fps=2, with_c=False)
            sup.request_reload()  # what SIGHUP does
            moved = wait(  # the same worker: b runs with its new settings, c is gone
                lambda s: (
                    sup.workers[0].stream_ids == ("a", "b")
                    and len(sup.workers) == 1
                    and not sup.reload_in_progress
                    and counted(s, "b") >= counted(before, "b") + 10
                    and counted(s, "a") >= counted(before, "a") + 10
                ),
                "b changed in place, c removed",
            )
        finally:
            sup.stop.set()
            runner.join(timeout=60)
    assert codes == [0], caplog.text[-3000:]
    final = poll()
    lines = _lines(out)
    print(f"decoded before: {[(sid, counted(before, sid, 'decoded')) for sid in 'abc']}; after the move: "
          f"{[(sid, counted(moved, sid, 'decoded')) for sid in 'ab']}; final: "
          f"{[(sid, counted(final, sid, 'decoded')) for sid in 'ab']}; "
          f"lines {[len(lines[s]) for s in 'abc']}")  # fmt: skip
    assert not back, "counters went back:\n" + "\n".join(back[:20])
    # The whole run is counted: every line written was inferred, every inferred frame was decoded.
    for sid in "ab":
        assert counted(final, sid) == len(lines[sid]), (sid, final["per_stream"][sid])
        assert counted(final, sid, "decoded") >= lines[sid][-1]["frame"] + 1, (sid, final["per_stream"][sid])
    assert final["results"] == sum(len(v) for v in lines.values())
    skipped_c = counted(before, "c", "skipped")
    assert final["skipped"] >= counted(final, "a", "skipped") + counted(final, "b", "skipped") + skipped_c
    assert "c" not in final["per_stream"]  # removed: its series end, its counts stay in the totals
    summary = re.search(r"streamd: done: (\d+) frames .*?, (\d+) skipped", caplog.text)
    assert summary, caplog.text[-3000:]
    assert (int(summary.group(1)), int(summary.group(2))) == (final["results"], final["skipped"])
    # Frame numbering continues in the new workers; each stream's lines stay in order.
    frames_a = [r["frame"] for r in lines["a"]]
    assert frames_a == list(range(len(frames_a))), f"a: gaps or disorder {frames_a[-15:]}"
    frames_b = [r["frame"] for r in lines["b"]]
    assert frames_b == sorted(set(frames_b)), f"b: repeats or disorder {frames_b[-15:]}"
    assert all(f"streamd_stream_{k}_total" in str(exported) for k in METRIC_COUNTERS)


def _stats(**decoded: int) -> WorkerStats:
    """A worker's stats message: per stream ``decoded`` = ``inferred`` = n, one latency sample per frame."""
    per_stream = {
        sid: StreamReport(
            "running",
            StreamCounters(decoded=n, inferred=n, skipped=1),
            {"total": StageHistogram((0, n, *[0] * 12), 2.0 * n, n)},
        )
        for sid, n in decoded.items()
    }
    return WorkerStats(results=sum(decoded.values()), per_stream=per_stream)


def test_counters_sum_every_process_that_carried_a_stream() -> None:
    """No processes: the bookkeeping alone. A crash folds the dead process's counters into its slot
    (``end_incarnation``) and the spare takes them along; a reload that moves a stream leaves the retired
    slot's last stats in the sum; a removed stream stays in the totals; latency histograms add up the same
    way."""
    from streamd.config import parse_config

    raw = {"streams": [{"id": sid, "url": str(CLIP_HEVC)} for sid in "abc"], "model": {"path": str(MODEL)},
           "engine": {"type": "onnxruntime"}, "pipeline": {"workers": 2}}  # fmt: skip
    sup = Supervisor(parse_config(raw, ROOT), status_line=False)
    pool = sup.pool
    w0, w1 = pool.workers  # (a, c), (b,)
    w0.stats, w1.stats = _stats(a=10, c=4), _stats(b=7)
    pool.end_incarnation(w0)  # worker 0 died: its counters go to its base
    spare = WorkerSlot(-1, (), w0.device)
    spare.ready, spare.process = True, type("P", (), {"is_alive": lambda self: True, "pid": 0})()
    pool.spares[w0.device] = spare
    assert pool.move_to_spare(w0) and pool.workers[0] is spare  # the spare took a and c, and their counters
    spare.stats = _stats(a=5, c=1)
    snap = sup.snapshot()
    assert [snap["per_stream"][sid]["decoded"] for sid in "abc"] == [15, 7, 5]
    assert snap["per_stream"]["a"]["latency"]["total"]["count"] == 15
    # A reload removes c and changes b: both slots retire, a and b move to new slots, c leaves.
    sup.config = dataclasses.replace(sup.config, streams=sup.config.streams[:2])
    spare.retired = w1.retired = True
    spare.process = None  # drained and gone
    del pool.owner["c"]
    moving = snap["per_stream"]
    assert [sup.snapshot()["per_stream"][sid]["decoded"] for sid in "ab"] == [15, 7]  # while they move
    assert sup.snapshot()["per_stream"]["a"]["state"] == "starting"
    for ids, stats in ((("a",), _stats(a=2)), (("b",), _stats(b=3))):
        w = WorkerSlot(len(pool.workers), ids, 0, stats=stats)
        pool.workers.append(w)
        pool.owner[ids[0]] = w
    snap = sup.snapshot()
    assert list(snap["per_stream"]) == ["a", "b"]
    assert [snap["per_stream"][sid]["decoded"] for sid in "ab"] == [17, 10]
    assert snap["per_stream"]["a"]["worker"] == 2 and moving["a"]["worker"] == 0
    assert snap["per_stream"]["b"]["latency"]["total"]["counts"][1] == 10
    assert snap["results"] == 17 + 10 + 5  # c counted until its removal
    assert snap["skipped"] == 3 + 2 + 2  # one per stream and process: a 3 processes, b 2, c 2
    # The retired slots are folded into the pool's past once: the same counts, summed once.
    pool.archive_finished()
    assert spare.archived and w1.archived and not any(w.archived for w in pool.workers[2:])
    again = sup.snapshot()
    for key in ("results", "skipped", "per_stream"):
        assert again[key] == snap[key], key
