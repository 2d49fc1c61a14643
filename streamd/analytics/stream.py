"""``StreamAnalytics``: everything after detection for one stream, behind a narrow API.

Called from two threads of the process that holds the stream:

- the stream's ingest thread, for every decoded frame, before it enters the batcher:
  ``should_detect(frame)``; when False the frame is skipped (not batched; counted as ``skipped``) and
  ``skip(frame)`` is called;
- the result thread, for every detected frame, in frame order: ``annotate(result)``.

Both return what to write, in order, as typed values (``streamd.analytics.annotations``; the worker's output
edge, ``streamd.worker.output``, makes the JSON lines): the frame (``AnnotatedFrame``: detections with their
zones, track id and age) and then its events (``FrameEvent``: zone enter/dwell/leave, line cross; lines and
dwell read detected frames only, so a track carried over skipped frames moves in one step). With
``tracking.fill_skipped`` a skipped frame gets an ``AnnotatedFrame`` of predicted boxes, handed back after
the outputs of every earlier frame: at once from ``skip`` when no earlier frame is still in the detector,
else from the ``annotate`` that settles it. Hold ``lock`` while calling and handing the outputs on (it is
an RLock), so one stream's lines reach the sinks in frame order from both threads.

The end of the stream: every track still in a zone gets its ``leave`` (stamped with the stream's last frame),
so every ``enter`` has a ``leave``. ``stream_ended()`` is called by the ingest thread once its last frame is
queued (a file's end, a stream stopped by a reload or a shutdown); the leaves come after the outputs of the
frames still in the detector: at once when none is, else from the ``annotate`` that settles the last one.
``flush()`` (the pipeline closing, the stream removed) returns whatever is still held, those leaves
included, at once. Both are idempotent.

``on_skipped``, ``on_result``, ``end_of_stream`` and ``finish`` are the same four calls returning finished
JSON lines, for callers that have not moved to the typed ones yet.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from streamd.analytics.annotations import AnnotatedFrame, Annotations, FrameEvent, Output
from streamd.analytics.events import ZoneEvent, ZoneEvents
from streamd.analytics.lines import LineCrossings, LineEvent, LineSet
from streamd.analytics.rate import DetectRate
from streamd.analytics.tracker import ByteTracker
from streamd.analytics.zones import ZoneSet
from streamd.types import Detections, Frame, FrameResult

log = logging.getLogger(__name__)


def stream_time(frame: Frame) -> float:
    """Seconds on the stream's timeline: the pts, else the arrival time."""
    return frame.pts if frame.pts is not None else frame.wall_time


def _without_pixels(frame: Frame) -> Frame:
    """The frame's stamps only: a held skipped frame must not keep its picture (host, pending conversion, or
    decoder surface) alive."""
    return dataclasses.replace(frame, image=None, surface=None, pending=None)


def _keep(det: Detections, rows: Any) -> Detections:
    return Detections(det.xyxy[rows], det.score[rows], det.class_id[rows])


