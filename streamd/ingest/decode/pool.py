"""Device NV12 buffers of one NVDEC decoder (``SurfacePool``) and the lease a consumer holds on one
(``Nv12Lease``): the surface-lifetime part of ``streamd.ingest.decode.nvdec``'s design (see its docstring)."""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any

from streamd.ingest.decode.base import DecodeError
from streamd.ingest.sources.base import VideoInfo
from streamd.types import Nv12Surface


class _Slot:
    """One pooled NV12 buffer and its two events (see the module docstring)."""

    __slots__ = ("buf", "consumed", "consumed_pending", "height", "pitch", "ptr", "ready", "width")

    def __init__(self, gpu: Any, width: int, height: int, pitch: int) -> None:
        self.width, self.height, self.pitch = width, height, pitch
        self.buf = gpu.alloc(pitch * height * 3 // 2)
        self.ptr = int(self.buf.ptr)
        self.ready = gpu.event()
        self.consumed = gpu.event()
        self.consumed_pending = False


class SurfacePool:
    """Device NV12 buffers of one decoder, reused; at most ``max_slots`` exist at a time.

    ``acquire`` returns a free buffer of the wanted size (allocating up to the limit, replacing buffers of an
    old size), or waits up to ``timeout_s`` for a release and then returns None (the caller drops and counts
    the picture: consumers hold every buffer). Thread-safe: consumers release from their own threads.

    A burst (start-up, the engine stalled for a moment) grows the pool, and free buffers are reused oldest
    first, so every one of them stays in rotation: without a limit the pool would keep its high-water mark
    for the life of the stream. Every ``TRIM_WINDOW_S`` it frees the free buffers beyond the most it held at
    once over the last two windows plus ``TRIM_SPARE`` (a rare cuMemFree, never on a held buffer).
    """

    TRIM_WINDOW_S = 30.0
    TRIM_SPARE = 2

    def __init__(self, gpu: Any, max_slots: int = 32, clock: Any = time.monotonic) -> None:
        if max_slots < 2:
            raise ValueError(f"surface pool: max_slots must be >= 2, got {max_slots}")
        self._gpu = gpu
        self.max_slots = max_slots
        self._clock = clock
        self._window_start = clock()
        self._peak = 0  # most buffers held at once in this window
        self._prev_peak = 0  # ... in the one before
        self.trimmed = 0  # buffers freed because the pool had more than it needed
        self._cond = threading.Condition()
        self._free: list[_Slot] = []
        self._count = 0  # slots in existence (free + held)
        self._closed = False
        self._on_empty: Any = None  # called once the pool is closed and its last buffer freed

    @property
    def size(self) -> int:
        return self._count

    @property
    def free(self) -> int:
        return len(self._free)

    def acquire(self, width: int, height: int, pitch: int, timeout_s: float) -> _Slot | None:
        deadline = time.monotonic() + timeout_s
        slot: _Slot | None = None
        with self._cond:
            while slot is None:
                if self._closed:
                    raise DecodeError("surface pool is closed")
                match = next(
                    (s for s in self._free if (s.width, s.height, s.pitch) == (width, height, pitch)), None
                )
                if match is not None:
                    self._free.remove(match)
                    slot = match
                    break
                if self._free and self._count >= self.max_slots:
                    self._destroy(self._free.pop(0))  # a buffer of another size: make room
                    self._count -= 1
                if self._count < self.max_slots:
                    self._count += 1
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            self._peak = max(self._peak, self._count - len(self._free))
        if slot is None:
            try:
                slot = _Slot(self._gpu, width, height, pitch)
            except Exception:
                with self._cond:
                    self._count -= 1
                raise
        if slot.consumed_pending:  # the last reader's stream must be past its reads before we overwrite
            self._gpu.wait(slot.consumed)
            slot.consumed_pending = False
        return slot

    def release(self, slot: _Slot, stream: Any = None) -> None:
        """Give ``slot`` back; with ``stream``, after the work already enqueued on that stream."""
        if stream is not None:
            self._gpu.record(slot.consumed, stream)
            slot.consumed_pending = True
        with self._cond:
            if self._closed:
                self._destroy(slot)
                self._count -= 1
                self._maybe_empty()
                return
            self._free.append(slot)
            self._cond.notify()
            if self._clock() - self._window_start >= self.TRIM_WINDOW_S:
                self._trim()

    def _trim(self) -> None:
        """Free what the last two windows did not need (caller holds the lock); start a new window."""
        keep = max(self._peak, self._prev_peak) + self.TRIM_SPARE
        while self._count > keep and self._free:
            self._destroy(self._free.pop(0))  # the oldest released: its reader finished long ago
            self._count -= 1
            self.trimmed += 1
        self._prev_peak, self._peak = self._peak, self._count - len(self._free)
        self._window_start = self._clock()

    def _maybe_empty(self) -> None:
        if self._count == 0 and self._on_empty is not None:
            on_empty, self._on_empty = self._on_empty, None
            on_empty()

    def _destroy(self, slot: _Slot) -> None:
        if slot.consumed_pending:
            self._gpu.synchronize(slot.consumed)  # a reader may still run: rare path (size change, close)
        self._gpu.forget(slot.ptr)
        self._gpu.forget(slot.ptr + slot.pitch * slot.height)
        slot.buf.close()
        slot.ready.close()
        slot.consumed.close()

    def close(self, on_empty: Any = None) -> None:
        """Free the free buffers now; held ones are freed when their surfaces are released. ``on_empty`` is
        called (once) when no buffer is left: at once, or at the last release."""
        with self._cond:
            self._closed = True
            self._on_empty = on_empty
            while self._free:
                self._destroy(self._free.pop())
                self._count -= 1
            self._maybe_empty()
            self._cond.notify_all()


class Nv12Lease:  # the lease (lifetime, events) of one pooled picture; its pixels: ``planes``
    """A decoded picture in device memory, NV12 (8-bit 4:2:0), lent from the decoder's :class:`SurfacePool`.

    This is ``Frame.surface`` on the GPU path. Fields:

    - ``luma_ptr`` (int): device address of the Y plane: ``height`` rows of ``pitch`` bytes (``width`` used).
    - ``chroma_ptr`` (int): device address of the interleaved UV plane: ``height // 2`` rows of ``pitch``
      bytes, U at even and V at odd bytes (``width`` bytes used per row).
    - ``pitch`` (int): bytes per row of both planes.
    - ``width``, ``height`` (int): picture size in pixels.
    - ``color_matrix`` (``"bt601"`` | ``"bt709"``), ``full_range`` (bool): how to turn YUV into RGB.
    - ``device`` (int): CUDA device ordinal; ``ready``: event recorded on the decoder's stream after the
      pixels were written.

    Contract for the consumer: call ``wait(stream)`` before enqueueing reads on ``stream`` and
    ``release(stream)`` after the last read is enqueued (both only enqueue; neither blocks the host). The
    pointers are valid until ``release``. A surface that is dropped without ``release`` returns to the pool
    at once; do that only if nothing that reads it was enqueued.
    """

    __slots__ = (
        "__weakref__",
        "_finalizer",
        "_gpu",
        "_slot",
        "chroma_ptr",
        "color_matrix",
        "device",
        "full_range",
        "height",
        "luma_ptr",
        "pitch",
        "ready",
        "width",
    )

    def __init__(self, slot: _Slot, pool: SurfacePool, gpu: Any, info: VideoInfo, device: int) -> None:
        self._slot = slot
        self._gpu = gpu
        self.luma_ptr = slot.ptr
        self.chroma_ptr = slot.ptr + slot.pitch * slot.height
        self.pitch = slot.pitch
        self.width = slot.width
        self.height = slot.height
        self.color_matrix = info.color_matrix
        self.full_range = info.full_range
        self.device = device
        self.ready = slot.ready
        self._finalizer = weakref.finalize(self, pool.release, slot, None)

    @property
    def planes(self) -> Nv12Surface:
        """Where the pixels are, as the kernels read them (``streamd.types.Nv12Surface``: one NV12 type)."""
        return Nv12Surface(
            self.luma_ptr,
            self.chroma_ptr,
            self.width,
            self.height,
            self.pitch,
            self.pitch,
            self.color_matrix,
            self.full_range,
        )

    @property
    def released(self) -> bool:
        return not self._finalizer.alive

    def wait(self, stream: Any) -> None:
        """Make ``stream`` (a ``streamd.gpu.cuda.Stream`` or a raw ``CUstream`` int) wait for the pixels."""
        self._gpu.wait(self.ready, stream)

    def release(self, stream: Any = None) -> None:
        """Return the buffer once the work enqueued on ``stream`` so far is done (None: nothing reads it).

        Safe to call twice; the surface must not be read after this.
        """
        detached = self._finalizer.detach()
        if detached is not None:
            _, give_back, (slot, _), _ = detached
            give_back(slot, stream)
