"""CPU decoder (PyAV / FFmpeg): packets -> host BGR uint8 pictures. Twin of ``decode/nvdec.py``.

4:2:0 8-bit pictures (yuv420p, yuvj420p, nv12: what H.264/HEVC cameras send) are converted to BGR with the
GPU preprocess kernel's arithmetic (``stages.preprocess.colour``: the matrix and range the stream signals,
chroma of the 2 x 2 block, rounded once to 8 bits), so the CPU and GPU paths see the same pictures; other
formats go through FFmpeg's converter.

``lazy=True`` (the daemon's stream threads): pictures leave as ``DecodedPicture.pending`` and are converted
only when a batch needs their pixels (``streamd.stages.host_frames``). The conversion costs several times
the decode of a small picture and holds the GIL for much of it; a frame that its queue drops (the pipeline
behind) or that ``detect_fps`` skips is then never converted (bench/bench_host.py).
"""

from __future__ import annotations

from typing import Any

import av
import numpy as np

from streamd.ingest.decode.base import DecodedPicture, DecodeError, same_format
from streamd.ingest.sources.base import Packet, VideoInfo
from streamd.stages.preprocess.colour import signalled, yuv420_to_bgr


class CpuDecoder:
    """Decodes every packet it is given (never skips, so references stay intact).

    Takes packets of either demux backend: container packets with the container's extradata, or Annex-B
    packets with Annex-B extradata (``VideoInfo.annexb``). A packet FFmpeg cannot decode raises
    :class:`DecodeError`; the decoder stays usable for the next one. Pictures FFmpeg flags as corrupt
    (damaged slices, concealed) are not returned unless ``keep_corrupt``; :attr:`skipped` counts them.

    ``low_delay`` (live streams): slice threads only. FFmpeg's frame threading (the default, best for
    throughput) holds one picture per thread — the first picture comes out only after ``threads + 1``
    packets and every picture waits that long — so live streams decode without it; a picture then leaves as
    soon as the stream's own reordering (B-frames) allows.

    Damaged packets under frame threading: a frame thread's failure is reported only when its picture is
    due, and PyAV ends a drain at the first error, so a truncated last packet (a file cut mid-picture; the
    demuxer flags its short read ``is_corrupt``) would take every picture queued behind it in :meth:`flush`
    with it, silently. Such a packet is held back until the next one arrives (then decoded in order, as
    usual); when the stream ends instead, the held pictures are drained first and the damaged packet is
    counted in :attr:`skipped`, not decoded.
    """

    name = "cpu"

    def __init__(
        self,
        info: VideoInfo,
        *,
        threads: int = 0,
        low_delay: bool = False,
        keep_luma: bool = False,
        keep_corrupt: bool = False,
        lazy: bool = False,
    ) -> None:
        try:
            # A video decoding context; PyAV's stubs type create() as the base class, without decode().
            self._ctx: Any = av.CodecContext.create(info.codec, "r")
        except (av.FFmpegError, ValueError) as exc:
            raise DecodeError(f"no CPU decoder for codec {info.codec!r}: {exc}") from None
        if info.extradata:
            self._ctx.extradata = info.extradata
        self._ctx.thread_type = "SLICE" if low_delay else "AUTO"
        if threads:
            self._ctx.thread_count = threads
        self.info = info
        self.low_delay = low_delay
        self._time_base = info.time_base
        self._keep_luma = keep_luma
        self._keep_corrupt = keep_corrupt
        self._lazy = lazy
        self.skipped = 0  # corrupt pictures decoded but not returned, damaged pictures lost
        self._frame_threads = not low_delay  # thread_type AUTO: errors surface late (class docstring)
        self._held: av.Packet | None = None  # a damaged packet not yet sent (class docstring)

    def _convert(self, frames: list[av.VideoFrame]) -> list[DecodedPicture]:
        out = []
        for f in frames:
            if f.is_corrupt and not self._keep_corrupt:
                self.skipped += 1
                continue
            pts = float(f.pts * self._time_base) if f.pts is not None and self._time_base else None
            luma = None
            if self._keep_luma:
                plane = f.planes[0]
                rows = np.frombuffer(memoryview(plane), np.uint8).reshape(-1, plane.line_size)
                luma = rows[: f.height, : f.width].copy()
            picture = _Picture(f, *signalled(
                int(f.colorspace), int(f.color_range), self.info.color_matrix, self.info.full_range
            ))  # fmt: skip
            if self._lazy:
                out.append(DecodedPicture(pts, f.width, f.height, luma=luma, pending=picture))
            else:
                out.append(DecodedPicture(pts, f.width, f.height, image=picture.bgr(), luma=luma))
        return out

    def _send(self, pkt: av.Packet) -> list[DecodedPicture]:
        try:
            return self._convert(self._ctx.decode(pkt))
        except (av.FFmpegError, ValueError) as exc:
            raise DecodeError(f"undecodable packet ({type(exc).__name__}: {exc})") from None

    def decode(self, packet: Packet) -> list[DecodedPicture]:
        pkt = packet.raw if isinstance(packet.raw, av.Packet) else av.Packet(packet.view())  # type: ignore[arg-type]
        if packet.raw is None:
            pkt.pts = packet.pts
        before: list[DecodedPicture] = []
        if self._held is not None:  # more data followed the damaged packet: decode it in order after all
            held, self._held = self._held, None
            try:
                before = self._send(held)
            except DecodeError:
                self.skipped += 1
        if self._frame_threads and pkt.is_corrupt:
            self._held = pkt
            return before
        try:
            return before + self._send(pkt)
        except DecodeError:
            if not before:
                raise
            self.skipped += 1  # counted; the pictures already out still go on
            return before

    def flush(self) -> list[DecodedPicture]:
        """Every picture still buffered (end of a stream, a file pass or a live session); the decoder is
        reset afterwards, so it can go on with the next pass or session (:meth:`restart`). A damaged last
        packet held back (class docstring) is counted in :attr:`skipped`."""
        if self._held is not None:
            self._held = None
            self.skipped += 1
        try:
            return self._convert(self._ctx.decode(None))
        except (av.FFmpegError, ValueError) as exc:
            raise DecodeError(f"flush failed ({type(exc).__name__}: {exc})") from None
        finally:
            self._ctx.flush_buffers()

    def restart(self, info: VideoInfo) -> bool:
        """Go on with a new pass/session of the stream (after :meth:`flush`): True if ``info`` has this
        decoder's format (codec, size, extradata); False means the caller needs a new decoder."""
        if not same_format(self.info, info):
            return False
        self.info, self._time_base = info, info.time_base
        return True

    def close(self) -> None:
        self._ctx = None


