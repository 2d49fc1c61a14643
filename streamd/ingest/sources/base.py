"""What a source hands the decoder: an opened demuxer of one video stream, as plain packets.

A source yields compressed packets in decode order and never decodes; the decoder owns decoding. Every
blocking call has a timeout (open and read, enforced inside FFmpeg by an interrupt callback), so a silent
input raises :class:`SourceError` instead of hanging.

Two demux backends produce the same :class:`Packet` values: PyAV (``pyav.py``) and OpenCV's
FFmpeg raw-packet mode (``streamd/ingest/sources/opencv.py``, for machines without PyAV such as the GPU box).
Hop: URL -> ``Demuxer`` -> ``Packet`` (compressed, decode order) -> decoder.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from streamd.config.streams import StreamConfig, redact_url

START_CODE = b"\x00\x00\x00\x01"
ANNEXB_CODECS = ("h264", "hevc")


class SourceError(RuntimeError):
    """The input could not be opened or read; the message never contains URL credentials."""


class SourceTimeout(SourceError):
    """An open or a read did not complete within its timeout (silent server, stalled stream)."""


class SourceEnded(SourceError):
    """A live source closed the connection (server gone); a file reports its end by ending ``packets()``."""


@dataclass(frozen=True, slots=True)
class DemuxOptions:
    """How an input is opened and read; every demuxer takes the same options.

    ``backend``: ``pyav``, ``opencv`` or ``auto`` (:func:`~.backends.default_backend`). ``annexb``: packets
    and extradata as Annex-B byte streams (what NVDEC takes). ``open_timeout_s`` and ``read_timeout_s``
    bound every open and every read; ``read_timeout_key`` is the config key the read timeout came from,
    named in timeout messages. ``transport`` (RTSP only): ``tcp`` or ``udp``.
    """

    backend: str = "auto"
    annexb: bool = False
    open_timeout_s: float = 10.0
    read_timeout_s: float = 5.0
    read_timeout_key: str = "read_timeout_s"
    transport: str = "tcp"

    @classmethod
    def for_stream(cls, cfg: StreamConfig, *, backend: str = "auto", annexb: bool = False) -> DemuxOptions:
        """The configured stream's timeouts and transport. A read gives up at ``stall_timeout_s`` when that is
        the shorter one (a read that blocks that long is a stall), and its message then names that key."""
        stall_first = cfg.stall_timeout_s < cfg.read_timeout_s
        return cls(
            backend=backend,
            annexb=annexb,
            open_timeout_s=cfg.open_timeout_s,
            read_timeout_s=min(cfg.read_timeout_s, cfg.stall_timeout_s),
            read_timeout_key="stall_timeout_s" if stall_first else "read_timeout_s",
            transport=cfg.transport,
        )


@dataclass(frozen=True, slots=True)
class VideoInfo:
    """The video stream as the demuxer sees it when it opens.

    ``extradata`` is the codec configuration in the same form as the packets: Annex-B parameter sets
    (start codes) when ``annexb`` is true, else the container's own (``avcC``/``hvcC`` for MP4).
    ``width``/``height`` may be 0 for a live stream whose parameter sets have not arrived yet.
    """

    codec: str  # FFmpeg codec name: h264, hevc, mpeg4 ...
    width: int
    height: int
    fps: float | None  # average frame rate when the container knows it
    time_base: float  # seconds per pts tick of the packets
    extradata: bytes = b""
    annexb: bool = False  # packets are Annex-B byte streams (start codes), as NVDEC wants them
    color_matrix: str = "bt601"  # bt601 | bt709: YUV -> RGB matrix of the decoded pictures
    full_range: bool = False  # True: 0..255 (JPEG range); False: 16..235 (video range)


@dataclass(slots=True)
class Packet:
    """One compressed access unit (a picture) of the video stream, in decode order.

    ``data`` is any buffer (bytes, a uint8 numpy array, an ``av.Packet``); ``pts`` is in
    ``VideoInfo.time_base`` ticks (None when the container has none); ``raw`` is the backend's own packet
    object when it has one (the PyAV decoder reuses it without a copy).
    """

    data: Any
    pts: int | None
    is_key: bool = False
    raw: Any = field(default=None, repr=False)

    def view(self) -> np.ndarray:
        """The payload as a 1-D uint8 array, without a copy (keep it referenced while its address is used)."""
        arr = self.data if isinstance(self.data, np.ndarray) else np.frombuffer(self.data, np.uint8)
        return arr.reshape(-1)

    @property
    def size(self) -> int:
        return int(self.view().size)


class Demuxer(Protocol):
    """An opened input. ``packets()`` yields video packets until the input ends (files) and raises
    :class:`SourceError` on a read error or timeout; ``close()`` is safe to call twice."""

    info: VideoInfo
    backend: str  # "pyav" | "opencv"

    def packets(self) -> Iterator[Packet]: ...
    def close(self) -> None: ...


_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s'\"]*@")


def scrub(text: str, url: str) -> str:
    """``text`` (an FFmpeg/OpenCV error message) with the URL redacted and any ``user:pass@`` removed."""
    if url:
        text = text.replace(url, redact_url(url))
    return _USERINFO.sub(r"\1***@", text)


def to_annexb_extradata(extradata: bytes, codec: str) -> bytes:
    """Container codec configuration (``avcC`` for H.264, ``hvcC`` for HEVC) as Annex-B parameter sets.

    Already Annex-B (or empty) input is returned unchanged; an unparsable record gives ``b""`` (the in-band
    parameter sets that ``*_mp4toannexb`` inserts before every key frame are then enough).
    """
    data = bytes(extradata or b"")
    if not data or data.startswith((b"\x00\x00\x01", START_CODE)) or codec not in ANNEXB_CODECS:
        return data
    try:
        nals = _avcc_nals(data) if codec == "h264" else _hvcc_nals(data)
    except (IndexError, ValueError):
        return b""
    return b"".join(START_CODE + nal for nal in nals)


def _read_nals(data: bytes, pos: int, count: int) -> tuple[list[bytes], int]:
    """``count`` NAL units, each behind a 16-bit big-endian length, from ``pos``."""
    nals = []
    for _ in range(count):
        size = int.from_bytes(data[pos : pos + 2], "big")
        if pos + 2 + size > len(data):
            raise ValueError("truncated codec configuration record")
        nals.append(data[pos + 2 : pos + 2 + size])
        pos += 2 + size
    return nals, pos


def _avcc_nals(data: bytes) -> list[bytes]:
    """SPS and PPS NAL units of an AVCDecoderConfigurationRecord (ISO/IEC 14496-15 5.3.3.1)."""
    if data[0] != 1:
        raise ValueError("not an avcC record")
    sps, pos = _read_nals(data, 6, data[5] & 0x1F)
    pps, _ = _read_nals(data, pos + 1, data[pos])
    return sps + pps


def _hvcc_nals(data: bytes) -> list[bytes]:
    """VPS, SPS, PPS (and SEI) NAL units of an HEVCDecoderConfigurationRecord (ISO/IEC 14496-15 8.3.3.1)."""
    if data[0] != 1 or len(data) < 23:
        raise ValueError("not an hvcC record")
    nals: list[bytes] = []
    pos = 23
    for _ in range(data[22]):  # arrays: one per NAL unit type
        count = int.from_bytes(data[pos + 1 : pos + 3], "big")
        found, pos = _read_nals(data, pos + 3, count)
        nals += found
    return nals


SMALL_PACKET = 4096  # bytes; a packet of parameter sets / SEI only is far smaller than this


def _first_slice(view: np.ndarray, codec: str) -> tuple[bool, bool] | None:
    """(is an IRAP/IDR picture, is the first slice of its picture) of the first VCL NAL unit of an Annex-B
    packet; None when the packet has no VCL NAL unit (parameter sets or SEI only)."""
    # the first slice header follows the parameter sets and SEI, well inside SMALL_PACKET; bytes.find visits
    # only the start codes (per packet, holding the GIL: ≈ 10x quicker than array compares, bench_nal_scan)
    head = view[:SMALL_PACKET].tobytes()
    size = len(head)
    pos = head.find(b"\x00\x00\x01")
    while 0 <= pos <= size - 4:
        i = pos + 3
        if i + 2 >= size:
            break
        if codec == "h264":
            kind = head[i] & 0x1F
            if 1 <= kind <= 5:  # slice header: first_mb_in_slice ue(v) is 0 iff its first bit is 1
                return kind == 5, bool(head[i + 1] & 0x80)
        else:
            kind = (head[i] >> 1) & 0x3F
            if kind < 32:  # first_slice_segment_in_pic_flag is the first bit after the 2-byte header
                return 16 <= kind <= 23, bool(head[i + 2] & 0x80)
        pos = head.find(b"\x00\x00\x01", i)
    return None


def has_picture(view: np.ndarray, codec: str) -> bool:
    """Whether an Annex-B packet carries a coded slice (a VCL NAL unit); False for parameter sets / SEI."""
    if view.size >= SMALL_PACKET or codec not in ANNEXB_CODECS:
        return True
    return _first_slice(view, codec) is not None or not nal_types(view, codec)


class AccessUnits:
    """Joins the packets of a live Annex-B source into whole access units (one picture per packet).

    FFmpeg's RTSP client can hand out one picture in several packets: parameter sets alone, and — when the
    camera (or GStreamer's ``config-interval``) repeats the parameter sets in front of every slice of a
    multi-slice key frame — each slice of a key frame on its own. Fed like that, FFmpeg's decoder makes one
    (half-grey) picture per part and its timestamps slip by a picture, and NVDEC would be told ENDOFPICTURE
    in the middle of a picture. So parameter-set packets go in front of the next picture, and a key picture
    is held until the next packet shows whether it continues it (its first slice is not the picture's
    first). Holding costs one packet of delay on key pictures only: always for a session's first key
    picture, and for later ones only once this source has been seen to split a picture.
    """

    def __init__(self, codec: str) -> None:
        self.codec = codec
        self._pending: list[bytes] = []  # parameter sets / SEI waiting for their picture
        self._held: Packet | None = None  # a key picture that may continue in the next packet
        self._held_parts: list[bytes] = []
        self._first_key = True
        self.splits = 0  # pictures that came in several packets and were joined

    def push(self, view: np.ndarray, pts: int | None, is_key: bool, raw: Any) -> list[Packet]:
        """The packets to decode now (0, 1 or 2)."""
        if self.codec not in ANNEXB_CODECS:
            return [Packet(raw if raw is not None else view, pts, is_key, raw)]
        small = view.size < SMALL_PACKET
        first = _first_slice(view, self.codec) if small or is_key or self._held else None
        if first is None and small and nal_types(view, self.codec):
            self._pending.append(view.tobytes())
            return []
        out: list[Packet] = []
        if self._held is not None:
            if first is not None and not first[1]:  # continues the held picture
                self.splits += 1
                self._held_parts += [*self._pending, view.tobytes()]
                self._pending.clear()
                if self._held.pts is None:
                    self._held.pts = pts
                return []
            out.append(self._release())
        key = first is not None and first[0]
        if key and (self._first_key or self.splits):
            self._first_key = False
            self._held = Packet(b"", pts, True)
            self._held_parts = [*self._pending, view.tobytes()]
            self._pending.clear()
            return out
        if self._pending:
            data = np.frombuffer(b"".join(self._pending) + view.tobytes(), np.uint8)
            self._pending.clear()
            out.append(Packet(data, pts, is_key or key, None))
        else:
            out.append(Packet(raw if raw is not None else view, pts, is_key or key, raw))
        return out

    def _release(self) -> Packet:
        held, self._held = self._held, None
        assert held is not None
        held.data = np.frombuffer(b"".join(self._held_parts), np.uint8)
        self._held_parts = []
        return held

    def flush(self) -> list[Packet]:
        """What is still held at the end of the input."""
        return [self._release()] if self._held is not None else []


def nal_types(data: bytes | np.ndarray, codec: str) -> list[int]:
    """NAL unit types of an Annex-B buffer, in order (for tests and diagnostics)."""
    buf = bytes(data)
    types: list[int] = []
    pos = buf.find(b"\x00\x00\x01")
    while pos >= 0 and pos + 3 < len(buf):
        head = buf[pos + 3]
        types.append(head & 0x1F if codec == "h264" else (head >> 1) & 0x3F)
        pos = buf.find(b"\x00\x00\x01", pos + 3)
    return types
