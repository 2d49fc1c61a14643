"""OpenCV demux backend: FFmpeg inside opencv-python in raw-packet mode, for machines without PyAV.

``cv2.VideoCapture(url, CAP_FFMPEG, [CAP_PROP_OPEN_TIMEOUT_MSEC, ms, CAP_PROP_READ_TIMEOUT_MSEC, ms])``
then ``set(CAP_PROP_FORMAT, -1)``: ``grab()`` reads one packet (no decoding; FFmpeg's interrupt callback
bounds it by the read timeout) and ``retrieve()`` returns it. OpenCV applies ``h264_mp4toannexb`` /
``hevc_mp4toannexb`` to MP4/MKV input itself, so packets are always Annex-B; the extradata (``avcC`` /
``hvcC`` for MP4) is converted to Annex-B parameter sets here. Timestamps: ``CAP_PROP_POS_MSEC`` is the
packet's pts *minus the stream's start time* in ms and ``CAP_PROP_PTS`` the pts in whole frames without that
subtraction; :class:`_SourceTime` puts the start time back (the first packets until it is known wait), so a
packet's pts is the source's own, as with PyAV (``VideoInfo.time_base`` is 1 µs). A packet without pts (the
first one of an RTSP session) reads as 0 in both; it gets None.

OpenCV takes FFmpeg demuxer options (RTSP transport, probe size) only from the process environment variable
``OPENCV_FFMPEG_CAPTURE_OPTIONS``, read while a capture opens. :func:`_capture_options` serialises opens that
need a different value, so concurrent opens never see each other's options; opens with the same options run
in parallel.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import cv2
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
from streamd.ingest.sources.errors import diagnose, open_timeout

_ENV = "OPENCV_FFMPEG_CAPTURE_OPTIONS"
_env_cond = threading.Condition()
_env_users = 0  # opens in progress with the current value of _ENV

_FOURCC_CODECS = {
    "h264": "h264", "avc1": "h264", "avc3": "h264", "x264": "h264", "H264": "h264",
    "hevc": "hevc", "hvc1": "hevc", "hev1": "hevc", "h265": "hevc", "H265": "hevc", "HEVC": "hevc",
    "mp4v": "mpeg4", "FMP4": "mpeg4", "XVID": "mpeg4", "DIVX": "mpeg4", "MJPG": "mjpeg", "av01": "av1",
    "vp09": "vp9", "VP90": "vp9", "vp08": "vp8", "VP80": "vp8", "MP42": "msmpeg4v2", "DIV3": "msmpeg4v3",
}  # fmt: skip


def codec_from_fourcc(fourcc: int) -> str:
    """FFmpeg codec name for OpenCV's ``CAP_PROP_FOURCC`` value (a container tag or a codec name)."""
    tag = int(fourcc).to_bytes(4, "little").decode("latin-1")
    return _FOURCC_CODECS.get(tag, tag.strip("\0 ").lower())


@contextmanager
def _capture_options(value: str, timeout_s: float) -> Iterator[None]:
    """Hold ``OPENCV_FFMPEG_CAPTURE_OPTIONS == value`` for one open (shared with opens of the same value)."""
    global _env_users
    deadline = time.monotonic() + timeout_s
    with _env_cond:
        while os.environ.get(_ENV) != value and _env_users > 0:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SourceTimeout(f"another stream's open held the demuxer options for {timeout_s:g} s")
            _env_cond.wait(left)
        os.environ[_ENV] = value
        _env_users += 1
    try:
        yield
    finally:
        with _env_cond:
            _env_users -= 1
            _env_cond.notify_all()


class _SourceTime:
    """Turns OpenCV's (``CAP_PROP_POS_MSEC``, ``CAP_PROP_PTS``) of each packet into the source's pts (µs)."""

    def __init__(self, fps: float | None) -> None:
        self.fps = fps
        self.start_ms: float | None = None if fps else 0.0  # the stream's start time
        self._waiting: list[tuple[float, float, Any]] = []

    def push(self, pos_ms: float, frames: float, item: Any) -> list[tuple[Any, int | None]]:
        """(item, pts in µs or None) for the packets whose pts is known now."""
        if self.start_ms is None:
            if frames <= 0 or not self.fps:
                self._waiting.append((pos_ms, frames, item))
                return []
            self.start_ms = round(frames / self.fps * 1000.0 - pos_ms, 3)
        out = [(it, self._pts(p, f)) for p, f, it in self._waiting]
        self._waiting.clear()
        out.append((item, self._pts(pos_ms, frames)))
        return out

    def flush(self) -> list[tuple[Any, int | None]]:
        if self.start_ms is None:
            self.start_ms = 0.0
        out = [(it, self._pts(p, f)) for p, f, it in self._waiting]
        self._waiting.clear()
        return out

    def _pts(self, pos_ms: float, frames: float) -> int | None:
        start = self.start_ms or 0.0
        if pos_ms == 0 and frames == 0 and self.fps and abs(start) * self.fps > 500:
            return None  # both read 0 although the stream starts later: this packet had no pts
        return round((pos_ms + start) * 1000.0)


