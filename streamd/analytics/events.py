"""Zone events derived from tracks: ``enter`` when a track's detection comes into a zone (also when the track
starts inside one), ``leave`` when it goes out, or when the track ends while inside. So every ``leave`` has an
earlier ``enter`` of the same track and zone."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class ZoneEvent:
    event: str  # "enter" | "leave"
    zone: str
    track_id: int
    class_id: int


class ZoneEvents:
    """Per track, the zones it is in (a bool row over the stream's zones)."""

    def __init__(self, zone_names: list[str]) -> None:
        self.names = list(zone_names)
        self.inside: dict[int, np.ndarray] = {}
        self.classes: dict[int, int] = {}
        self.counts = {"enter": 0, "leave": 0}

    def update(self, track_id: np.ndarray, class_id: np.ndarray, membership: np.ndarray) -> list[ZoneEvent]:
        """Tracked detections of one frame (track_id >= 0 rows only are read) -> enter/leave events."""
        events: list[ZoneEvent] = []
        rows = np.flatnonzero(track_id >= 0)
        if len(rows) == 0:
            return events
        ids = track_id[rows].tolist()
        classes = class_id[rows].tolist()
        now = membership[rows]
        empty = np.zeros(len(self.names), bool)
        before = np.array([self.inside.get(tid, empty) for tid in ids]).reshape(now.shape)
        enter, leave = now & ~before, before & ~now
        for i, k in zip(*np.nonzero(enter | leave), strict=True):  # only the changes
            kind = "enter" if enter[i, k] else "leave"
            events.append(ZoneEvent(kind, self.names[k], ids[i], classes[i]))
        for i, tid in enumerate(ids):
            self.inside[tid] = now[i]
            self.classes[tid] = classes[i]
        self._count(events)
        return events

    def end(self, track_ids: list[int]) -> list[ZoneEvent]:
        """Tracks that ended: ``leave`` every zone they were in."""
        events: list[ZoneEvent] = []
        for tid in track_ids:
            row = self.inside.pop(tid, None)
            cls = self.classes.pop(tid, -1)
            if row is not None:
                events.extend(ZoneEvent("leave", self.names[k], tid, cls) for k in np.flatnonzero(row))
        self._count(events)
        return events

    def _count(self, events: list[ZoneEvent]) -> None:
        for e in events:
            self.counts[e.event] += 1
