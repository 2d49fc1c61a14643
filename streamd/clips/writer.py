"""Clip files: a clip's compressed packets remuxed into an MP4 by PyAV (no decode, no encode), on one
background thread per worker process, and retention of each stream's clip folder.

What the demuxers give (``streamd.ingest.sources``): OpenCV's raw mode, and PyAV for RTSP (or with
``annexb`` for NVDEC), hand out Annex-B packets (start codes; parameter sets in front of key frames);
PyAV on an MP4/MKV file for the CPU decoder hands out the container's length-prefixed NAL units with
``avcC``/``hvcC`` extradata. FFmpeg's MP4 muxer takes Annex-B H.264/HEVC and builds its ``avcC``/``hvcC``
box from the parameter sets of the first packet, so length-prefixed packets are turned into Annex-B here
first (the extradata's parameter sets go in front of each key frame; in front of the first one for
Annex-B packets, whose camera may send them only in the SDP). A stream created with
``add_mux_stream`` has no codec context, so nothing is ever encoded.

Timestamps: packets come in decode order, each with its time on the stream's timeline; the clip's pts are
those times from the first one (1/90000 s ticks), and its dts are the same times sorted, moved back by the
largest reordering so that dts <= pts and dts strictly increase, then everything shifted so dts start at 0.

The queue is bounded: a clip that does not fit is dropped and counted; the stream thread never waits.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from streamd.ingest.packet_ring import RingPacket
from streamd.ingest.sources.base import START_CODE, VideoInfo, to_annexb_extradata

log = logging.getLogger(__name__)
TICKS = 90_000  # MP4 video timescale: exact for 24, 25, 30000/1001, 50, 60 ... fps
QUEUE_CLIPS = 16


@dataclass(frozen=True, slots=True)
class ClipJob:
    """A finished clip to write: its packets (decode order, first one a key frame) and its folder's
    retention limits."""

    path: Path
    packets: Sequence[RingPacket]
    max_bytes: int
    max_age_s: float


def length_size(info: VideoInfo) -> int:
    """Bytes of each NAL unit's length prefix in length-prefixed (``avcC``/``hvcC``) packets; 0: Annex-B."""
    extra = info.extradata
    if extra[:1] != b"\x01" or info.codec not in ("h264", "hevc"):
        return 0
    if info.codec == "h264":
        return (extra[4] & 3) + 1 if len(extra) > 4 else 4
    return (extra[21] & 3) + 1 if len(extra) > 21 else 4


def to_annexb(data: bytes, size: int) -> bytes:
    """Length-prefixed NAL units -> Annex-B (start codes)."""
    out, pos = [], 0
    while pos + size <= len(data):
        n = int.from_bytes(data[pos : pos + size], "big")
        pos += size
        out.append(START_CODE)
        out.append(data[pos : pos + n])
        pos += n
    return b"".join(out)


def timestamps(times: Sequence[float]) -> tuple[list[int], list[int]]:
    """(pts, dts) in 1/90000 s ticks for packets in decode order with these presentation times."""
    base = min(times)
    pts = [round((t - base) * TICKS) for t in times]
    order = sorted(pts)
    for i in range(1, len(order)):  # equal times (a broken source): dts must still increase
        order[i] = max(order[i], order[i - 1] + 1)
    delay = max([0, *(o - p for o, p in zip(order, pts, strict=True))])
    dts = [o - delay for o in order]
    shift = -dts[0] if dts[0] < 0 else 0
    return [p + shift for p in pts], [d + shift for d in dts]


