"""PyAV demux backend: files and RTSP through FFmpeg's demuxers, every call under a timeout.

PyAV's ``timeout=(open, read)`` installs an FFmpeg interrupt callback, so a silent server, a stalled stream
or a blocked file read raises instead of hanging. With ``annexb=True`` MP4/MKV packets (length-prefixed NAL
units, ``avcC``/``hvcC`` extradata) go through FFmpeg's ``h264_mp4toannexb``/``hevc_mp4toannexb``
bitstream filter (``av.BitStreamFilterContext``), which also puts the parameter sets in front of every key
frame; RTSP packets are Annex-B already and pass unfiltered.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import av
import numpy as np

from streamd.ingest.sources.base import (
    ANNEXB_CODECS,
    AccessUnits,
    DemuxOptions,
    Packet,
    SourceError,
    SourceTimeout,
    VideoInfo,
    to_annexb_extradata,
)
from streamd.ingest.sources.errors import explain, open_timeout, read_timeout

_BT709 = 1  # AVColorSpace values
_FULL_RANGE = 2  # AVColorRange: AVCOL_RANGE_JPEG


def _error(
    what: str,
    exc: BaseException,
    url: str,
    started: float,
    timeout_s: float,
    key: str,
    silent_since: float | None = None,
) -> SourceError:
    """A SourceError (SourceTimeout when the call ran into its timeout) with a plain reason
    (``streamd.ingest.sources.errors``), never the URL's credentials.

    A read timeout names the setting that fired (``key``, e.g. ``read_timeout_s``) and how long the read
    really waited: FFmpeg's RTSP client retries a timed-out read once, so a hung server is noticed after about
    twice the read timeout, and the message says so instead of claiming the configured value.
    """
    now = time.monotonic()
    opening = what == "cannot open"
    if isinstance(exc, (av.ExitError, av.error.TimeoutError)) or now - started >= 0.95 * timeout_s:
        if opening:
            return SourceTimeout(f"{what}: {open_timeout(url, timeout_s)}")
        waited = now - (started if silent_since is None else silent_since)
        return SourceTimeout(f"{what}: {read_timeout(waited, timeout_s, key)}")
    return SourceError(f"{what}: {explain(exc, url, reading=not opening)}")


class PyAVDemuxer:
    """The first video stream of ``url`` (a file path or an rtsp:// URL) as :class:`Packet` values."""

    backend = "pyav"

    def __init__(
        self,
        url: str,
        options: DemuxOptions | None = None,
        *,
        ffmpeg_options: dict[str, str] | None = None,
    ) -> None:
        options = options or DemuxOptions()
        self._url = url
        self._options = options
        timeouts = (options.open_timeout_s, options.read_timeout_s)
        started = time.monotonic()
        try:
            self._container = av.open(url, options=ffmpeg_options or {}, timeout=timeouts)
        except (av.FFmpegError, OSError) as exc:
            raise _error("cannot open", exc, url, started, options.open_timeout_s, "open_timeout_s") from None
        try:
            self.stream = self._container.streams.video[0]
        except IndexError:
            kinds = sorted({s.type for s in self._container.streams})
            self._container.close()
            held = f"only {', '.join(kinds)}" if kinds else "no streams at all"
            raise SourceError(f"cannot open: no video stream in it ({held})") from None
        ctx = self.stream.codec_context
        codec = ctx.name
        extradata = bytes(ctx.extradata or b"")
        annexb = options.annexb
        self._bsf: av.BitStreamFilterContext | None = None
        if annexb and codec in ANNEXB_CODECS and extradata[:1] == b"\x01":  # avcC/hvcC: MP4, MKV
            self._bsf = av.BitStreamFilterContext(f"{codec}_mp4toannexb", self.stream)
        # Annex-B from the source itself (RTSP, MPEG-TS): parameter sets may come in packets of their own.
        self._units = AccessUnits(codec) if codec in ANNEXB_CODECS and extradata[:1] != b"\x01" else None
        rate = self.stream.average_rate or self.stream.guessed_rate
        self.info = VideoInfo(
            codec=codec,
            width=ctx.width,
            height=ctx.height,
            fps=float(rate) if rate else None,
            time_base=float(self.stream.time_base or 0.0),
            extradata=to_annexb_extradata(extradata, codec) if annexb else extradata,
            annexb=annexb and codec in ANNEXB_CODECS,
            color_matrix="bt709"
            if ctx.colorspace == _BT709 or (ctx.colorspace == 2 and ctx.height >= 720)
            else "bt601",
            full_range=ctx.color_range == _FULL_RANGE,
        )

    def packets(self) -> Iterator[Packet]:
        """Video packets in decode order until the input ends; a read error or timeout raises SourceError."""
        started = silent_since = time.monotonic()
        count = 0
        try:
            for pkt in self._container.demux(self.stream):
                if not pkt.size:  # the empty packet that only signals the end
                    continue
                if time.monotonic() - started < 0.95 * self._options.read_timeout_s:
                    silent_since = started  # fresh data; a packet that took the whole timeout is one that
                    # FFmpeg's RTSP client released from its reorder buffer when the read timed out
                count += 1
                for out in self._bsf.filter(pkt) if self._bsf is not None else (pkt,):
                    if self._units is None:
                        yield Packet(out, out.pts, bool(out.is_keyframe), out)
                    else:
                        view = np.frombuffer(memoryview(out), np.uint8)  # type: ignore[arg-type]
                        yield from self._units.push(view, out.pts, bool(out.is_keyframe), out)
                started = time.monotonic()
        except (av.FFmpegError, OSError) as exc:
            timeout_s, key = self._options.read_timeout_s, self._options.read_timeout_key
            error = _error("read error", exc, self._url, started, timeout_s, key, silent_since)
            if self._units is not None:
                yield from self._units.flush()  # the last whole picture before the failure
            raise error from None
        if self._units is not None:
            yield from self._units.flush()
        expected = self.stream.frames  # from the container's index; 0 when unknown (live, raw streams)
        if 0 < count < expected:
            raise SourceError(f"input ended after {count} of {expected} packets (truncated?)")

    def close(self) -> None:
        container, self._container = getattr(self, "_container", None), None  # type: ignore[assignment]
        if container is not None:
            container.close()
