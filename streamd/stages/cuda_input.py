"""S1 on the GPU, on its own: a batch of frames -> the preprocess kernel's NCHW input at a device address.

``GpuStages`` runs it into its slot's input; a decode worker of a shared engine (``streamd.shared_engine``)
runs it into memory it exports to the engine process. NVDEC frames are read in place (each waits for its
decoder's event, and goes back to its pool once the kernel, its last reader, is enqueued: ``release(s1)``
makes the decoder's stream wait for it, so nothing blocks on the host). Frames decoded on the CPU
(``Frame.image``) are packed into a pinned host buffer (memcpys, in a few threads for a large batch: numpy
releases the GIL) and uploaded in one asynchronous copy on S1, then take the packed-BGR path of the same
kernel. Copying each frame from pageable memory instead had the driver stage it synchronously in the S1 thread
(~0.25 ms per 768x576 frame), which capped the whole ring at batch 32.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from streamd.gpu.cuda import Context, DeviceBuffer, PinnedBuffer, Stream, copy_htod
from streamd.gpu.kernels import KernelLoader
from streamd.stages.host_frames import HostFrames
from streamd.stages.preprocess.cuda import GpuPreprocessor
from streamd.stages.preprocess.spec import PreprocessSpec
from streamd.types import Frame, PackedSurface, Surface, SurfaceLease, Transform

DTYPE_NAMES = {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16"}
# Memcpy threads for host frames: packing a large batch (tens of MB) on one or a few cores makes S1 the ring's
# slowest stage, so half the cores pack, at most 8 (bench/RESULTS.md).
PACK_THREADS = max(1, min(8, len(os.sched_getaffinity(0)) // 2))
PACK_PARALLEL_BYTES = 4 << 20  # below this one thread packs faster than several can be woken


def _copy_all(copies: list[tuple[np.ndarray, np.ndarray]]) -> None:
    for dst, src in copies:
        np.copyto(dst, src)


@dataclass(slots=True)
class Staging:
    """One slot's upload buffers for CPU-decoded frames (device side and pinned host side), grown on demand;
    reused once the slot's batch is collected."""

    device: DeviceBuffer | None = None
    pinned: PinnedBuffer | None = None

    def close(self) -> None:
        for owned in (self.device, self.pinned):
            if owned is not None:
                owned.close()
        self.device = self.pinned = None


class GpuInput:
    """Frames -> the model's input tensor on ``s1`` (enqueued only)."""

    def __init__(
        self,
        spec: PreprocessSpec,
        ctx: Context,
        loader: KernelLoader,
        s1: Stream,
        *,
        max_batch: int,
        dtype: str,
    ) -> None:
        self.ctx, self.s1 = ctx, s1
        self.pre = GpuPreprocessor(spec, ctx, max_batch=max_batch, dtype=dtype, loader=loader, ring=16)
        self._packers: ThreadPoolExecutor | None = None  # started by the first large batch of host frames
        self._host = HostFrames()  # CPU-decoded pictures get their pixels when batched

    def __call__(self, frames: list[Frame], staging: Staging, out_ptr: int) -> list[Transform]:
        """Enqueue the preprocess of ``frames`` into ``out_ptr`` on ``s1``; the decoders' surfaces go back."""
        transforms = self.pre(self._stage_surfaces(frames, staging), out_ptr, self.s1)
        for f in frames:  # the kernel above was the last reader: the decoder may reuse the buffers
            if f.surface is not None:
                f.surface.release(self.s1)
            f.surface = None
        return transforms

    def _upload_buffers(self, staging: Staging, nbytes: int) -> tuple[DeviceBuffer, PinnedBuffer]:
        """Safe to overwrite: a slot comes back only after the host has collected its previous batch, so its
        copy is done."""
        if staging.device is None or staging.pinned is None or staging.device.nbytes < nbytes:
            if staging.device is not None:  # grown twofold: start-up's growing partial batches free rarely
                nbytes = max(nbytes, 2 * staging.device.nbytes)
            staging.close()
            staging.device, staging.pinned = DeviceBuffer(nbytes), PinnedBuffer(nbytes)
        return staging.device, staging.pinned

    def _stage_surfaces(self, frames: list[Frame], staging: Staging) -> list[Surface]:
        surfaces: list[Surface] = []
        self._host.convert_pending(frames)
        host_bytes = sum(f.width * f.height * 3 for f in frames if f.surface is None)
        if host_bytes:
            device, pinned = self._upload_buffers(staging, host_bytes)
            packed = pinned.array(np.uint8, host_bytes)
        copies: list[tuple[np.ndarray, np.ndarray]] = []
        offset = 0
        for f in frames:
            if f.surface is not None:
                lease: SurfaceLease = f.surface
                lease.wait(self.s1)  # the decoder's copy into this surface is done
                surfaces.append(lease.planes)
                continue
            assert f.image is not None
            n = f.width * f.height * 3
            copies.append((packed[offset : offset + n].reshape(f.height, f.width, 3), f.image))
            surfaces.append(PackedSurface(device.ptr + offset, f.width, f.height, 3 * f.width))
            offset += n
        if copies:
            self._pack(copies, host_bytes)
            copy_htod(device.ptr, pinned.ptr, host_bytes, self.s1)  # one async copy of the whole batch
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

    def close(self) -> None:
        if self._packers is not None:
            self._packers.shutdown()
        self._host.close()
        self.pre.close()
