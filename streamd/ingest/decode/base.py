"""The decoder contract shared by the CPU (PyAV) and NVDEC (PyNvVideoCodec) twins.

Hop: ``Packet`` (compressed, decode order) -> ``Decoder.decode`` -> ``DecodedPicture`` (display order).
A decoder decodes *every* packet it is given and never skips one, so P/B frames keep their references;
dropping happens later, after decode, in the stream's queue.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from streamd.ingest.sources.base import Packet, VideoInfo

log = logging.getLogger(__name__)


class DecodeError(RuntimeError):
    """A packet could not be decoded (corrupt or truncated data); the caller counts it and goes on."""


@dataclass(slots=True)
class DecodedPicture:
    """One decoded picture.

    CPU decoder: ``image`` is a host BGR uint8 array (H, W, 3), or, from ``CpuDecoder(lazy=True)``, None
    with ``pending`` set: a :class:`HostPicture` converted to BGR only when a consumer needs the pixels.
    NVDEC: ``surface`` is an :class:`~.nvdec.Nv12Lease` in device memory and ``image`` is None, or, from
    ``NvdecDecoder(defer_copy=True)``, None with ``deferred`` set: ``deferred.take()`` gives the lease (the
    copy out of the decoder's buffer is made then), ``deferred.release()`` drops it uncopied. ``pts`` in
    seconds. ``luma`` is the host Y plane (H, W) uint8, filled only by ``CpuDecoder(keep_luma=True)`` (tests).
    """

    pts: float | None
    width: int
    height: int
    image: np.ndarray | None = None
    surface: Any = None
    luma: np.ndarray | None = None
    pending: HostPicture | None = None
    deferred: DeferredSurface | None = None


class HostPicture(Protocol):
    """A decoded host picture not converted yet (``DecodedPicture.pending``, ``Frame.pending``)."""

    def bgr(self) -> np.ndarray:
        """The picture as BGR uint8 (H, W, 3), converted now."""
        ...


class DeferredSurface(Protocol):
    """A decoded device picture not copied out of the decoder yet (``DecodedPicture.deferred``)."""

    def take(self) -> Any:
        """The picture's surface, copied now; None when no buffer was free (the decoder counts a drop)."""
        ...

    def release(self) -> None:
        """Not wanted: nothing is copied."""
        ...


class DecoderFull(DecodeError):
    """The GPU has no room for another hardware decoder (NVDEC's session could not be created). Not the
    packet's fault: the stream gives its decoder up and tries again later, with backoff, instead of failing
    on every packet (how many decoders fit on a GPU: bench/RESULTS.md).
    ``pictures``: what the decoder still gave before it failed (the old sequence's, at a format change)."""

    def __init__(self, message: str, pictures: list[DecodedPicture] | None = None) -> None:
        super().__init__(message)
        self.pictures = pictures or []


class Decoder(Protocol):
    """Packets in, pictures out. ``decode`` may return 0..n pictures (reordering delay); ``flush`` returns
    every picture still buffered at the end of a stream, a file pass or a live session, and leaves the
    decoder ready for more; ``restart(info)`` says whether the decoder can go on with the next pass/session
    described by ``info`` (same format: codec, size, extradata) — then it is kept, not torn down and
    created again; ``close`` is safe to call twice. ``skipped`` counts pictures decoded but withheld as
    corrupt."""

    name: str
    skipped: int

    def decode(self, packet: Packet) -> list[DecodedPicture]: ...
    def flush(self) -> list[DecodedPicture]: ...
    def restart(self, info: VideoInfo) -> bool: ...
    def close(self) -> None: ...


def same_format(a: VideoInfo, b: VideoInfo) -> bool:
    """Whether a decoder made for ``a`` can decode ``b``: same codec, packet form and extradata, and the same
    size where both know it (a live stream may report 0 x 0 before its parameter sets arrive)."""
    if (a.codec, a.annexb, bytes(a.extradata)) != (b.codec, b.annexb, bytes(b.extradata)):
        return False
    sizes = ((a.width, a.height), (b.width, b.height))
    return 0 in (a.width, b.width) or sizes[0] == sizes[1]


_GONE = ("CUDA_ERROR_CONTEXT_IS_DESTROYED", "CUDA_ERROR_DEINITIALIZED")  # a close at process exit


class _Closer:
    """One background thread that closes decoders handed to it, so that tearing a decoder down (NVDEC:
    destroy the session, free its surfaces) never runs on a stream's decode thread."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.pending = 0

    def submit(self, decoder: Any) -> None:
        with self._lock:
            self.pending += 1
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="decoder-closer", daemon=True)
                self._thread.start()
        self._queue.put(decoder)

    def _run(self) -> None:
        while True:
            decoder = self._queue.get()
            try:
                decoder.close()
            except Exception as exc:
                if getattr(exc, "name", "") in _GONE:  # its memory went with the context
                    log.debug("decoder closed after its CUDA context: %s", exc)
                else:
                    log.exception("closing a decoder in the background failed")
            finally:
                del decoder
                with self._lock:
                    self.pending -= 1

    def drain(self, timeout: float) -> bool:
        """Wait until every submitted decoder is closed; False if some are still pending at ``timeout``."""
        deadline = time.monotonic() + timeout
        while self.pending and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self.pending


_CLOSER = _Closer()
# A decoder still closing while the interpreter (and the CUDA context) goes away crashes the process at exit
# (SIGSEGV seen on the H200): finish the pending closes first.
atexit.register(lambda: _CLOSER.drain(5.0))


def close_later(decoder: Any) -> None:
    """Close ``decoder`` on the background closer thread (never blocks the caller)."""
    _CLOSER.submit(decoder)


def wait_closed(timeout: float = 10.0) -> bool:
    """Wait for decoders handed to :func:`close_later` (call before the CUDA context goes away)."""
    return _CLOSER.drain(timeout)
