"""Will the config fit the GPU's memory? ``streamd check`` estimates the device memory the daemon will hold on
each GPU — per worker process, per camera, per engine — and warns (a warning line, not a problem) when the
estimate passes the GPU's total. Nothing here touches CUDA: the total comes from NVML (nvidia-ml-py, if
importable) or ``nvidia-smi``; with neither (no GPU) the estimate is skipped with a note.

The constants are fitted to the H200 figures in bench/RESULTS.md (nvidia-smi per process, live 1080p30 H.264,
the bundled NanoDet, YOLOv8s and RT-DETR-l, fp16, torch engine, NVDEC); each constant names the rows it comes
from, and tests/test_memory_check.py holds the estimate to within 20 % of the measured rows. The estimate is a
sizing aid, not a promise.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from streamd.config import Config, StreamConfig

if TYPE_CHECKING:
    from streamd.ingest.sources.base import VideoInfo

# One worker process with nothing but its CUDA context, torch, the kernels and a small engine: the 14:37 row
# of bench/RESULTS.md's live table (1 stream, batch 4, after gc.freeze: 1,602 MB per worker), less that
# engine's activations at batch 4 (~60 MB by ACTIVATION_MB_PER_MPIX*).
WORKER_BASE_MB = 1550.0
# One 1080p camera on NVDEC (decoder surfaces, its frame queue, its share of the ring). Fitted (tenth
# session) to eight live rows of bench/RESULTS.md "Live density with real-size detectors" (YOLOv8s and
# RT-DETR-l at 640, 20-32 cameras per worker, nvidia-smi per process): (process - base - engine) / cameras =
# 24-72 MB. Scaled by pixel count for other sizes. Overloaded workers hold more (their queues full: 17.8 GB at
# 56 cameras per worker).
CAMERA_MB_1080P = 60.0
# Engine activations + CUDA graph pools per image of the batch, per megapixel of model input, fp16, as a line
# in the model's fp32 weight size (the ONNX file): bigger models have wider activations. Fitted to the live
# rows' batch-to-batch differences (≈ 130 MB/Mpix for YOLOv8s, 43 MB of weights; ≈ 250 for RT-DETR-l, 124 MB)
# and checked against bench_engines' engine peaks at batch 64: +37 % for YOLOv8s (3,437 vs 2,506 MB),
# −11 % for RT-DETR-l (6,441 vs 7,238); NanoDet (15 MB) at batch 32: 500 vs ≈ 330 MB (the estimate errs
# large). fp32 doubles it.
ACTIVATION_MB_PER_MPIX = 70.0
ACTIVATION_MB_PER_MPIX_PER_WEIGHT_MB = 1.4
# engine.compile (on by default) adds nothing: a compiled worker holds no more than an uncompiled one. The
# twenty-fourth session measured it side by side (bench/RESULTS.md "RT-DETR-l on an H100", item 2;
# bench_memory, YOLOv8s, 16 cameras, batch 32, one worker, H100): 4,148 MB compiled, 4,662 MB uncompiled,
# 4,232 MB estimated. The fifteenth session's compiled RT-DETR-l workers came within 5 % of the estimate too.
# The +2.5 GB the thirteenth session saw came before the fourteenth session's fix of a second, whole-graph
# compile at the first pipeline call.
# engine.shared: a decode worker (CUDA context, NVDEC, the preprocess kernel, its slots' rows; no engine). The
# sixteenth session's RT-DETR-l rows (bench/RESULTS.md "One engine process per GPU"): 1,798 MB at 15 cameras,
# 2,487-2,622 MB at 24-26, less CAMERA_MB_1080P each: 0.9-1.05 GB. The seventeenth session's bench_memory rows
# (NanoDet and YOLOv8s, 16/64/120 cameras, batch 32): workers of 16 cameras 1.9-2.2 GB, a spare (no camera)
# 0.7-1.0 GB. The engine process is a worker's base plus one engine at engine.max_batch (it merges the
# workers' batches; measured 2.3 GB NanoDet, 4.1 GB YOLOv8s, 6.1-6.4 GB RT-DETR-l); compiled it held less,
# not more (6.1 vs 6.4-6.7 GB).
SHARED_WORKER_MB = 1000.0
# A config whose estimate lies within this fraction of the total gets a note (allocator slack, other users).
HEADROOM = 0.9
PIXELS_1080P = 1920 * 1080
STREAMS_PER_WORKER = 16  # streamd.supervisor.pool's ``workers: auto`` rule (a test keeps the two equal)


@dataclass
class MemoryReport:
    """``warnings``: the config will not fit (a line each); ``notes``: the estimate, or why none was made."""

    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    per_device_mb: dict[int, float] = field(default_factory=dict)


def gpu_totals_mb() -> dict[int, float] | None:
    """Total memory per GPU index in MiB (NVML, else nvidia-smi); None when neither sees a GPU."""
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
            return {
                i: pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).total / 2**20
                for i in range(count)
            } or None
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # not installed, no driver, no device: ask nvidia-smi
        pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    totals = {}
    for line in out.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            try:
                totals[int(parts[0])] = float(parts[1])
            except ValueError:
                continue
    return totals or None


def worker_count(config: Config) -> int:
    """Worker processes ``run`` starts (pipeline.workers; ``auto`` as the supervisor resolves it on a GPU)."""
    n_streams = len(config.streams)
    want = config.pipeline.workers
    if want == "auto":
        want = min(math.ceil(n_streams / STREAMS_PER_WORKER), max(1, (os.cpu_count() or 1) // 2))
    return max(1, min(int(want), n_streams))


def camera_pixels(config: Config) -> list[int]:
    """Pixels per stream: a file's own size (read from its header), else 1080p (a live stream's size is only
    known once it sends pictures)."""
    headers = file_headers(config)
    return [(info.width * info.height if info else 0) or PIXELS_1080P for info in headers]


def file_headers(config: Config) -> list[VideoInfo | None]:
    """Each stream file's header (size, rate), read once per file; None for a camera (known only once it sends
    pictures) or a file that does not open."""
    headers: dict[Path, VideoInfo | None] = {}
    out: list[VideoInfo | None] = []
    for stream in config.streams:
        if stream.is_live or stream.path is None:
            out.append(None)
            continue
        if stream.path not in headers:
            headers[stream.path] = _header(stream)
        out.append(headers[stream.path])
    return out


def _header(stream: StreamConfig) -> VideoInfo | None:
    from streamd.ingest.sources import SourceError, open_stream

    try:
        demuxer = open_stream(stream)
    except SourceError:
        return None
    try:
        return demuxer.info
    finally:
        demuxer.close()


def engine_mb(config: Config) -> float:
    """One engine in one worker: weights (the ONNX file's size, halved at 16 bits) plus activations and graph
    pools per lane at max batch."""
    e, m = config.engine, config.model
    try:
        file_mb = os.path.getsize(m.path) / 2**20
    except OSError:  # check --no-model: the file may not be here
        file_mb = 0.0
    bits16 = e.precision in ("fp16", "bf16", "int8")
    batch = max(config.pipeline.batch_size, 1)
    return engine_mb_for(file_mb, m.input_size, batch, e.lanes, bits16)


def engine_mb_for(
    file_mb: float, input_size: tuple[int, int], batch: int, lanes: int, bits16: bool = True
) -> float:
    """``engine_mb`` from the numbers it reads: the ONNX file's MiB, model.input_size, batch, engine.lanes."""
    w, h = input_size
    per_mpix = ACTIVATION_MB_PER_MPIX + ACTIVATION_MB_PER_MPIX_PER_WEIGHT_MB * file_mb
    per_image = per_mpix * (w * h / 1e6) * (1.0 if bits16 else 2.0)
    return file_mb * (0.5 if bits16 else 1.0) + per_image * batch * lanes


def worker_mb(engine: float, pixels: list[int]) -> float:
    """One worker process: its base, its engine, its cameras (pixels per camera)."""
    return WORKER_BASE_MB + engine + sum(CAMERA_MB_1080P * p / PIXELS_1080P for p in pixels)


def estimate(config: Config, pixels: list[int] | None = None) -> dict[int, float]:
    """Estimated MiB per CUDA device: workers round robin over the devices as ``run`` places them, each with
    its base, its engine and its cameras; plus the spare worker per device in use (2+ workers)."""
    pixels = camera_pixels(config) if pixels is None else pixels
    n = worker_count(config)
    devices = config.pipeline.devices or (config.engine.device,)
    shared = config.engine.shared
    engine = 0.0 if shared else engine_mb(config)
    base = SHARED_WORKER_MB if shared else WORKER_BASE_MB
    per_device: dict[int, float] = {}
    for k in range(n):
        mb = worker_mb(engine, pixels[k::n]) - WORKER_BASE_MB + base
        dev = devices[k % len(devices)]
        per_device[dev] = per_device.get(dev, 0.0) + mb
    used = set(devices[k % len(devices)] for k in range(n))
    if n >= 2 and config.pipeline.spare_worker:
        for dev in used:
            per_device[dev] += base + engine
    for dev in used if shared else ():  # one engine process per GPU in use
        per_device[dev] += engine_process_mb(config)
    return per_device


def engine_process_mb(config: Config) -> float:
    """engine.shared: the engine process of one GPU, its engine at engine.max_batch."""
    e, m = config.engine, config.model
    try:
        file_mb = os.path.getsize(m.path) / 2**20
    except OSError:
        file_mb = 0.0
    bits16 = e.precision in ("fp16", "bf16", "int8")
    return WORKER_BASE_MB + engine_mb_for(file_mb, m.input_size, e.max_batch, e.lanes, bits16)


def mps_pipe() -> Path | None:
    """The NVIDIA MPS control daemon's pipe this process would use (``$CUDA_MPS_PIPE_DIRECTORY``, else
    ``/tmp/nvidia-mps``), None when there is none or it cannot be seen. A path check only (a socket left by a
    killed daemon passes too): CUDA is never loaded here."""
    folder = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps")
    control = folder / "control"
    try:
        return control if control.is_socket() else None
    except OSError:  # a folder this user may not read (a daemon run by root, 0700): as if none
        return None


def check_memory(
    config: Config, totals: Callable[[], dict[int, float] | None] = gpu_totals_mb
) -> MemoryReport:
    """The estimate against each GPU's total (``totals``: MiB per device index; tests pass their own), and
    whether workers sharing a GPU will run under NVIDIA MPS."""
    report = MemoryReport()
    if config.engine.type == "onnxruntime" and config.pipeline.decoder == "cpu":
        return report  # nothing of ours on a GPU
    sizes = totals()
    if not sizes:
        report.notes.append("no GPU visible (NVML / nvidia-smi): GPU memory estimate skipped")
        return report
    report.per_device_mb = estimate(config)
    workers = worker_count(config)
    shared_mb: dict[int, float] = {}
    if not config.engine.shared and workers >= 2 and config.engine.type in ("auto", "torch", "tensorrt"):
        # one engine per GPU instead of one per worker: what the same config would need with engine.shared
        as_shared = dataclasses.replace(config, engine=dataclasses.replace(config.engine, shared=True))
        shared_mb = estimate(as_shared)
    for dev, mb in sorted(report.per_device_mb.items()):
        total = sizes.get(dev)
        if total is None:
            continue  # a device that does not exist is the engine's config error at run
        text = (
            f"GPU {dev}: estimated {mb / 1024:.1f} GiB of {total / 1024:.1f} GiB for {len(config.streams)} "
            f"stream(s) over {workers} worker(s) ({_parts(config)} + ≈{CAMERA_MB_1080P:.0f} MiB per 1080p "
            "camera)"
        )
        fits_shared = ""
        if dev in shared_mb and shared_mb[dev] <= HEADROOM * total:
            fits_shared = (
                f"; with engine.shared: true (one engine process per GPU) it is estimated at "
                f"{shared_mb[dev] / 1024:.1f} GiB"
            )
        if mb > total:
            report.warnings.append(
                f"{text}: will not fit; use fewer streams or workers (pipeline.workers), a smaller "
                "pipeline.batch_size or model.input_size, pipeline.spare_worker: false, or more GPUs "
                f"(pipeline.devices){fits_shared}"
            )
        elif mb > HEADROOM * total:
            report.notes.append(f"{text}: little headroom{fits_shared}")
        else:
            report.notes.append(text)
    _note_mps(config, workers, report)
    return report


def _parts(config: Config) -> str:
    if config.engine.shared:
        return (
            f"≈{SHARED_WORKER_MB / 1024:.1f} GiB per worker + {engine_process_mb(config) / 1024:.1f} GiB "
            "per GPU for the shared engine process"
        )
    return f"≈{WORKER_BASE_MB / 1024:.1f} GiB per worker + {engine_mb(config):.0f} MiB engine"


def _note_mps(config: Config, workers: int, report: MemoryReport) -> None:
    """Several workers on one GPU time-slice it unless MPS runs: a note saying which (README "Sizing a box",
    item 7: 120 compiled YOLOv8s cameras in 5 workers, p99 1.0 s without MPS, 87 ms with it)."""
    devices = config.pipeline.devices or (config.engine.device,)
    shared = -(-workers // len(devices))  # round robin: the first GPU gets the most
    if shared < 2 or config.engine.type == "onnxruntime":
        return
    pipe = mps_pipe()
    if pipe is not None:
        report.notes.append(f"NVIDIA MPS control pipe in {pipe.parent}: workers sharing a GPU run at once")
    else:
        folder = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps"
        report.notes.append(
            f"up to {shared} workers share a GPU and NVIDIA MPS is not running (no control pipe in "
            f"{folder}): they will time-slice it, with little headroom near the engine's limit; "
            "docs/service.md says how to run MPS with the service"
        )
