"""`streamd check` adds up the frames a second each worker process will decode and warns when one worker's
share passes what a worker carries on the GPU path (README "Sizing a box", item 2): the rates from the
streams' own files (PyAV reads the container independently), cameras at 30 fps, unpaced files left out."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import av
import pytest

from streamd.checks.load import CAMERA_FPS, WORKER_DECODE_FPS, check_load, stream_rates
from streamd.config import load_config
from tests.conftest import CLIP, ROOT

MODEL = ROOT / "models" / "nanodet-coco.onnx"


def _config(tmp_path: Path, streams: str, workers: str, engine: str = "torch"):
    text = (
        f"streams:\n{streams}model:\n  path: {MODEL}\nengine:\n  type: {engine}\n"
        f"pipeline:\n  workers: {workers}\n  batch_size: 8\n"
    )
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return load_config(path), path


def _cameras(n: int, extra: str = "") -> str:
    return "".join(f"  - id: c{i}\n    url: rtsp://127.0.0.1:8554/cam{i}\n{extra}" for i in range(n))


def test_stream_rates_come_from_the_files_and_cameras_count_at_30(tmp_path) -> None:
    with av.open(str(CLIP)) as container:  # the container's own average rate, read by another demuxer
        clip_fps = float(container.streams.video[0].average_rate)
    streams = (
        _cameras(1)
        + f"  - id: paced\n    url: {CLIP}\n    realtime: true\n"
        + f"  - id: unpaced\n    url: {CLIP}\n"
    )
    config, _ = _config(tmp_path, streams, "1")
    rates = stream_rates(config)
    assert rates[0] == CAMERA_FPS and rates[2] is None
    assert rates[1] == pytest.approx(clip_fps, rel=1e-3)


def test_a_worker_past_what_one_carries_is_warned_with_the_workers_it_needs(tmp_path) -> None:
    """168 cameras at 30 fps with detect_fps 10 (every frame still decoded): in 3 workers each decodes 1,680
    frames/s, what the twenty-fifth session saw 3 workers fail to carry on an H100 (4,428 of 5,040); in 6,
    840 each, which they carried."""
    streams = _cameras(168, "    detect_fps: 10\n")
    three, _ = _config(tmp_path, streams, "3")
    (warning,) = check_load(three, [CAMERA_FPS] * 168)
    assert "worker 0 would decode ≈ 1,680 frames/s (56 stream(s)" in warning
    assert f"carries ≈ {WORKER_DECODE_FPS:,.0f}" in warning
    assert "set pipeline.workers to 6 or more for these 5,040 frames/s" in warning
    six, _ = _config(tmp_path, streams, "6")
    assert check_load(six, [CAMERA_FPS] * 168) == []
    # round robin in config order: the busiest worker is the one with the most or fastest streams
    mixed, _ = _config(tmp_path, _cameras(4), "2")
    (warning,) = check_load(mixed, [25.0, 460.0, 25.0, 460.0])  # worker 1: two 460 fps streams
    assert "worker 1 would decode ≈ 920 frames/s (2 stream(s)" in warning
    assert "set pipeline.workers to 2 or more" in warning
    (alone,) = check_load(mixed, [950.0, 25.0, 25.0, 25.0])  # no worker count helps one stream this fast
    assert "worker 0 would decode ≈ 975" in alone and "one stream alone decodes ≈ 950" in alone
    assert "set pipeline.workers" not in alone


def test_unpaced_files_and_the_cpu_path_are_left_out(tmp_path) -> None:
    config, _ = _config(tmp_path, _cameras(40), "1")
    assert check_load(config, [None] * 40) == []  # files read as fast as they decode: no real time to keep
    cpu, _ = _config(tmp_path, _cameras(40), "1", engine="onnxruntime")
    assert check_load(cpu, [CAMERA_FPS] * 40) == []  # the CPU path has its own (lower) limits
    assert len(check_load(config, [CAMERA_FPS] * 40)) == 1  # the same cameras on the GPU path


@pytest.mark.skipif(importlib.util.find_spec("pynvml") is not None, reason="NVML would answer, not the fake")
def test_check_warns_when_a_gpu_is_visible(tmp_path) -> None:
    """The whole command: with a fake nvidia-smi (an 80 GiB GPU) `streamd check` warns and still says OK; with
    no GPU visible (the CPU box as it is) it makes no GPU-path claim."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, 81920'\n")
    smi.chmod(0o755)
    _, cfg = _config(tmp_path, _cameras(40), "1")
    for path, warned in ((f"{bin_dir}:{os.environ['PATH']}", True), (os.environ["PATH"], False)):
        env = {**os.environ, "PATH": path, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.run(
            [sys.executable, "-m", "streamd", "check", str(cfg)],
            cwd=ROOT, capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert ("warning: pipeline.workers: worker 0 would decode ≈ 1,200 frames/s" in proc.stderr) == warned
        assert ": OK (40 stream(s)" in proc.stderr.strip().splitlines()[-1], proc.stderr
