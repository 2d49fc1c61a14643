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
Frames decoded on the CPU (``Frame.image``) are packed into the slot's pinned host buffer (memcpys, in a few
threads for a large batch: numpy releases the GIL) and uploaded in one asynchronous copy on S1, then take the
packed-BGR path of the same kernel. Copying each frame from pageable memory instead had the driver stage it
synchronously in the S1 thread (~0.25 ms per 768x576 frame), which capped the whole ring at batch 32.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from streamd.engines.base import Engine
from streamd.gpu.cuda import Context, DeviceBuffer, Event, PinnedBuffer, Stream, copy_htod
from streamd.gpu.kernels import KernelLoader
from streamd.stages.contract import Slot
from streamd.stages.host_frames import HostFrames
from streamd.stages.postprocess.cpu import PostprocessSpec
from streamd.stages.postprocess.cuda import GpuPostprocessor, HostNmsResults, NmsResults
from streamd.stages.preprocess.cuda import GpuPreprocessor
from streamd.stages.preprocess.spec import PreprocessSpec
from streamd.types import Detections, PackedSurface, Surface, SurfaceLease

log = logging.getLogger(__name__)
_DTYPE_NAMES = {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16"}
# Memcpy threads for host frames: packing a large batch (tens of MB) on one or a few cores makes S1 the ring's
# slowest stage, so half the cores pack, at most 8 (bench/RESULTS.md).
PACK_THREADS = max(1, min(8, len(os.sched_getaffinity(0)) // 2))
PACK_PARALLEL_BYTES = 4 << 20  # below this one thread packs faster than several can be woken


def _copy_all(copies: list[tuple[np.ndarray, np.ndarray]]) -> None:
    for dst, src in copies:
        np.copyto(dst, src)


@dataclass(slots=True)
class _GpuBuffers:
    input: DeviceBuffer
    output: DeviceBuffer
    results: NmsResults
    host: HostNmsResults
    events: tuple[Event, Event, Event, Event]  # E0 (start), E1, E2, E3; timing events for per-stage times
    s2: Stream  # the engine lane's stream this slot's inference runs on
    staging: DeviceBuffer | None = None  # packed BGR uploads of CPU-decoded frames (device side)
    pinned: PinnedBuffer | None = None  # ... and their host side; reused once the slot's batch is collected


class GpuStages:
    def __init__(
        self, engine: Engine, pre: PreprocessSpec, post: PostprocessSpec, device: int = 0, warm_batch: int = 0
    ) -> None:
        """``warm_batch``: the pipeline's batch size; every engine batch size up to it is run once per slot
        when the slot is made, so CUDA graph capture and cuDNN autotuning happen before the first frame."""
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
        self.pre = GpuPreprocessor(
            pre, self.ctx, max_batch=self.max_batch, dtype=_DTYPE_NAMES[in_dtype], loader=self.loader, ring=16
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
            dtype=_DTYPE_NAMES[out_dtype],
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
        self._buckets = sorted({min(unit << k, top) for k in range(top.bit_length() + 1)})
        self._warm = warm_batch > 0
        self._packers: ThreadPoolExecutor | None = None  # started by the first large batch of host frames
        self._host = HostFrames()  # CPU-decoded pictures get their pixels when batched

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
            for size in self._buckets:
                self.engine.enqueue(buffers.input.ptr, buffers.output.ptr, size, s2)
            s2.synchronize()
        return Slot(index, buffers=buffers)

    def _staging(self, buf: _GpuBuffers, nbytes: int) -> tuple[DeviceBuffer, PinnedBuffer]:
        """The slot's upload buffers for CPU-decoded frames, grown when a batch needs more. Safe to overwrite:
        a slot comes back only after the host has collected its previous batch (E3), so its copy is done."""
        if buf.staging is None or buf.pinned is None or buf.staging.nbytes < nbytes:
            if buf.staging is not None:  # grown twofold: start-up's growing partial batches free rarely
                nbytes = max(nbytes, 2 * buf.staging.nbytes)
            for old in (buf.staging, buf.pinned):
                if old is not None:
                    old.close()
            buf.staging, buf.pinned = DeviceBuffer(nbytes), PinnedBuffer(nbytes)
        return buf.staging, buf.pinned

    def _stage_surfaces(self, slot: Slot, buf: _GpuBuffers) -> list[Surface]:
        surfaces: list[Surface] = []
        self._host.convert_pending(slot.frames)
        host_bytes = sum(f.width * f.height * 3 for f in slot.frames if f.surface is None)
        if host_bytes:
            staging, pinned = self._staging(buf, host_bytes)
            packed = pinned.array(np.uint8, host_bytes)
        copies: list[tuple[np.ndarray, np.ndarray]] = []
        offset = 0
        for f in slot.frames:
            if f.surface is not None:
                lease: SurfaceLease = f.surface
                lease.wait(self.s1)  # the decoder's copy into this surface is done
                surfaces.append(lease.planes)
                continue
            assert f.image is not None
            n = f.width * f.height * 3
            copies.append((packed[offset : offset + n].reshape(f.height, f.width, 3), f.image))
            surfaces.append(PackedSurface(staging.ptr + offset, f.width, f.height, 3 * f.width))
            offset += n
        if copies:
            self._pack(copies, host_bytes)
            copy_htod(staging.ptr, pinned.ptr, host_bytes, self.s1)  # one async copy of the whole batch
        return surfaces

    def _pack(self, copies: list[tuple[np.ndarray, np.ndarray]], nbytes: int) -> None:
        """Frames into the pinned buffer; a large batch in PACK_THREADS threads (numpy copies release the
        GIL), since one core's memcpy bounds the S1 thread: 32 frames of 768x576 are 42 MB per batch."""
        if nbytes < PACK_PARALLEL_BYTES or len(copies) < 2 or PACK_THREADS == 1:
            for dst, src in copies:
                np.copyto(dst, src)
            return
        if self._packers is None:
            self._packers = ThreadPoolExecutor(PACK_THREADS, thread_name_prefix="pack")
        chunks = [copies[k::PACK_THREADS] for k in range(PACK_THREADS)]
        for done in [self._packers.submit(_copy_all, c) for c in chunks if c]:
            done.result()

    def preprocess(self, slot: Slot) -> None:
        self.ctx.ensure_current()
        buf: _GpuBuffers = slot.buffers  # type: ignore[assignment]
        buf.events[0].record(self.s1)
        slot.transforms = self.pre(self._stage_surfaces(slot, buf), buf.input.ptr, self.s1)
        buf.events[1].record(self.s1)
        for f in slot.frames:  # the kernel above was the last reader: the decoder may reuse the buffers
            if f.surface is not None:
                f.surface.release(self.s1)
            f.surface = None

    def infer(self, slot: Slot) -> None:
        self.ctx.ensure_current()
        buf: _GpuBuffers = slot.buffers  # type: ignore[assignment]
        buf.s2.wait(buf.events[1])
        n = len(slot.frames)
        size = next((b for b in self._buckets if b >= n), n)
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
        if self._packers is not None:
            self._packers.shutdown()
        self._host.close()
        streams = (self.s1, *self.s2_lanes, self.s3)
        for s in streams:
            s.synchronize()
        for buf in self._buffers:
            for owned in (buf.input, buf.output, buf.results, buf.host, buf.staging, buf.pinned, *buf.events):
                if owned is not None:
                    owned.close()
        self._buffers.clear()
        self.pre.close()
        self.post.close()
        self.engine.close()
        for s in streams:
            s.close()
        self.loader.close()
        self.ctx.close()
