"""Will each worker process keep up with its streams' decoding? ``streamd check`` adds up the frames a second
each worker will decode — every frame of a live or real-time stream, whatever its ``detect_fps`` — and warns
(a warning line, not a problem) when a worker's share passes what one worker process carries on the GPU path.

Streams go to workers round robin in config order, as the supervisor places them (``plan_workers``). A
stream file's rate comes from its container; a camera's is only known once it sends pictures, so 30 fps is
assumed. An unpaced file (``realtime: false``, not a camera) decodes as fast as it can and has no real time to
keep up with: it is left out. Nothing here touches CUDA or contacts a camera.
"""

from __future__ import annotations

import math

from streamd.checks.memory import file_headers, worker_count
from streamd.config import Config

# Decoded frames a second one worker process carries on the GPU path (NVDEC, torch engine): README "Sizing a
# box", item 2 (700-900, about one core of Python per worker). Measured again in the twenty-fifth session
# (bench/RESULTS.md "`detect_fps: 10` at scale on HEVC cameras", H100): 28 HEVC cameras per worker (840
# frames/s) kept every frame; 56 per worker (1,680 frames/s) delivered 4,428 of 5,040 frames/s in 3 workers,
# with 12,183 frames dropped in 20 s.
WORKER_DECODE_FPS = 900.0
CAMERA_FPS = 30.0  # a live camera's rate before it sends: the common 1080p30


def stream_rates(config: Config) -> list[float | None]:
    """Frames a second each stream makes the daemon decode in real time; None for an unpaced file."""
    out: list[float | None] = []
    for stream, info in zip(config.streams, file_headers(config), strict=True):
        fps = info.fps if info is not None else None
        if not stream.is_live and not stream.realtime:
            out.append(None)
        elif fps and math.isfinite(fps) and fps > 0:
            out.append(fps)
        else:
            out.append(CAMERA_FPS)
    return out


def check_load(config: Config, rates: list[float | None] | None = None) -> list[str]:
    """Warnings (one line) when a worker would decode more frames a second than one carries; none with the
    CPU engine (``engine.type: onnxruntime``), whose own, lower limits README "Sizing a box" gives.
    ``rates``: per stream, as ``stream_rates`` gives them (tests pass their own)."""
    if config.engine.type == "onnxruntime":
        return []
    rates = stream_rates(config) if rates is None else rates
    workers = worker_count(config)
    per_worker = [0.0] * workers
    counts = [0] * workers
    for k, rate in enumerate(rates):
        if rate is not None:
            per_worker[k % workers] += rate
            counts[k % workers] += 1
    busiest = max(range(workers), key=per_worker.__getitem__)
    if per_worker[busiest] <= WORKER_DECODE_FPS:
        return []
    total = sum(per_worker)
    said = (
        f"pipeline.workers: worker {busiest} would decode ≈ {per_worker[busiest]:,.0f} frames/s "
        f"({counts[busiest]} stream(s); every frame is decoded, whatever detect_fps), and one worker process "
        f'carries ≈ {WORKER_DECODE_FPS:,.0f} (README "Sizing a box", item 2; cameras counted at '
        f"{CAMERA_FPS:g} fps)"
    )
    fastest = max(r for r in rates if r is not None)
    if fastest > WORKER_DECODE_FPS:  # no worker count helps a stream that alone is more
        return [f"{said}: one stream alone decodes ≈ {fastest:,.0f}; lower its frame rate at the source"]
    need = math.ceil(total / WORKER_DECODE_FPS)
    return [f"{said}: set pipeline.workers to {need} or more for these {total:,.0f} frames/s (a core each)"]
