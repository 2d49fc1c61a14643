"""A daemon with one stream survives that stream being changed by a reload: the worker's only stream is
replaced in place (its queue closes before its successor's joins the batcher, which must not read as "every
stream ended"); frame numbers continue from where the old stream stopped."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import CLIP, MODEL, ROOT


def _config(path: Path, out: Path, detect_fps: int) -> None:
    path.write_text(
        f"streams:\n  - id: only\n    url: {CLIP}\n    realtime: true\n    loop: true\n"
        f"    detect_fps: {detect_fps}\nmodel:\n  path: {MODEL}\npipeline:\n  workers: 1\n"
        f"sinks:\n  - type: jsonl\n    path: {out}\n"
    )


def _frames(out: Path) -> list[int]:
    if not out.exists():
        return []
    lines = [json.loads(x) for x in out.read_text().splitlines() if x.endswith("}")]
    return [r["frame"] for r in lines if "type" not in r]


def test_changing_the_only_stream_keeps_the_daemon_running(tmp_path: Path, assets) -> None:
    out, cfg, run_dir = tmp_path / "out.jsonl", tmp_path / "one.yaml", tmp_path / "run"
    run_dir.mkdir()
    _config(cfg, out, 2)
    env = {**os.environ, "RUNTIME_DIRECTORY": str(run_dir), "PYTHONUNBUFFERED": "1"}
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamd", "run", str(cfg), "--no-status"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while len(_frames(out)) < 20:
            assert proc.poll() is None and time.monotonic() < deadline, err_path.read_text()[-3000:]
            time.sleep(0.2)
        for fps in (3, 2):
            _config(cfg, out, fps)
            cmd = [sys.executable, "-m", "streamd", "reload", "--pid", str(proc.pid), "--timeout", "60"]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=90)
            assert done.returncode == 0, done.stderr + err_path.read_text()[-3000:]
            before = len(_frames(out))
            deadline = time.monotonic() + 30
            while len(_frames(out)) < before + 15:  # the changed stream writes on
                assert proc.poll() is None, "the daemon ended: " + err_path.read_text()[-3000:]
                assert time.monotonic() < deadline, err_path.read_text()[-3000:]
                time.sleep(0.2)
        frames = _frames(out)
        assert frames == sorted(frames) and len(set(frames)) == len(frames), "frame numbers go back or repeat"
        steps = [b - a for a, b in itertools.pairwise(frames)]
        # detect_fps 2 or 3 on a 10 fps clip: a line every 3–5 frames; a lost stretch would show as more
        assert max(steps) <= 10, f"a gap of {max(steps)} frames across the reloads"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