_YUV420 = ("yuv420p", "yuvj420p", "nv12")


class _Picture:
    """A decoded picture and the matrix/range it signalled, converted to BGR on request (``HostPicture``).
    Holding the FFmpeg frame keeps its planes: the decoder writes later pictures into other buffers."""

    __slots__ = ("frame", "full", "matrix")

    def __init__(self, frame: av.VideoFrame, matrix: str, full: bool) -> None:
        self.frame, self.matrix, self.full = frame, matrix, full

    def bgr(self) -> np.ndarray:
        """The picture as BGR uint8, converted as the GPU kernel converts (module docstring)."""
        f = self.frame
        fmt = f.format.name
        if fmt not in _YUV420:
            return f.to_ndarray(format="bgr24")
        w, h = f.width, f.height
        cw, ch = (w + 1) // 2, (h + 1) // 2
        if fmt == "nv12":
            uv = _plane(f, 1, 2 * cw, ch)
            u, v = np.ascontiguousarray(uv[:, 0::2]), np.ascontiguousarray(uv[:, 1::2])
        else:
            u, v = _plane(f, 1, cw, ch), _plane(f, 2, cw, ch)
        return yuv420_to_bgr(_plane(f, 0, w, h), u, v, self.matrix, self.full or fmt == "yuvj420p")


def _plane(f: av.VideoFrame, index: int, width: int, height: int) -> np.ndarray:
    """Plane ``index`` of ``f`` as a (height, width) uint8 view (rows padded to ``line_size`` in memory)."""
    plane = f.planes[index]
    return np.frombuffer(memoryview(plane), np.uint8).reshape(-1, plane.line_size)[:height, :width]
