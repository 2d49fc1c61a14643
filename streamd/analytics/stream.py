"""``StreamAnalytics``: everything after detection for one stream, behind a narrow API.

Called from two threads of the process that holds the stream:

- the stream's ingest thread, for every decoded frame, before it enters the batcher:
  ``should_detect(frame)``; when False the frame is skipped (not batched; counted as ``skipped``) and
  ``on_skipped(frame)`` is called;
- the result thread, for every detected frame, in frame order: ``on_result(result)``.

Both return the JSON lines to write, in order: the frame line (detections with ``zones``, ``track_id``,
``track_age``) and then event lines (``"type": "event"``). With ``tracking.fill_skipped`` a skipped frame
gets a line of predicted boxes (``"predicted": true``), written after the lines of every earlier frame: at
once from ``on_skipped`` when no earlier frame is still in the detector, else from the ``on_result`` that
settles it. Hold ``lock`` while calling and handing the returned lines on (it is an RLock), so lines of one
stream reach the sinks in frame order from both threads.

The end of the stream: every track still in a zone gets its ``leave`` (stamped with the stream's last frame),
so every ``enter`` has a ``leave``. ``end_of_stream()`` is called by the ingest thread once its last frame is
queued (a file's end, a stream stopped by a reload or a shutdown); the leaves come after the lines of the
frames still in the detector: at once when none is, else from the ``on_result`` that settles the last one.
``finish()`` (the pipeline closing, the stream removed) returns whatever is still held, those leaves
included, at once. Both are idempotent.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from streamd.analytics.events import ZoneEvent, ZoneEvents
from streamd.analytics.rate import DetectRate
from streamd.analytics.tracker import ByteTracker
from streamd.analytics.zones import ZoneSet
from streamd.sinks.record import Annotations, event_json_line, to_json_line
from streamd.types import Detections, Frame, FrameResult

log = logging.getLogger(__name__)


def stream_time(frame: Frame) -> float:
    """Seconds on the stream's timeline: the pts, else the arrival time."""
    return frame.pts if frame.pts is not None else frame.wall_time


