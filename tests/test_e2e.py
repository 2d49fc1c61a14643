"""End to end on the CPU path: the real daemon as a subprocess, the real clips and model, JSON out."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import jsonschema
import pytest

from tests.conftest import CLIP, CLIP_HEVC, ROOT, SCHEMA, run_streamd
from tests.test_reference_detections import write_config


def _frames_of(path: str) -> int:
    import av

    with av.open(path) as c:
        return sum(1 for _ in c.decode(video=0))


def test_demo_prints_one_valid_line_per_frame(demo_run) -> None:
    lines = demo_run.stdout.splitlines()
    expected = _frames_of(str(CLIP))
    assert expected == 795
    assert len(lines) == expected
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()))
    records = [json.loads(line) for line in lines]
    for r in records:
        validator.validate(r)
    assert [r["frame"] for r in records] == list(range(expected))
    assert all(r["stream"] == "demo" for r in records)
    with_person = sum(any(d["label"] == "person" for d in r["detections"]) for r in records)
    assert with_person / expected > 0.8, f"persons in only {with_person}/{expected} frames"
    pts = [r["pts"] for r in records]
    assert pts == sorted(pts) and pts[1] - pts[0] == pytest.approx(0.1, abs=1e-3)  # 10 fps clip


def test_two_streams_h264_and_hevc_complete_and_ordered(tmp_path, assets, short_clip) -> None:
    out = tmp_path / "two.jsonl"
    cfg = tmp_path / "two.yaml"
    write_config(cfg, f"  - id: h264\n    url: {short_clip}\n  - id: hevc\n    url: {CLIP_HEVC}", out)
    proc = run_streamd("run", str(cfg), "--no-status", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    for sid, clip in (("h264", short_clip), ("hevc", CLIP_HEVC)):
        frames = [r["frame"] for r in records if r["stream"] == sid]
        assert frames == list(range(_frames_of(str(clip)))), sid
        assert sum(len(r["detections"]) for r in records if r["stream"] == sid) > len(frames)
    # Both streams are interleaved in the output (cross-stream batching), not run one after the other.
    first_hevc = next(i for i, r in enumerate(records) if r["stream"] == "hevc")
    assert first_hevc < 50


def test_sigint_stops_cleanly_and_flushes(tmp_path, assets) -> None:
    out = tmp_path / "live.jsonl"
    cfg = tmp_path / "live.yaml"
    write_config(cfg, f"  - id: cam\n    url: {CLIP}\n    realtime: true\n    loop: true", out)
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamd", "run", str(cfg), "--no-status"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not out.exists() or out.stat().st_size < 2000):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err[-2000:]
    lines = out.read_text().splitlines()
    assert lines and all(line.endswith("}") for line in lines)  # every line complete
    frames = [json.loads(line)["frame"] for line in lines]
    assert frames == sorted(frames) and len(set(frames)) == len(frames)
    assert "done:" in err
