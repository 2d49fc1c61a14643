"""Workers spread over two GPUs (``pipeline.devices: [0, 1]``, two workers). Checked from outside the daemon:
nvidia-smi's per-process accounting, sampled while it runs, must show each worker process on exactly one GPU,
the two workers on different GPUs, and the supervisor on none (it never touches CUDA); and the streams the
second GPU carries must give the detections the first gives for the same clip. Skipped with fewer than two
CUDA devices or without nvidia-smi."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections import defaultdict

import pytest

from tests.conftest import CLIP, CLIP_HEVC, start_streamd
from tests.pipeline.gpu.test_gpu_pipeline_gpu import _cuda_reason, iou
from tests.test_reference_detections import NANODET_MODEL


def _skip_reason() -> str | None:
    why = _cuda_reason()
    if why is not None:
        return why
    import torch

    if torch.cuda.device_count() < 2:
        return f"{torch.cuda.device_count()} CUDA device(s); this test needs two"
    if shutil.which("nvidia-smi") is None:
        return "nvidia-smi is not installed"
    return None


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))]


def _smi(query: str) -> list[list[str]]:
    out = subprocess.run(
        ["nvidia-smi", f"--query-{query}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=10,
    )
    return [[p.strip() for p in line.split(",")] for line in out.stdout.splitlines() if line.strip()]


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children[ppid].append(int(entry))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        for child in children[pid]:
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _sample_gpus(daemon: subprocess.Popen, seen: dict[int, set[int]], stop: threading.Event) -> None:
    """Until ``stop``: which GPU index each process of the daemon (supervisor included) holds memory on."""
    index_of = {uuid: int(index) for index, uuid in _smi("gpu=index,uuid")}
    while not stop.is_set():
        ours = _descendants(daemon.pid) | {daemon.pid}
        for pid, uuid in _smi("compute-apps=pid,gpu_uuid"):
            if int(pid) in ours:
                seen.setdefault(int(pid), set()).add(index_of[uuid])
        stop.wait(0.3)


def test_workers_spread_over_two_gpus(tmp_path) -> None:
    out = tmp_path / "two-gpus.jsonl"
    cfg = tmp_path / "two-gpus.yaml"
    # Round robin: stream i goes to worker i % 2, worker k to device k. The HEVC streams are paced (10 s) so
    # both workers stay on their GPUs long enough to be sampled.
    streams = "".join(
        f"  - id: {sid}\n    url: {url}\n    realtime: {'true' if 'hevc' in sid else 'false'}\n"
        for sid, url in (("h264-a", CLIP), ("h264-b", CLIP), ("hevc-a", CLIP_HEVC), ("hevc-b", CLIP_HEVC))
    )
    cfg.write_text(
        f"streams:\n{streams}{NANODET_MODEL}engine:\n  type: torch\n  precision: fp32\n  max_batch: 16\n"
        "  compile: false\n"
        "pipeline:\n  batch_size: 16\n  workers: 2\n  devices: [0, 1]\n  spare_worker: false\n"
        f"sinks:\n  - type: jsonl\n    path: {out}\n"
    )
    daemon = start_streamd(cfg)
    seen: dict[int, set[int]] = {}
    stop = threading.Event()
    sampler = threading.Thread(target=_sample_gpus, args=(daemon, seen, stop), daemon=True)
    sampler.start()
    try:
        _, stderr = daemon.communicate(timeout=600)
    finally:
        stop.set()
        sampler.join(timeout=15)
        if daemon.poll() is None:
            daemon.kill()
    assert daemon.returncode == 0, stderr[-4000:]
    print(f"GPU indices per daemon process (nvidia-smi): {seen}")
    assert daemon.pid not in seen, f"the supervisor holds GPU memory: {seen}"
    assert len(seen) == 2 and all(len(gpus) == 1 for gpus in seen.values()), seen
    assert set().union(*seen.values()) == {0, 1}, seen

    by_stream: dict[str, dict[int, list[dict]]] = defaultdict(dict)
    for line in out.read_text().splitlines():
        r = json.loads(line)
        by_stream[r["stream"]][r["frame"]] = r["detections"]
    counts = {s: len(f) for s, f in by_stream.items()}
    assert counts == {"h264-a": 795, "h264-b": 795, "hevc-a": 100, "hevc-b": 100}
    matched = total = 0
    for first, second in (("h264-a", "h264-b"), ("hevc-a", "hevc-b")):
        for index, ref in by_stream[first].items():
            got = by_stream[second][index]
            for d in ref:
                if d["score"] < 0.4:  # near the 0.35 threshold a detection may flip between algorithms
                    continue
                total += 1
                same_class = [g["box"] for g in got if g["class_id"] == d["class_id"]]
                best = max((iou(d["box"], box) for box in same_class), default=0.0)
                matched += best >= 0.95
    print(f"GPU 0 vs GPU 1, same clips: {matched}/{total} detections matched (IoU >= 0.95)")
    assert total > 3000 and matched / total >= 0.99