class StreamAnalytics:
    """Detection rate, zones, tracking and zone events of one stream (see the module docstring)."""

    def __init__(self, stream: Any, names: Sequence[str]) -> None:
        """``stream``: a ``streamd.config.StreamConfig``; ``names``: model.class_names."""
        self.stream_id: str = stream.id
        self.names = tuple(names)
        self.lock = threading.RLock()
        self.rate = DetectRate(stream.detect_fps) if stream.detect_fps is not None else None
        tracking = stream.tracking
        self.tracker = ByteTracker(tracking) if tracking.enabled else None
        self.zones = ZoneSet(stream.zones) if stream.zones else None
        self.zones_only = bool(stream.zones_only)
        self.events = (
            ZoneEvents(self.zones.names, self.zones.leave_after_s)
            if self.zones is not None and self.tracker is not None
            else None
        )
        self.fill_skipped = self.tracker is not None and tracking.fill_skipped and self.rate is not None
        self.skipped = 0
        self.detected = 0
        self._in_flight: collections.deque[int] = collections.deque()  # frames sent to the detector
        self._held: collections.deque[Frame] = collections.deque()  # skipped frames waiting for their turn
        self._checked_size: tuple[int, int] | None = None
        self._ended = False  # end_of_stream() was called: the zones close once nothing is in flight
        self._last: tuple[int, float | None, float, int, int] | None = None  # the latest frame, no pixels

    @property
    def active(self) -> bool:
        """False when nothing is configured: the caller may skip the hook and write plain lines."""
        return self.rate is not None or self.tracker is not None or self.zones is not None

    # -- ingest thread ---------------------------------------------------------------------------------------
    def should_detect(self, frame: Frame) -> bool:
        """True: send the frame to the detector. False: skip it (then call ``on_skipped``)."""
        with self.lock:
            if self.rate is not None and not self.rate.should_detect(stream_time(frame)):
                self.skipped += 1
                return False
            self.detected += 1
            self._in_flight.append(frame.index)
            return True

    def on_skipped(self, frame: Frame) -> list[str]:
        """A skipped frame: its predicted line now, or later (``fill_skipped``); nothing otherwise."""
        with self.lock:
            self._seen(frame)
            if not self.fill_skipped:
                return []
            meta = Frame(
                frame.stream_id,
                frame.index,
                frame.pts,
                frame.width,
                frame.height,
                wall_time=frame.wall_time,
                t_decoded=frame.t_decoded,
                decode_ms=frame.decode_ms,
            )  # fmt: skip  (no pixels kept)
            if self._in_flight or self._held:
                self._held.append(meta)
                return []
            return [self._predicted_line(meta)]

    # -- result thread ---------------------------------------------------------------------------------------
    def on_result(self, result: FrameResult) -> list[str]:
        """Lines for a detected frame: held predicted lines of earlier frames, the frame line, its events,
        then predicted lines of later skipped frames that no longer wait for anything."""
        frame = result.frame
        with self.lock:
            while self._in_flight and self._in_flight[0] <= frame.index:  # lower ones were dropped
                self._in_flight.popleft()
            self._seen(frame)
            lines = self._release(before=frame.index)
            lines += self._frame_lines(result)
            lines += self._release(before=self._in_flight[0] if self._in_flight else None)
            if self._ended and not self._in_flight:
                lines += self._close_zones()
            return lines

    # -- end of the stream -----------------------------------------------------------------------------------
    def end_of_stream(self) -> list[str]:
        """The ingest thread queued the stream's last frame: the zone leaves now if no frame is in the
        detector (then with any held lines), else nothing (the last ``on_result`` brings them)."""
        with self.lock:
            self._ended = True
            if self._in_flight:
                return []
            return self._release(before=None) + self._close_zones()

    def finish(self) -> list[str]:
        """The stream is done with (pipeline closing, stream removed): every line still held (predicted lines
        after the last result, the zone leaves of the tracks still inside)."""
        with self.lock:
            self._in_flight.clear()
            return self._release(before=None) + self._close_zones()

    # -- internals -------------------------------------------------------------------------------------------
    def _seen(self, frame: Frame) -> None:
        if self._last is None or frame.index >= self._last[0]:
            self._last = (frame.index, frame.pts, frame.wall_time, frame.width, frame.height)

    def _close_zones(self) -> list[str]:
        """``leave`` for every track still in a zone, at the stream's last frame (nothing the second time)."""
        if self.events is None or self._last is None:
            return []
        events = self.events.end_all()
        if not events:
            return []
        index, pts, wall_time, width, height = self._last
        last = Frame(self.stream_id, index, pts, width, height, wall_time=wall_time)
        return [event_json_line(last, e.event, e.zone, e.track_id, e.class_id, self.names) for e in events]

    def _release(self, before: int | None) -> list[str]:
        lines = []
        while self._held and (before is None or self._held[0].index < before):
            lines.append(self._predicted_line(self._held.popleft()))
        return lines

    def _check_zones(self, frame: Frame) -> None:
        size = (frame.width, frame.height)
        if self.zones is None or size == self._checked_size:
            return
        self._checked_size = size
        outside = self.zones.outside(frame.width, frame.height)
        if outside:
            log.error(
                "stream %s: zone(s) %s reach outside the %dx%d frame (streams[].zones[].polygon is in source "
                "pixels); detections there can never be inside",
                self.stream_id, ", ".join(outside), frame.width, frame.height,
            )  # fmt: skip

    def _frame_lines(self, result: FrameResult) -> list[str]:
        frame, det = result.frame, result.detections
        notes = Annotations(zone_names=self.zones.names if self.zones is not None else ())
        events: list[ZoneEvent] = []
        ended: list[int] = []
        if self.tracker is not None:
            up = self.tracker.update(det.xyxy, det.score, det.class_id, frame.index, stream_time(frame))
            notes.track_id, notes.track_age, ended = up.track_id, up.track_age, up.ended
            tracked = up.track_id >= 0
            if not tracked.all():  # low score, continues no track: not written (ByteTrack's output)
                det = Detections(det.xyxy[tracked], det.score[tracked], det.class_id[tracked])
                notes.track_id, notes.track_age = up.track_id[tracked], up.track_age[tracked]
                result = FrameResult(frame, det, result.latency_ms)
        if self.zones is not None:
            self._check_zones(frame)
            notes.zones = self.zones.membership(det.xyxy, det.class_id, (frame.width, frame.height))
            if self.events is not None and notes.track_id is not None:
                events = self.events.update(notes.track_id, det.class_id, notes.zones, stream_time(frame))
        if self.events is not None:
            events += self.events.end(ended)
        if self.zones_only and notes.zones is not None:
            keep = notes.zones.any(axis=1)
            if not keep.all():
                det = Detections(det.xyxy[keep], det.score[keep], det.class_id[keep])
                notes.zones = notes.zones[keep]
                if notes.track_id is not None and notes.track_age is not None:
                    notes.track_id, notes.track_age = notes.track_id[keep], notes.track_age[keep]
                result = FrameResult(frame, det, result.latency_ms)
        lines = [to_json_line(result, self.names, notes)]
        lines += [event_json_line(frame, e.event, e.zone, e.track_id, e.class_id, self.names) for e in events]
        return lines

    def _predicted_line(self, frame: Frame) -> str:
        assert self.tracker is not None
        p = self.tracker.predict(frame.index)
        xyxy = p.xyxy.copy()
        if len(xyxy):
            np.clip(xyxy[:, 0::2], 0, frame.width, out=xyxy[:, 0::2])
            np.clip(xyxy[:, 1::2], 0, frame.height, out=xyxy[:, 1::2])
        det = Detections(xyxy, p.score, p.class_id)
        notes = Annotations(track_id=p.track_id, track_age=p.track_age, predicted=True)
        if self.zones is not None:
            notes.zone_names = self.zones.names
            notes.zones = self.zones.membership(xyxy, p.class_id, (frame.width, frame.height))
            if self.zones_only:
                keep = notes.zones.any(axis=1)
                det = Detections(xyxy[keep], p.score[keep], p.class_id[keep])
                notes.zones, notes.track_id, notes.track_age = (
                    notes.zones[keep],
                    p.track_id[keep],
                    p.track_age[keep],
                )
        latency = {
            "decode": round(frame.decode_ms, 3),
            "queue": 0.0,
            "total": round((time.perf_counter() - frame.t_decoded) * 1e3 + frame.decode_ms, 3),
        }
        return to_json_line(FrameResult(frame, det, latency), self.names, notes)


def build_analytics(config: Any) -> dict[str, StreamAnalytics]:
    """One ``StreamAnalytics`` per stream of a ``streamd.config.Config`` that configures any analytics."""
    out = {}
    for s in config.streams:
        a = StreamAnalytics(s, config.model.class_names)
        if a.active:
            out[s.id] = a
    return out