class OpenCVDemuxer:
    """The video stream of ``url`` (file path or rtsp:// URL) as Annex-B :class:`Packet` values."""

    backend = "opencv"

    def __init__(
        self,
        url: str,
        options: DemuxOptions | None = None,
        *,
        ffmpeg_options: dict[str, str] | None = None,
    ) -> None:
        # options.annexb is not needed: OpenCV's raw mode always gives Annex-B for H.264/HEVC
        options = options or DemuxOptions()
        self._url = url
        self._options = options
        self._frame_count = 0
        open_timeout_s = options.open_timeout_s
        env = "|".join(f"{k};{v}" for k, v in (ffmpeg_options or {}).items())
        ms = (max(1, round(open_timeout_s * 1000)), max(1, round(options.read_timeout_s * 1000)))
        params = [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, ms[0], cv2.CAP_PROP_READ_TIMEOUT_MSEC, ms[1]]
        started = time.monotonic()
        with _capture_options(env, open_timeout_s):
            cap = cv2.VideoCapture(url, cv2.CAP_FFMPEG, params)
        if not cap.isOpened():
            waited = time.monotonic() - started
            cap.release()
            if waited >= 0.95 * open_timeout_s:
                raise SourceTimeout(f"cannot open: {open_timeout(url, open_timeout_s)}")
            # OpenCV does not say why: look at the file, or try a connection to the camera
            raise SourceError(f"cannot open: {diagnose(url, min(2.0, open_timeout_s))}")
        if not cap.set(cv2.CAP_PROP_FORMAT, -1):
            cap.release()
            raise SourceError("this OpenCV build cannot return raw packets (CAP_PROP_FORMAT -1)")
        self._cap = cap
        codec = codec_from_fourcc(int(cap.get(cv2.CAP_PROP_FOURCC)))
        ok, extra = cap.retrieve(flag=int(cap.get(cv2.CAP_PROP_CODEC_EXTRADATA_INDEX)))
        extradata = bytes(extra.reshape(-1)) if ok and extra is not None else b""
        fps = float(cap.get(cv2.CAP_PROP_FPS))
        height = int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT))
        self._frame_count = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
        self.info = VideoInfo(
            codec=codec,
            width=int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)),
            height=height,
            fps=fps if 0 < fps < 1000 else None,
            time_base=1e-6,
            extradata=to_annexb_extradata(extradata, codec),
            annexb=codec in ANNEXB_CODECS,
            color_matrix="bt709" if height >= 720 else "bt601",  # OpenCV does not expose the colour space
        )

    def packets(self) -> Iterator[Packet]:
        """Packets until the input ends; a read that runs into the read timeout raises SourceTimeout.

        OpenCV reports end of input, a read error and a timeout alike (``grab()`` is False); the time the
        call took tells a timeout apart. A file that ends before the packet count in its header raises
        SourceError (truncated) after its last good packet.
        """
        cap = self._cap
        count = 0
        units = AccessUnits(self.info.codec)  # parameter sets that come alone go in front of the picture
        clock = _SourceTime(self.info.fps)
        silent_since = time.monotonic()
        read_timeout_s = self._options.read_timeout_s
        while True:
            started = time.monotonic()
            if not cap.grab():
                now = time.monotonic()
                yield from self._units(units, clock.flush())
                yield from units.flush()  # the last whole picture before the end or the failure
                if now - started >= 0.95 * read_timeout_s:
                    raise SourceTimeout(
                        f"read error: no packet for {now - silent_since:.1f} s "
                        f"({self._options.read_timeout_key} {read_timeout_s:g} s)"
                    )
                if 0 < count < self._frame_count and not self._url.lower().startswith(("rtsp:", "rtsps:")):
                    raise SourceError(
                        f"input ended after {count} of {self._frame_count} packets (truncated?)"
                    )
                return
            if time.monotonic() - started < 0.95 * read_timeout_s:
                silent_since = started  # fresh data (a packet released by a timed-out read is not)
            ok, data = cap.retrieve()
            if not ok or data is None or not data.size:
                continue
            count += 1
            key = cap.get(cv2.CAP_PROP_LRF_HAS_KEY_FRAME) > 0
            item = (np.ascontiguousarray(data.reshape(-1)), key)
            timed = clock.push(cap.get(cv2.CAP_PROP_POS_MSEC), cap.get(cv2.CAP_PROP_PTS), item)
            yield from self._units(units, timed)

    @staticmethod
    def _units(units: AccessUnits, timed: list[tuple[Any, int | None]]) -> Iterator[Packet]:
        for (view, key), pts in timed:
            yield from units.push(view, pts, key, None)

    def close(self) -> None:
        cap, self._cap = getattr(self, "_cap", None), None  # type: ignore[assignment]
        if cap is not None:
            cap.release()