def write_mp4(path: Path, packets: Sequence[RingPacket]) -> int:
    """Write ``packets`` (decode order, the first a key frame, every one stamped) as an MP4 at ``path``,
    through a hidden ``.part`` file renamed at the end; returns its size in bytes."""
    import av  # the clip path only: streamd imports PyAV lazily

    if not packets or not packets[0].key:
        raise ValueError("a clip must start with a key frame")
    info = packets[0].info
    size = length_size(info)
    # The parameter sets go in front of the first key frame (Annex-B packets may carry none in-band: an RTSP
    # camera may send them only in the SDP) and, for length-prefixed packets, in front of every key frame.
    params = to_annexb_extradata(info.extradata, info.codec) if info.codec in ("h264", "hevc") else b""
    times = [p.t for p in packets]
    if any(t is None for t in times):
        raise ValueError("a clip's packets must all be on the timeline")
    pts, dts = timestamps(times)  # type: ignore[arg-type]
    part = path.with_name(f".{path.name}.part")
    try:
        with av.open(str(part), "w", format="mp4") as out:
            stream = out.add_mux_stream(info.codec, width=info.width, height=info.height)
            stream.time_base = Fraction(1, TICKS)
            for i, (p, pt, dt) in enumerate(zip(packets, pts, dts, strict=True)):
                data = to_annexb(p.data, size) if size else p.data
                if p.key and (size or i == 0):
                    data = params + data
                packet = av.Packet(data)
                packet.stream = stream
                packet.time_base = stream.time_base
                packet.pts, packet.dts = pt, dt
                packet.is_keyframe = p.key
                out.mux(packet)
        os.replace(part, path)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return path.stat().st_size


def enforce_retention(folder: Path, max_bytes: int, max_age_s: float, keep: Path | None = None) -> list[Path]:
    """Delete the folder's clips older than ``max_age_s``, then the oldest until the rest take at most
    ``max_bytes`` (never ``keep``, the clip just written); returns what was deleted."""
    now = time.time()
    clips = []
    for entry in os.scandir(folder):
        if entry.name.endswith(".mp4") and not entry.name.startswith(".") and entry.is_file():
            st = entry.stat()
            clips.append((st.st_mtime, st.st_size, Path(entry.path)))
    clips.sort()
    total = sum(size for _, size, _ in clips)
    deleted = []
    for mtime, size, clip in clips:
        if clip == keep or (now - mtime <= max_age_s and total <= max_bytes):
            continue
        with contextlib.suppress(FileNotFoundError):
            clip.unlink()
        total -= size
        deleted.append(clip)
    return deleted


class ClipWriter:
    """The thread that writes a worker's clips, from a bounded queue; ``submit`` never waits."""

    def __init__(self, queue_clips: int = QUEUE_CLIPS) -> None:
        self._queue: queue.Queue[ClipJob | None] = queue.Queue(maxsize=queue_clips)
        self._thread = threading.Thread(target=self._run, name="clip-writer", daemon=True)
        self.written = 0
        self.dropped = 0  # clips that found the queue full
        self.failed = 0
        self.bytes = 0
        self.deleted = 0  # clips removed by retention
        self.cpu_s = 0.0  # CPU time the writer thread spent muxing
        self.folders: dict[Path, tuple[int, float]] = {}  # folder -> retention, for the idle sweep

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: ClipJob) -> bool:
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            self.dropped += 1
            log.warning(
                "clips: the writer is behind (%d clips queued); dropped %s", self._queue.qsize(), job.path
            )
            return False
        return True

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued (within ``timeout``), then stop. Safe to call twice."""
        if not self._thread.is_alive():
            return
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._queue.put(None, timeout=0.1)
                break
            except queue.Full:
                if time.monotonic() > deadline:
                    return
        self._thread.join(max(0.0, deadline - time.monotonic()))

    def _run(self) -> None:
        while True:
            try:
                job = self._queue.get(timeout=60.0)
            except queue.Empty:  # idle: age out old clips even when no new one comes
                for folder, (max_bytes, max_age_s) in list(self.folders.items()):
                    self._retain(folder, max_bytes, max_age_s, None)
                continue
            if job is None:
                return
            self._write(job)

    def _write(self, job: ClipJob) -> None:
        started = time.thread_time()
        try:
            self.bytes += write_mp4(job.path, job.packets)
            self.written += 1
            log.debug("clips: wrote %s (%d packets)", job.path, len(job.packets))
        except Exception as exc:  # one bad clip must not stop the others
            self.failed += 1
            log.warning("clips: cannot write %s: %s", job.path, exc)
        self.cpu_s += time.thread_time() - started
        self.folders[job.path.parent] = (job.max_bytes, job.max_age_s)
        self._retain(job.path.parent, job.max_bytes, job.max_age_s, job.path)

    def _retain(self, folder: Path, max_bytes: int, max_age_s: float, keep: Path | None) -> None:
        try:
            self.deleted += len(enforce_retention(folder, max_bytes, max_age_s, keep))
        except OSError as exc:
            log.warning("clips: retention in %s failed: %s", folder, exc)
