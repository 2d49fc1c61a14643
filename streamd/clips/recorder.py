"""``ClipRecorder``: one stream's packet ring and its open clip; events in, finished clips to the writer.

Called from three threads of the process that holds the stream, under one lock:

- the stream thread, as the reader's packet tap (before decoding): ``begin(info)`` per session,
  ``packet(packet)`` per demuxed packet, ``place(offset)`` with the session's first frame, ``end()``;
- the result thread: ``on_result`` per detected frame (the detector's progress, events, classes);
- whoever asks for a clip (the control API): ``trigger(None, "api")``.

It only ever sees compressed packets: no decoded picture and no GPU memory reaches it or the writer, so a
clip costs no GPU work. An event at stream time ``t`` opens a clip from the last key frame at or before
``t - pre_roll_s`` to ``t + post_roll_s``; an event while a clip is open whose pre-roll reaches into it
extends that clip instead (one clip, up to ``max_length_s``). The clip is finished at the first packet past
its end (decode order: the packets before it are all it needs), when the stream's parameters change, or
when the stream ends, and handed to the :class:`~streamd.clips.writer.ClipWriter`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from streamd.analytics.annotations import FrameEvent, Output
from streamd.clips.writer import ClipJob, ClipWriter
from streamd.config.clips import ClipsConfig
from streamd.ingest.packet_ring import PacketRing, RingPacket
from streamd.ingest.sources.base import Packet, VideoInfo
from streamd.types import FrameResult

log = logging.getLogger(__name__)
MAX_CLIP_RING_FACTOR = 16  # an open clip holds at most this many rings' worth of bytes, then it is cut
MAX_LAG_S = 10.0  # a clip waits at most this long (stream time) past its end for the detector's events


def same_stream(a: VideoInfo, b: VideoInfo) -> bool:
    """Whether packets of two sessions can follow each other in one file."""
    return (a.codec, a.width, a.height, a.extradata, a.annexb) == (
        b.codec,
        b.width,
        b.height,
        b.extradata,
        b.annexb,
    )


def with_clip(line: str, path: str) -> str:
    """An event line (one JSON object and a newline, as ``streamd.worker.output`` writes it) with ``clip``
    added as its last key."""
    assert line.endswith("}\n"), line
    return f'{line[:-2]},"clip":{json.dumps(path)}}}\n'


@dataclass(slots=True)
class _Clip:
    path: Path
    start: float  # stream time the clip was asked to start at (it starts at the key frame before)
    end: float
    packets: list[RingPacket]
    bytes: int = 0
    events: int = 1
    reasons: set[str] = field(default_factory=set)


class ClipRecorder:
    """Packets and events of one stream -> clips (see the module docstring)."""

    def __init__(self, stream_id: str, cfg: ClipsConfig, writer: ClipWriter) -> None:
        self.stream_id = stream_id
        self.cfg = cfg
        self.writer = writer
        self.folder = Path(cfg.dir) / stream_id
        self.folder.mkdir(parents=True, exist_ok=True)
        self.ring = PacketRing(cfg.max_ring_bytes)
        self.lock = threading.Lock()
        self.clips = 0  # clips started
        self.extended = 0  # events that extended an open clip
        self.cut = 0  # clips finished early (stream parameters changed, too many bytes)
        self._open: list[_Clip] = []  # the last one takes new events; one before it is capped, ending
        self._seen: float | None = None  # the latest frame the detector has finished
        self._placed = False
        self._ended = False  # the stream thread has stopped
        self._broken = False  # an internal error stopped this stream's clips
        self._last = -float("inf")  # the latest packet time stamped
        self._on = frozenset(cfg.on)
        self._classes = None if cfg.classes is None else np.asarray(cfg.classes)

    # -- the stream thread: the reader's packet tap
    def begin(self, info: VideoInfo) -> None:
        with self.lock:
            for clip in list(self._open):
                if not same_stream(clip.packets[0].info, info):
                    self.cut += 1
                    self._finish(clip)
            self.ring.begin(info)
            self._placed = False

    def packet(self, packet: Packet) -> None:
        if self._broken:
            return
        try:
            self._packet(packet)
        except Exception:  # a bug in the clip path must not stop the stream
            self._broken = True
            log.exception(
                "stream %s: clips stopped after an internal error; the stream goes on", self.stream_id
            )

    def _packet(self, packet: Packet) -> None:
        with self.lock:
            entry = self.ring.push(packet)
            if entry is None:
                return
            for clip in list(self._open):
                clip.packets.append(entry)
                clip.bytes += len(entry.data)
                if clip.bytes > MAX_CLIP_RING_FACTOR * self.cfg.max_ring_bytes:
                    self.cut += 1
                    self._finish(clip)
            if self._open:
                self._maybe_finish(entry.t)
            newest = entry.t
            if newest is not None:
                self._last = max(self._last, newest)
            if newest is not None and self._seen is not None:
                self.ring.trim(min(newest, self._seen) - self.cfg.pre_roll_s)

    def place(self, offset: float) -> None:
        if self._placed:  # once per session; every frame calls this
            return
        with self.lock:
            self._placed = True
            if placed := self.ring.place(offset):
                self._last = max([self._last, *(p.t for p in placed if p.t is not None)])
                self._maybe_finish(self.ring.newest)

    def end(self) -> None:
        """The stream thread stopped: open clips end with what they have once the detector has finished its
        last frame (events of the frames still in flight may extend them), or at ``finish_all``."""
        with self.lock:
            self._ended = True
            self._maybe_finish(self.ring.newest)

    def finish_all(self) -> None:
        """Open clips end now, with what they have (the pipeline closing, the stream replaced)."""
        with self.lock:
            for clip in list(self._open):
                self._finish(clip)

    # -- events
    def on_result(
        self, result: FrameResult, outputs: Sequence[Output] = (), lines: Sequence[str] = ()
    ) -> list[str]:
        """A detected frame and its analytics outputs (with their JSON ``lines``, one per output): events
        named in ``on`` start or extend a clip and their lines get its path; so does a detection of a
        listed class with ``on: [class]``. Returns the lines."""
        out = list(lines)
        t = result.frame.pts
        if t is None:
            return out
        self.seen(t)
        for i, output in enumerate(outputs):
            if not isinstance(output, FrameEvent) or output.event.event not in self._on:
                continue
            if self._classes is not None and output.event.class_id not in self._classes:
                continue
            path = self.trigger(output.frame.pts, output.event.event)
            if path is not None and i < len(out):
                out[i] = with_clip(out[i], path)
        if "class" in self._on:
            found = result.detections.class_id
            if self._classes is not None:
                found = found[np.isin(found, self._classes)]
            if found.size:
                self.trigger(t, "class")
        return out

    def seen(self, t: float) -> None:
        """The detector has finished the frame at stream time ``t``: no event before it is still coming."""
        with self.lock:
            self._seen = t if self._seen is None else max(self._seen, t)
            self._maybe_finish(self.ring.newest)

    def trigger(self, t: float | None, reason: str) -> str | None:
        """A clip around stream time ``t`` (None: the newest packet's, e.g. an API request); returns its path,
        or None when nothing is buffered yet."""
        cfg = self.cfg
        with self.lock:
            t = self.ring.newest if t is None else t
            if t is None:
                return None
            clip = self._open[-1] if self._open else None
            if clip is not None and t - cfg.pre_roll_s <= clip.end:
                cap = clip.start + cfg.max_length_s
                clip.end = min(max(clip.end, t + cfg.post_roll_s), cap)
                if t + cfg.post_roll_s <= cap:  # else: this one ends at its cap, a new one takes the event
                    clip.events += 1
                    clip.reasons.add(reason)
                    self.extended += 1
                    return str(clip.path)
            packets = self._current_session(self.ring.since(t - cfg.pre_roll_s))
            if not packets:
                return None
            clip = _Clip(self._name(), t - cfg.pre_roll_s, t + cfg.post_roll_s, packets, reasons={reason})
            clip.bytes = sum(len(p.data) for p in packets)
            self._open.append(clip)
            self.clips += 1
            log.info("stream %s: clip %s (%s at %.2f s)", self.stream_id, clip.path.name, reason, t)
            self._maybe_finish(self.ring.newest)
            return str(clip.path)

    # -- inside the lock
    @staticmethod
    def _current_session(packets: list[RingPacket]) -> list[RingPacket]:
        """From the last change of stream parameters on (a session always starts on a key frame)."""
        for i in range(len(packets) - 1, 0, -1):
            if not same_stream(packets[i].info, packets[i - 1].info):
                return packets[i:]
        return packets

    def _name(self) -> Path:
        now = time.time()
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
        return self.folder / f"{self.stream_id}-{stamp}.{int(now * 1000) % 1000:03d}Z.mp4"

    def _maybe_finish(self, newest: float | None) -> None:
        """Finish the open clips that no event can extend any more and whose end the packets have passed.
        The last clip waits until the detector has passed its end by a pre-roll (a later event's pre-roll
        cannot reach back into it), or the packets have by ``MAX_LAG_S`` more (a stalled detector must not
        hold it open); one before it is capped and ends as soon as the packets pass its end."""
        drained = self._ended and self._seen is not None and self._seen >= self._last - 1e-6
        for clip in list(self._open):
            if drained:  # the stream ended and the detector has seen its last frame
                self._finish(clip)
                continue
            if newest is None or newest <= clip.end:
                continue
            settled = clip.end + self.cfg.pre_roll_s
            last = clip is self._open[-1]
            if last and not (
                (self._seen is not None and self._seen > settled) or newest > settled + MAX_LAG_S
            ):
                continue
            self._finish(clip)

    def _finish(self, clip: _Clip) -> None:
        """Hand a clip to the writer: its packets up to the first one past its end (decode order: the ones
        before it are all their pictures need), without a tail not yet placed on the timeline."""
        self._open.remove(clip)
        packets = []
        for p in clip.packets:
            if p.t is None or p.t > clip.end:
                break
            packets.append(p)
        if packets:
            self.writer.submit(ClipJob(clip.path, packets, self.cfg.max_bytes, self.cfg.max_age_s))
