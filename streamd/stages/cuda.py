"""The three-stream GPU implementation of the slot contract (``streamd.stages.contract.Stages``).

Per slot: the engine's input tensor and output tensor, the NMS results (device) and their pinned host copy,
and events E0..E3. For each batch the scheduler's stage threads only *enqueue*:

    S1: wait for each frame's decode event, preprocess kernel (NV12/BGR -> NCHW) into the slot's input, E1
    S2: wait E1, engine.enqueue(input -> output), E2
    S3: wait E2, decode + NMS kernels, one D2H copy of counts + [B, max_det, 6] into pinned memory, E3
    host (collect thread): E3.synchronize() (a blocking-sync event: the thread sleeps, no spin)

so while batch n is in NMS, n+1 is in the engine and n+2 in preprocess. An engine with ``lanes`` > 1 (two
batches in inference at once, each with its own scratch) gets one S2 stream per lane; slot k always uses
lane k % lanes, so its graphs are captured once, and consecutive batches (consecutive slots) alternate lanes.
A slot is reused only after the host read its results. Decoder surfaces go back to their pool as soon as
the preprocess kernel (their last reader) is enqueued: ``release(S1)`` makes the decoder's stream wait for
it, so nothing blocks on the host.
S1 itself (NVDEC surfaces in place, CPU-decoded frames packed and uploaded) is ``stages.cuda_input.GpuInput``,
which a decode worker of a shared engine runs on its own (``streamd.shared_engine``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from streamd.engines.base import Engine
from streamd.gpu.cuda import Context, DeviceBuffer, Event, Stream
from streamd.gpu.kernels import KernelLoader
from streamd.stages.contract import Slot
from streamd.stages.cuda_input import DTYPE_NAMES, GpuInput, Staging
from streamd.stages.postprocess.cpu import PostprocessSpec, set_stream_classes
from streamd.stages.postprocess.cuda import GpuPostprocessor, HostNmsResults, NmsResults
from streamd.stages.preprocess.spec import PreprocessSpec
from streamd.types import Detections

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _GpuBuffers:
    input: DeviceBuffer
    output: DeviceBuffer
    results: NmsResults
    host: HostNmsResults
    events: tuple[Event, Event, Event, Event]  # E0 (start), E1, E2, E3; timing events for per-stage times
    s2: Stream  # the engine lane's stream this slot's inference runs on
    staging: Staging = field(default_factory=Staging)  # uploads of CPU-decoded frames


def batch_buckets(top: int, unit: int = 1, step: int = 0) -> list[int]:
    """The batch sizes the engine runs, up to ``top``: ``unit`` (a model's fixed batch, else 1) times powers
    of two, and with ``step`` (engine.batch_step) every multiple of ``step`` too. A partial batch runs at the
    next size up. Powers alone leave a merged batch of 40-56 rows (the shared engine) to run as 64 or be cut
    to 32 (``shared_engine.server.fullest_prefix``); multiples of the workers' batch run it as it is."""
    sizes = {min(unit << k, top) for k in range(top.bit_length() + 1)}
    if step > 0:
        step = -(-step // unit) * unit  # a fixed-batch model runs whole multiples of its batch
        sizes |= set(range(step, top + 1, step)) | {top}
    return sorted(sizes)


class GpuStages:
    def __init__(
        self,
        engine: Engine,
        pre: PreprocessSpec,
        post: PostprocessSpec,
        device: int = 0,
        warm_batch: int = 0,
        batch_step: int = 0,
    ) -> None:
        """``warm_batch``: the pipeline's batch size; every engine batch size up to it is run once per slot
        when the slot is made, so CUDA graph capture and cuDNN autotuning happen before the first frame.
        ``batch_step``: engine.batch_step (``batch_buckets``)."""
        if not engine.on_device:
            raise ValueError(f"GpuStages needs a GPU engine, got {engine.name}")
        self.engine = engine
        self.ctx = Context(device)
        self.loader = KernelLoader(self.ctx)
        lo, hi = self.ctx.priority_range()
        # Later stages get higher priority so finished work drains before new work is admitted.
        self.s1, self.s3 = Stream(self.ctx, lo), Stream(self.ctx, hi)
        lanes = max(1, int(getattr(engine, "lanes", 1)))  # an engine without lanes runs one call at a time
        self.s2_lanes = [Stream(self.ctx, (lo + hi) // 2) for _ in range(lanes)]
        in_dtype = np.dtype(engine.input_dtype)
        out_dtype = np.dtype(engine.output_dtype)
        self.max_batch = engine.max_batch
        self.input = GpuInput(
            pre, self.ctx, self.loader, self.s1, max_batch=self.max_batch, dtype=DTYPE_NAMES[in_dtype]
        )
        out_shape = engine.output_shape
        if post.head is not None:
            num_anchors = post.head.candidates
        else:
            num_anchors = out_shape[2] if post.layout == "yolov8" else out_shape[1]
        self.post = GpuPostprocessor(
            post,
            self.ctx,
            max_batch=self.max_batch,
            num_anchors=num_anchors,
            dtype=DTYPE_NAMES[out_dtype],
            loader=self.loader,
        )
        self._in_bytes = int(np.prod(engine.input_shape)) * in_dtype.itemsize
        self._out_bytes = int(np.prod(out_shape[1:])) * out_dtype.itemsize
        self._buffers: list[_GpuBuffers] = []
        # The engine runs at a few batch sizes only (powers of two up to the pipeline batch; times N for a
        # model whose batch is fixed at N, which runs N rows per call): partial batches are rounded up, the
        # extra rows are ignored by postprocess. Each size is captured (CUDA graph) and autotuned once per
        # slot at start-up, never while streams run.
        unit = int(getattr(engine, "pinned_batch", 1))
        top = min(warm_batch or self.max_batch, self.max_batch)
        top = min(-(-top // unit) * unit, self.max_batch)
        self.buckets = batch_buckets(top, unit, batch_step)
        self._warm = warm_batch > 0

    def new_slot(self, index: int) -> Slot:
        b = self.max_batch
        events = (
            Event(timing=True),
            Event(timing=True),
            Event(timing=True),
            Event(timing=True, blocking=True),
        )
        buffers = _GpuBuffers(
            DeviceBuffer(b * self._in_bytes),
            DeviceBuffer(b * self._out_bytes),
            self.post.new_results(),
            self.post.new_host_results(),
            events,
            self.s2_lanes[index % len(self.s2_lanes)],
        )
        self._buffers.append(buffers)
        if self._warm:
            self.ctx.activate()
            s2 = buffers.s2
            buffers.input.fill_u8(0, s2)
            for size in self.buckets:
                self.engine.enqueue(buffers.input.ptr, buffers.output.ptr, size, s2)
            s2.synchronize()
        return Slot(index, buffers=buffers)

    def preprocess(self, slot: Slot) -> None:
        self.ctx.ensure_current()
        buf: _GpuBuffers = slot.buffers  # type: ignore[assignment]
        buf.events[0].record(self.s1)
        slot.transforms = self.input(slot.frames, buf.staging, buf.input.ptr)
        buf.events[1].record(self.s1)

    def infer(self, slot: Slot) -> None:
        self.ctx.ensure_current()
        buf: _GpuBuffers = slot.buffers  # type: ignore[assignment]
        buf.s2.wait(buf.events[1])
        n = len(slot.frames)
        size = next((b for b in self.buckets if b >= n), n)
        self.engine.enqueue(buf.input.ptr, buf.output.ptr, size, buf.s2)
        buf.events[2].record(buf.s2)

    def postprocess(self, slot: Slot) -> None:
        self.ctx.ensure_current()
        buf: _GpuBuffers = slot.buffers  # type: ignore[assignment]
        self.s3.wait(buf.events[2])
        n = len(slot.frames)
        self.post(buf.output.ptr, n, self.s3, buf.results, [f.stream_id for f in slot.frames])
        buf.results.download(buf.host, self.s3, n)
        buf.events[3].record(self.s3)

    def collect(self, slot: Slot) -> list[Detections]:
        self.ctx.ensure_current()
        buf: _GpuBuffers = slot.buffers  # type: ignore[assignment]
        t = time.perf_counter()
        e0, e1, e2, e3 = buf.events
        e3.synchronize()
        slot.stage_ms.update(
            preprocess=e0.elapsed_ms(e1),
            infer=e1.elapsed_ms(e2),
            postprocess=e2.elapsed_ms(e3),
            host_wait=(time.perf_counter() - t) * 1e3,
        )
        frames = slot.frames
        return buf.host.source_detections(slot.transforms, [(f.width, f.height) for f in frames])

    def set_classes(self, stream_id: str, thresholds: Sequence[float] | None) -> None:
        set_stream_classes(self.post.spec, stream_id, thresholds)

    def warmed(self) -> None:
        """The engine gives back what only start-up used (torch: the start-up check's max-batch staging
        buffers, and what the caching allocator holds free; each CUDA graph capture already empties it, so
        after the last one that is mostly the staging). Not for an engine that runs eagerly (no graphs, or a
        capture failed): its next batch would allocate its activations again, on the live path. An
        optimisation only: a failure is logged, never fatal. STREAMD_KEEP_ALLOCATOR_CACHE=1 keeps it all
        (bench/bench_memory.py's before/after)."""
        release = getattr(self.engine, "release_unused", None)
        if release is None or os.environ.get("STREAMD_KEEP_ALLOCATOR_CACHE") == "1":
            return
        counts = getattr(self.engine, "graph_counts", None)
        if not getattr(self.engine, "cuda_graphs", False) or (counts is not None and counts()[1]):
            return
        try:
            freed = release()
        except Exception as exc:
            log.warning("engine: giving back start-up's GPU memory failed (%s); it stays held", exc)
            return
        log.info("engine: %.0f MB of GPU memory that only start-up used given back", freed / 2**20)

    def close(self) -> None:
        self.input.close()
        streams = (self.s1, *self.s2_lanes, self.s3)
        for s in streams:
            s.synchronize()
        for buf in self._buffers:
            for owned in (buf.input, buf.output, buf.results, buf.host, buf.staging, *buf.events):
                owned.close()
        self._buffers.clear()
        self.post.close()
        self.engine.close()
        for s in streams:
            s.close()
        self.loader.close()
        self.ctx.close()
