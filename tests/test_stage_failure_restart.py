"""A stage that raises in a running worker (a bug, a broken engine) no longer leaves endless streams (cameras,
looped files) dark for the rest of the run: the worker exits (70) without Done and the supervisor restarts it
as after a crash. Its streams start again numbered after their newest line, as a moved stream does
(``Supervisor._reload``): a camera from now, a looped file from its first picture. A finite file is not
started again (it would run twice): its worker ends, counted as failed (exit 1).

The failure is real, not simulated inside the daemon: a ``sitecustomize`` on PYTHONPATH makes the result
stage (``Pipeline._on_results``) raise at its third call in the first worker process only (a marker file)."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import time
from pathlib import Path

import av

from tests.conftest import start_streamd, with_sitecustomize

INJECT = """
import os
marker = os.environ.get("STREAMD_TEST_STAGE_FAILS_ONCE")
if marker:
    import streamd.worker.pipeline as _p

    _orig, _calls = _p.Pipeline._on_results, [0]

    def _on_results(self, results):
        _calls[0] += 1
        if _calls[0] == 3 and not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError("injected failure of the result stage")
        return _orig(self, results)

    _p.Pipeline._on_results = _on_results
"""


def _run(tmp_path: Path, clip: Path, loop: bool) -> tuple[subprocess.Popen, str, Path, Path]:
    out, cfg, marker = tmp_path / "out.jsonl", tmp_path / "c.yaml", tmp_path / "failed-once"
    cfg.write_text(
        f"streams:\n  - id: a\n    url: {clip}\n    loop: {'true' if loop else 'false'}\n"
        "pipeline:\n  workers: 1\n  spare_worker: false\n  batch_size: 4\n"
        f"sinks:\n  - type: jsonl\n    path: {out}\n"
    )
    env = with_sitecustomize(tmp_path / "hook", INJECT, STREAMD_TEST_STAGE_FAILS_ONCE=str(marker))
    return start_streamd(cfg, env=env), "", out, marker


def _lines(out: Path) -> list[dict]:
    text = out.read_text() if out.exists() else ""
    return [json.loads(line) for line in text.splitlines() if line.endswith("}")]


def _rounded(dets: list[dict]) -> list[tuple]:
    return sorted((d["class_id"], d["score"], *d["box"]) for d in dets)


def _near(a: list[list[tuple]], b: list[list[tuple]]) -> bool:
    """Frame by frame: as many detections, same classes, scores within 1e-3, boxes within 0.5 px."""

    def same(p: tuple, q: tuple) -> bool:
        boxes = zip(p[2:], q[2:], strict=True)
        return p[0] == q[0] and abs(p[1] - q[1]) <= 1e-3 and all(abs(u - v) <= 0.5 for u, v in boxes)

    def frame(x: list[tuple], y: list[tuple]) -> bool:
        return len(x) == len(y) and all(map(same, x, y))

    return len(a) == len(b) and all(map(frame, a, b))


def _pictures(clip: Path) -> int:
    with av.open(str(clip)) as c:  # the clip's picture count, read apart from streamd
        return sum(1 for _ in c.decode(video=0))


def test_a_looped_file_restarts_with_its_worker_and_goes_on(tmp_path, short_clip):
    proc, _, out, marker = _run(tmp_path, short_clip, loop=True)
    pictures = _pictures(short_clip)
    deadline = time.monotonic() + 240
    want = 2 * pictures + pictures // 2
    while len(_lines(out)) < want and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert marker.exists(), stderr[-3000:]  # the stage did fail
    assert "pipeline stage collect failed" in stderr and "injected failure of the result stage" in stderr
    assert "died (exit code 70)" in stderr and "restarting in" in stderr, stderr[-3000:]
    lines = _lines(out)
    assert len(lines) >= want, stderr[-3000:]  # it went on, for two more passes
    # one numbering across both processes: no index twice, none skipped, time only forward
    assert [r["frame"] for r in lines] == list(range(len(lines)))
    assert all(b["pts"] > a["pts"] for a, b in itertools.pairwise(lines))
    # The first process wrote k lines (under half a pass; more under load: batches), then the second began
    # the file again and looped it: the same detections for the same pictures (CPU inference is
    # deterministic).
    # Compared to 0.5 px and 1e-3 of score: ONNX Runtime's sums differ in the last bits between batch sizes,
    # and a load-dependent partial batch moved a rounded score once (a CI flake).
    dets = [_rounded(r["detections"]) for r in lines]
    # The restart is the first line k where the lines start again as the first k did: compared over at most
    # min(8, k) lines, never past k (a first batch cut short under load made k 7, and lines 0-7 held the
    # second process's first picture: the search never matched, a CI failure found this session).
    k = next((i for i in range(1, pictures // 2) if _near(dets[i : i + min(8, i)], dets[: min(8, i)])), None)
    assert k is not None, f"no restart from the first picture; first frames {dets[:2]}, then {dets[4:12]}"
    assert _near(dets[k : 2 * k], dets[:k])  # the restart began at the first picture
    assert _near(dets[k + pictures : k + 2 * pictures], dets[k : k + pictures])  # and looped on
    assert proc.returncode == 0, stderr[-3000:]


def test_a_finite_file_is_not_run_twice_its_worker_ends_failed(tmp_path, short_clip):
    proc, _, out, marker = _run(tmp_path, short_clip, loop=False)
    _, stderr = proc.communicate(timeout=240)
    assert marker.exists() and "injected failure of the result stage" in stderr, stderr[-3000:]
    assert "died (exit code" not in stderr and "restarting in" not in stderr
    lines = _lines(out)
    assert 0 < len(lines) < _pictures(short_clip)  # what came before the failure, once
    assert [r["frame"] for r in lines] == list(range(len(lines)))
    assert proc.returncode == 1, stderr[-3000:]  # lost output shows in the exit status
