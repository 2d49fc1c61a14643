"""A stage that raises in a running worker (a bug, a broken engine) no longer leaves its streams dark for the
rest of the run: the worker exits (70) without Done and the supervisor restarts it as after a crash. Its
streams start again numbered after their newest line, as a moved stream does (``Supervisor._reload``): a
camera from now, a file from its first picture.

The failure is real, not simulated inside the daemon: a ``sitecustomize`` on PYTHONPATH makes the result
stage (``Pipeline._on_results``) raise at its third call in the first worker process only (a marker file)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import av

from tests.conftest import ROOT

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


def test_a_failed_stage_restarts_the_worker_and_its_stream_goes_on(tmp_path, short_clip):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(INJECT)
    out = tmp_path / "out.jsonl"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"streams:\n  - id: a\n    url: {short_clip}\n"
        "pipeline:\n  workers: 1\n  spare_worker: false\n  batch_size: 4\n"
        f"sinks:\n  - type: jsonl\n    path: {out}\n"
    )
    marker = tmp_path / "failed-once"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(hook), str(ROOT)]),
        "PYTHONUNBUFFERED": "1",
        "STREAMD_TEST_STAGE_FAILS_ONCE": str(marker),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "streamd", "run", str(cfg), "--no-status"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert marker.exists(), proc.stderr[-3000:]  # the stage did fail
    assert "pipeline stage collect failed" in proc.stderr
    assert "injected failure of the result stage" in proc.stderr
    assert "died (exit code 70)" in proc.stderr and "restarting in" in proc.stderr, proc.stderr[-3000:]
    with av.open(str(short_clip)) as clip:  # the clip's picture count, read apart from streamd
        pictures = sum(1 for _ in clip.decode(video=0))
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    # one numbering across both processes: no index twice, none skipped, time only forward
    assert [r["frame"] for r in lines] == list(range(len(lines)))
    assert all(b["pts"] > a["pts"] for a, b in itertools.pairwise(lines))
    # the first process wrote k lines, then the file ran again whole: its first k pictures twice, the same
    # detections both times (CPU inference is deterministic)
    k = len(lines) - pictures
    assert 1 <= k < pictures // 2, (len(lines), pictures)
    for first, again in zip(lines[:k], lines[k : 2 * k], strict=True):
        assert first["detections"] == again["detections"]
    assert proc.returncode == 0, proc.stderr[-3000:]