class StreamAnalytics:
    """Detection rate, zones, tracking and zone events of one stream (see the module docstring)."""

    def __init__(
        self, stream: Any, names: Sequence[str], crossings: dict[tuple[str, str, str], int] | None = None
    ) -> None:
        """``stream``: a ``streamd.config.StreamConfig``; ``names``: model.class_names; ``crossings``: the
        dict the line counters add into (the caller's, kept across reloads of the stream; default: new)."""
        self.stream_id: str = stream.id
        self.names = tuple(names)
        self.lock = threading.RLock()
        self.rate = DetectRate(stream.detect_fps) if stream.detect_fps is not None else None
        tracking = stream.tracking
        self.tracker = ByteTracker(tracking) if tracking.enabled else None
        self.zones = ZoneSet(stream.zones) if stream.zones else None
        self.zones_only = bool(stream.zones_only)
        self.events = (
            ZoneEvents(self.zones.names, self.zones.leave_after_s, self.zones.dwell_s)
            if self.zones is not None and self.tracker is not None
            else None
        )
        lines = getattr(stream, "lines", ())
        self.crossings = (
            LineCrossings(LineSet(lines), self.names, crossings)
            if lines and self.tracker is not None
            else None
        )
        self.fill_skipped = self.tracker is not None and tracking.fill_skipped and self.rate is not None
        self.skipped = 0
        self.detected = 0
        self._in_flight: collections.deque[int] = collections.deque()  # frames sent to the detector
        self._held: collections.deque[Frame] = collections.deque()  # skipped frames waiting for their turn
        self._checked_size: tuple[int, int] | None = None
        self._ended = False  # stream_ended() was called: the zones close once nothing is in flight
        self._last: Frame | None = None  # the latest frame, stamps only

    @property
    def active(self) -> bool:
        """False when nothing is configured: the caller may skip the hook and write plain lines."""
        return self.rate is not None or self.tracker is not None or self.zones is not None

    def line_counts(self) -> dict[tuple[str, str, str], int]:
        """Crossings so far per (line, class label, direction) (any thread)."""
        if self.crossings is None:
            return {}
        with self.lock:
            return dict(self.crossings.counts)

    # -- ingest thread ---------------------------------------------------------------------------------------
    def should_detect(self, frame: Frame) -> bool:
        """True: send the frame to the detector. False: skip it (then call ``skip``)."""
        with self.lock:
            if self.rate is not None and not self.rate.should_detect(stream_time(frame)):
                self.skipped += 1
                return False
            self.detected += 1
            self._in_flight.append(frame.index)
            return True

    def skip(self, frame: Frame) -> list[Output]:
        """A skipped frame: its predicted boxes now, or later (``fill_skipped``); nothing otherwise."""
        with self.lock:
            self._seen(frame)
            if not self.fill_skipped:
                return []
            meta = _without_pixels(frame)
            if self._in_flight or self._held:
                self._held.append(meta)
                return []
            return [self._predicted(meta)]

    # -- result thread ---------------------------------------------------------------------------------------
    def annotate(self, result: FrameResult) -> list[Output]:
        """Outputs for a detected frame: held predicted frames before it, the frame, its events, then
        predicted frames of later skipped frames that no longer wait for anything."""
        frame = result.frame
        with self.lock:
            while self._in_flight and self._in_flight[0] <= frame.index:  # lower ones were dropped
                self._in_flight.popleft()
            self._seen(frame)
            out = self._release(before=frame.index)
            out += self._frame_outputs(result)
            out += self._release(before=self._in_flight[0] if self._in_flight else None)
            if self._ended and not self._in_flight:
                out += self._close_zones()
            return out

    # -- end of the stream -----------------------------------------------------------------------------------
    def stream_ended(self) -> list[Output]:
        """The ingest thread queued the stream's last frame: the zone leaves now if no frame is in the
        detector (then with any held frames), else nothing (the last ``annotate`` brings them)."""
        with self.lock:
            self._ended = True
            if self._in_flight:
                return []
            return self._release(before=None) + self._close_zones()

    def flush(self) -> list[Output]:
        """The stream is done with (pipeline closing, stream removed): everything still held (predicted frames
        after the last result, the zone leaves of the tracks still inside)."""
        with self.lock:
            self._in_flight.clear()
            return self._release(before=None) + self._close_zones()

    # -- internals -------------------------------------------------------------------------------------------
    def _seen(self, frame: Frame) -> None:
        if self._last is None or frame.index >= self._last.index:
            self._last = Frame(
                self.stream_id, frame.index, frame.pts, frame.width, frame.height, wall_time=frame.wall_time
            )

    def _close_zones(self) -> list[Output]:
        """``leave`` for every track still in a zone, at the stream's last frame (nothing the second time)."""
        if self.crossings is not None:
            self.crossings.end_all()
        if self.events is None or self._last is None:
            return []
        last = self._last
        return [FrameEvent(last, e) for e in self.events.end_all()]

    def _release(self, before: int | None) -> list[Output]:
        out: list[Output] = []
        while self._held and (before is None or self._held[0].index < before):
            out.append(self._predicted(self._held.popleft()))
        return out

    def _check_zones(self, frame: Frame) -> None:
        size = (frame.width, frame.height)
        if size == self._checked_size:
            return
        self._checked_size = size
        outside = self.zones.outside(frame.width, frame.height) if self.zones is not None else []
        if outside:
            where = f"{frame.width}x{frame.height}"
            log.error(
                "stream %s: zone(s) %s reach outside the %s frame (streams[].zones[].polygon is in source "
                "pixels); detections there can never be inside",
                self.stream_id,
                ", ".join(outside),
                where,
            )
        far = self.crossings.lines.outside(*size) if self.crossings is not None else []
        if far:
            log.error(
                "stream %s: line(s) %s reach outside the %dx%d frame (streams[].lines[].points are in source "
                "pixels); only the part inside can be crossed",
                self.stream_id,
                ", ".join(far),
                *size,
            )

    def _frame_outputs(self, result: FrameResult) -> list[Output]:
        """A detected frame: tracks, zones, events; rows no track took (and with ``zones_only``, rows in no
        zone) are left out."""
        frame, det = result.frame, result.detections
        track_id = track_age = zones = None
        events: list[ZoneEvent | LineEvent] = []
        ended: list[int] = []
        if self.tracker is not None:
            up = self.tracker.update(det.xyxy, det.score, det.class_id, frame.index, stream_time(frame))
            track_id, track_age, ended = up.track_id, up.track_age, up.ended
            tracked = up.track_id >= 0
            if not tracked.all():  # low score, continues no track: not written (ByteTrack's output)
                det, track_id, track_age = _keep(det, tracked), track_id[tracked], track_age[tracked]
        self._check_zones(frame)
        if self.zones is not None:
            zones = self.zones.membership(det.xyxy, det.class_id, (frame.width, frame.height))
            if self.events is not None and track_id is not None:
                events += self.events.update(track_id, det.class_id, zones, stream_time(frame))
        if self.events is not None:
            events += self.events.end(ended)
        if self.crossings is not None and track_id is not None:
            events += self.crossings.update(track_id, det.class_id, det.xyxy)
            self.crossings.end(ended)
        if self.zones_only and zones is not None:
            keep = zones.any(axis=1)
            if not keep.all():
                det, zones = _keep(det, keep), zones[keep]
                if track_id is not None and track_age is not None:
                    track_id, track_age = track_id[keep], track_age[keep]
        if det is not result.detections:
            result = FrameResult(frame, det, result.latency_ms)
        zone_names = self.zones.names if self.zones is not None else ()
        notes = Annotations(track_id, track_age, zones, zone_names)
        return [AnnotatedFrame(result, notes), *(FrameEvent(frame, e) for e in events)]

    def _predicted(self, frame: Frame) -> AnnotatedFrame:
        """The tracks' predicted boxes at a skipped frame, clipped to it."""
        assert self.tracker is not None
        p = self.tracker.predict(frame.index)
        xyxy = p.xyxy  # new arrays each call: clipped in place
        if len(xyxy):
            w, h = frame.width, frame.height
            np.clip(xyxy, 0, np.array((w, h, w, h), np.float32), out=xyxy)
        det = Detections(xyxy, p.score, p.class_id)
        track_id, track_age, zones = p.track_id, p.track_age, None
        zone_names: Sequence[str] = ()
        if self.zones is not None:
            zone_names = self.zones.names
            zones = self.zones.membership(xyxy, p.class_id, (frame.width, frame.height))
            if self.zones_only:
                keep = zones.any(axis=1)
                det, zones, track_id, track_age = (
                    _keep(det, keep),
                    zones[keep],
                    track_id[keep],
                    track_age[keep],
                )
        latency = {
            "decode": round(frame.decode_ms, 3),
            "queue": 0.0,
            "total": round((time.perf_counter() - frame.t_decoded) * 1e3 + frame.decode_ms, 3),
        }
        notes = Annotations(track_id, track_age, zones, zone_names, predicted=True)
        return AnnotatedFrame(FrameResult(frame, det, latency), notes)


def build_analytics(config: Any) -> dict[str, StreamAnalytics]:
    """One ``StreamAnalytics`` per stream of a ``streamd.config.Config`` that configures any analytics."""
    out = {}
    for s in config.streams:
        a = StreamAnalytics(s, config.model.class_names)
        if a.active:
            out[s.id] = a
    return out
