"""Shared fixtures: repo paths and a helper to run the streamd CLI as a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "nanodet-coco.onnx"
CLIP = ROOT / "samples" / "vtest.mp4"
CLIP_HEVC = ROOT / "samples" / "vtest-hevc.mp4"
SCHEMA = ROOT / "streamd" / "data" / "result.schema.json"


def run_streamd(*args: str, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "streamd", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=kw.pop("cwd", ROOT),
        env=env,
        **kw,
    )


def start_streamd(config: Path, *extra: str) -> subprocess.Popen:
    """``streamd run CONFIG`` as a live subprocess (no status line, stdout discarded, stderr piped)."""
    return subprocess.Popen(
        [sys.executable, "-m", "streamd", "run", str(config), "--no-status", *extra],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


@pytest.fixture(scope="session")
def assets() -> None:
    missing = [p for p in (MODEL, CLIP, CLIP_HEVC) if not p.exists()]
    if missing:
        pytest.fail(f"bundled assets missing: {missing} (they are committed; see models/README.md)")


@pytest.fixture(scope="session")
def demo_run(assets) -> subprocess.CompletedProcess:
    """`streamd run` with no arguments: the bundled demo (configs/demo.yaml), JSON lines on stdout."""
    proc = run_streamd("run", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc
