"""A stream's ``classes`` changed by a reload takes effect (CPU engine, real supervisor and workers, the
pedestrian clip looped): the class filter runs in the postprocess, whose table was built from the run's first
config, so a reload must hand the stage the stream's new row — with an engine per worker and with the shared
engine process (``engine.shared``), which runs the NMS for its workers. The stream left alone keeps its
persons throughout. (The first run of this test also found a reload that changed a stream without analytics
failing in the worker: ``_finish_analytics`` deleted a hook that was never there.)"""

from __future__ import annotations

import json
import threading
import time

import pytest

from streamd.config import load_config
from streamd.supervisor.lifecycle import Supervisor
from tests.conftest import CLIP, MODEL


def _write(path, out, classes: str | None, shared: bool) -> None:
    filtered = f"    classes: {classes}\n" if classes else ""
    path.write_text(
        f"streams:\n  - id: a\n    url: {CLIP}\n    loop: true\n{filtered}"
        f"  - id: b\n    url: {CLIP}\n    loop: true\n"
        f"model:\n  path: {MODEL}\n  score_threshold: 0.35\n"
        f"engine:\n  type: onnxruntime\n  threads: 1\n  shared: {str(shared).lower()}\n"
        "pipeline:\n  workers: 1\n  spare_worker: false\n  batch_size: 4\n"
        f"sinks:\n  - type: jsonl\n    path: {out}\n"
    )


def _lines(out) -> list[dict]:
    try:
        text = out.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines()[:-1]]  # the last may be half written


def _labels(records: list[dict], stream: str, after: int) -> tuple[int, set[str]]:
    """Frames of ``stream`` numbered above ``after`` and the labels detected in them."""
    mine = [r for r in records if r.get("stream") == stream and r.get("frame", -1) > after]
    return len(mine), {d["label"] for r in mine for d in r.get("detections", [])}


@pytest.mark.slow
@pytest.mark.parametrize("shared", [False, True], ids=["engine-per-worker", "shared-engine"])
def test_a_reload_changes_a_streams_classes(tmp_path, capfd, shared: bool) -> None:
    out, cfg = tmp_path / "out.jsonl", tmp_path / "c.yaml"
    _write(cfg, out, None, shared)
    sup = Supervisor(load_config(cfg), status_line=False)
    codes: list[int] = []
    runner = threading.Thread(target=lambda: codes.append(sup.run()), daemon=True)

    def wait_for(stream: str, after: int, frames: int, timeout: float = 180) -> set[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            n, labels = _labels(_lines(out), stream, after)
            if n >= frames:
                return labels
            assert runner.is_alive(), f"the supervisor ended: {codes}"
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {frames} frames of {stream} after frame {after}")

    def reload(classes: str | None) -> int:
        """Reload with stream a's new classes; the frame of a the change is judged from: 60 frames after
        the newest line at the request (the change lands in the worker within a few; a stream changed in
        place keeps its numbering)."""
        _write(cfg, out, classes, shared)
        last = max((r["frame"] for r in _lines(out) if r.get("stream") == "a"), default=0)
        sup.request_reload()
        return last + 60

    runner.start()
    try:
        assert "person" in wait_for("a", 0, 40), "no person in the clip before the reload"
        start = reload("[car]")  # the clip's few cars pass stream a's filter, its many persons do not
        assert wait_for("a", start, 40) <= {"car"}, "stream a's new classes were not applied"
        assert "person" in wait_for("b", start, 40), "stream b lost its persons"
        start = reload(None)  # classes removed: every class again
        assert "person" in wait_for("a", start, 40), "stream a's filter stayed after it was removed"
    finally:
        sup.stop.set()
        runner.join(timeout=60)
    assert codes == [0]
    logs = capfd.readouterr().err  # the worker's own log: the changes were made in place, not by a new worker
    assert "changing streams in place failed" not in logs and "died" not in logs, logs[-3000:]
