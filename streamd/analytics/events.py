"""Zone events derived from tracks: ``enter`` when a track's detection comes into a zone (also when the track
starts inside one), ``leave`` when it has been seen outside for the zone's ``leave_after_s`` of stream time
without coming back, when the track ends while inside, or when the stream ends. So every ``leave`` has an
earlier ``enter`` of the same track and zone, and every ``enter`` gets its ``leave``.

Dwell (``zones[].dwell_s``): ``dwell`` once per visit, at the first frame the track is seen inside with
``dwell_s`` or more of stream time since its ``enter``. ``time_in_zone_s`` rides on ``dwell`` (the time so
far) and on ``leave``: from the ``enter`` frame to the first frame seen outside (the one that started the
``leave_after_s`` countdown), or, when the track or the stream ends inside, to the last frame seen inside.
A visit is one ``enter`` to its ``leave``: jitter across the edge that ``leave_after_s`` absorbs does not
end it.

Hysteresis: a box's anchor point jitters by a few pixels from frame to frame, so a track standing or
walking along a zone's edge crosses it back and forth. Entering counts at once; going out starts a countdown
that coming back in cancels, so the jitter costs no events at all, and a real walk out is reported once, at
the frame that confirms it (``leave_after_s`` after the first frame outside).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class ZoneEvent:
    event: str  # "enter" | "dwell" | "leave"
    zone: str
    track_id: int
    class_id: int
    time_in_zone_s: float | None = None  # dwell and leave: stream seconds since the visit's enter


class ZoneEvents:
    """Per track, the zones it is in (a bool row over the stream's zones) and, per zone, since when (stream
    seconds) it has been seen outside while still counted in (NaN: not outside), when its visit began, when it
    was last seen inside and whether the visit had its ``dwell``."""

    def __init__(
        self,
        zone_names: list[str],
        leave_after_s: float | Sequence[float] = 0.0,
        dwell_s: float | Sequence[float | None] | None = None,
    ) -> None:
        self.names = list(zone_names)
        z = len(self.names)
        self.leave_after_s = np.broadcast_to(np.asarray(leave_after_s, np.float64), (z,))
        dwell = dwell_s if isinstance(dwell_s, Sequence) else [dwell_s] * z
        self.dwell_s = np.array([np.inf if d is None else d for d in dwell], np.float64)  # inf: never
        self.inside: dict[int, np.ndarray] = {}
        self.out_since: dict[int, np.ndarray] = {}
        self.entered: dict[int, np.ndarray] = {}  # (z,) stream time of the visit's enter (NaN: not in)
        self.last_in: dict[int, np.ndarray] = {}  # (z,) stream time last seen inside
        self.dwelt: dict[int, np.ndarray] = {}  # (z,) bool: this visit had its dwell event
        self.classes: dict[int, int] = {}
        self.counts = {"enter": 0, "dwell": 0, "leave": 0}

    def update(
        self, track_id: np.ndarray, class_id: np.ndarray, membership: np.ndarray, t: float = 0.0
    ) -> list[ZoneEvent]:
        """Tracked detections of one frame at stream time ``t`` (track_id >= 0 rows only are read) ->
        enter/leave events."""
        events: list[ZoneEvent] = []
        rows = np.flatnonzero(track_id >= 0)
        if len(rows) == 0:
            return events
        ids = track_id[rows].tolist()
        classes = class_id[rows].tolist()
        seen_in = membership[rows]
        z, shape = len(self.names), seen_in.shape
        before = np.array([self.inside.get(tid, np.zeros(z, bool)) for tid in ids]).reshape(shape)
        since = np.array([self.out_since.get(tid, np.full(z, np.nan)) for tid in ids]).reshape(shape)
        entered = np.array([self.entered.get(tid, np.full(z, np.nan)) for tid in ids]).reshape(shape)
        last_in = np.array([self.last_in.get(tid, np.full(z, np.nan)) for tid in ids]).reshape(shape)
        dwelt = np.array([self.dwelt.get(tid, np.zeros(z, bool)) for tid in ids]).reshape(shape)
        going = before & ~seen_in  # counted in, seen outside
        since = np.where(going, np.where(np.isnan(since), t, since), np.nan)
        leave = going & (t - since >= self.leave_after_s - 1e-6)  # pts carry rounding from their time base
        enter = seen_in & ~before
        now = (before & ~leave) | seen_in
        stayed = since - entered  # leave: enter to the first frame outside
        entered = np.where(enter, t, np.where(leave, np.nan, entered))
        last_in = np.where(seen_in, t, last_in)
        dwelt &= ~enter
        dwell = seen_in & ~dwelt & (t - entered >= self.dwell_s - 1e-6)
        dwelt |= dwell
        since[leave] = np.nan
        for i, k in zip(*np.nonzero(enter | leave), strict=True):  # only the changes
            if enter[i, k]:
                events.append(ZoneEvent("enter", self.names[k], ids[i], classes[i]))
            else:
                events.append(ZoneEvent("leave", self.names[k], ids[i], classes[i], float(stayed[i, k])))
        for i, k in zip(*np.nonzero(dwell), strict=True):
            events.append(ZoneEvent("dwell", self.names[k], ids[i], classes[i], t - float(entered[i, k])))
        for i, tid in enumerate(ids):
            self.inside[tid] = now[i]
            self.out_since[tid] = since[i]
            self.entered[tid], self.last_in[tid], self.dwelt[tid] = entered[i], last_in[i], dwelt[i]
            self.classes[tid] = classes[i]
        self._count(events)
        return events

    def end(self, track_ids: list[int]) -> list[ZoneEvent]:
        """Tracks that ended: ``leave`` every zone they were in."""
        events: list[ZoneEvent] = []
        for tid in track_ids:
            row = self.inside.pop(tid, None)
            self.out_since.pop(tid, None)
            self.dwelt.pop(tid, None)
            stayed = self.last_in.pop(tid, np.zeros(0)) - self.entered.pop(tid, np.zeros(0))
            cls = self.classes.pop(tid, -1)
            if row is not None:
                events.extend(
                    ZoneEvent("leave", self.names[k], tid, cls, float(stayed[k])) for k in np.flatnonzero(row)
                )
        self._count(events)
        return events

    def end_all(self) -> list[ZoneEvent]:
        """The stream ended: ``leave`` for every track still in a zone (in track order)."""
        return self.end(sorted(self.inside))

    def _count(self, events: list[ZoneEvent]) -> None:
        for e in events:
            self.counts[e.event] += 1
