"""Line counters across a reload (CPU engine, real supervisor and worker, the pedestrian clip looped): a
reload that changes the stream in place (a new ``margin_px``) starts a new analytics hook, and the stream's
crossings go on from where they were — in the snapshot and in /metrics they never go back (a drop would read
as a Prometheus counter reset)."""

from __future__ import annotations

import logging
import re
import threading
import time

import pytest

from streamd.config import load_config
from streamd.supervisor.lifecycle import Supervisor
from streamd.supervisor.metrics import render
from tests.conftest import CLIP, MODEL

pytest.importorskip("lap")


def _write(path, out, margin: float) -> None:
    path.write_text(
        f"streams:\n  - id: demo\n    url: {CLIP}\n    loop: true\n    classes: [person]\n    detect_fps: 5\n"
        f"    lines:\n      - name: street\n        points: [[480, 120], [540, 560]]\n"
        f"        margin_px: {margin}\n"
        f"model:\n  path: {MODEL}\n  score_threshold: 0.35\n  iou_threshold: 0.5\n"
        "engine:\n  type: onnxruntime\n  threads: 1\ntracking:\n  enabled: true\n"
        "pipeline:\n  workers: 1\n  spare_worker: false\n"
        f"sinks:\n  - type: jsonl\n    path: {out}\n"
    )


def _total(snap: dict) -> int:
    by_class = snap["per_stream"].get("demo", {}).get("crossings", {}).get("street", {})
    return sum(n for d in by_class.values() for n in d.values())


def _exported(snap: dict) -> float:
    found = re.findall(r'^streamd_line_crossings_total\{[^}]*stream="demo"\} (\S+)$', render(snap), re.M)
    return sum(float(v) for v in found)


@pytest.mark.slow
def test_crossings_never_go_back_over_a_reload_in_place(tmp_path, caplog) -> None:
    out, cfg = tmp_path / "out.jsonl", tmp_path / "lines.yaml"
    _write(cfg, out, 8)
    sup = Supervisor(load_config(cfg), status_line=False)
    codes: list[int] = []
    runner = threading.Thread(target=lambda: codes.append(sup.run()), daemon=True)
    back: list[str] = []
    last = {"snapshot": 0, "metrics": 0.0}

    def poll() -> dict:
        snap = sup.snapshot()
        now = {"snapshot": _total(snap), "metrics": _exported(snap)}
        for key, value in now.items():
            if value < last[key]:
                back.append(f"{key}: {last[key]} -> {value}")
            last[key] = value
        return snap

    def wait(predicate, what: str, timeout: float = 180) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            snap = poll()
            if predicate(snap):
                return snap
            assert runner.is_alive(), f"the supervisor ended: {codes}"
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; last: {last}")

    with caplog.at_level(logging.INFO, logger="streamd"):
        runner.start()
        try:
            before = _total(wait(lambda s: _total(s) >= 3, "three crossings"))
            _write(cfg, out, 6)
            sup.request_reload()  # what SIGHUP does: the stream changed, so it restarts in place
            after = wait(
                lambda s: not sup.reload_in_progress and _total(s) >= before + 3,
                "three more after the reload",
            )
        finally:
            sup.stop.set()
            runner.join(timeout=60)
    assert codes == [0], caplog.text[-3000:]
    assert "reload" in caplog.text.lower()
    print(f"crossings before the reload {before}, after {_total(after)}, exported {last['metrics']}")
    assert not back, "line counters went back:\n" + "\n".join(back[:20])
    assert last["metrics"] == last["snapshot"] >= before + 3
