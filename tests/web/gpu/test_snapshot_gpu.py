"""The status page's snapshot on the GPU path: NVDEC frames never reach the host except the one copied for a
request (at ingest, before the surface returns to its pool), and it shows the boxes. Skipped without CUDA,
torch or PyNvVideoCodec."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import cv2
import numpy as np
import pytest

from tests.conftest import CLIP, ROOT
from tests.test_reference_detections import NANODET_MODEL


def _reason() -> str | None:
    for module in ("torch", "PyNvVideoCodec", "cuda"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed"
    import torch

    return None if torch.cuda.is_available() else "no CUDA device"


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_reason() is not None, reason=str(_reason()))]


def test_nvdec_snapshot_is_copied_on_request_and_shows_boxes(tmp_path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = tmp_path / "gpu-web.yaml"
    cfg.write_text(
        f"streams:\n  - id: demo\n    url: {CLIP}\n    realtime: true\n    loop: true\n{NANODET_MODEL}"
        "engine:\n  type: torch\n  compile: false\npipeline:\n  decoder: nvdec\n"
        f"sinks:\n  - type: jsonl\n    path: {tmp_path / 'o.jsonl'}\n"
        f"metrics:\n  enabled: true\n  port: {port}\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamd", "run", str(cfg), "--no-status"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/streams/demo/snapshot.jpg"
    jpeg, metrics, deadline = b"", "", time.monotonic() + 300
    try:
        while time.monotonic() < deadline and not jpeg:
            try:
                jpeg = urllib.request.urlopen(url, timeout=5).read()
            except (urllib.error.HTTPError, OSError):
                time.sleep(1)
        with contextlib.suppress(OSError):
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    assert jpeg, f"no snapshot within 300 s: {err[-3000:]}"
    image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    box = (image[..., 1] > 180) & (image[..., 0] < 90) & (image[..., 2] < 90)
    print(
        f"GPU snapshot {image.shape[1]}x{image.shape[0]}, {int(box.sum())} box pixels, "
        f"mean {image.mean():.1f}"
    )
    assert image.shape == (576, 768, 3) and 40 < image.mean() < 220, "a real picture (NV12 -> BGR)"
    assert box.sum() > 200, "boxes drawn"
    gpu_lines = [x for x in metrics.splitlines() if x.startswith("streamd_gpu_")]
    print("\n".join(gpu_lines))
    if shutil.which("nvidia-smi"):  # GPU memory comes from nvidia-smi (the supervisor never touches CUDA)
        assert any(x.startswith("streamd_gpu_device_memory_used_bytes") for x in gpu_lines), metrics[-2000:]
    assert proc.returncode == 0, err[-3000:]
