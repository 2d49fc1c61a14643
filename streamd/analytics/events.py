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
        empty = np.zeros(len(self.names), bool)
        for i in np.flatnonzero(track_id >= 0):
            tid = int(track_id[i])
            now = membership[i]
            before = self.inside.get(tid, empty)
            self.classes[tid] = int(class_id[i])
            if (now != before).any():
                for k in np.flatnonzero(now & ~before):
                    events.append(ZoneEvent("enter", self.names[k], tid, int(class_id[i])))
                for k in np.flatnonzero(before & ~now):
                    events.append(ZoneEvent("leave", self.names[k], tid, int(class_id[i])))
            self.inside[tid] = now.copy()
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
