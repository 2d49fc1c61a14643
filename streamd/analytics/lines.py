"""Lines: named, directed segments that tracks cross; ``cross`` events and per-line counters.

A line is two points in source pixels, first -> second. Its *left* side is the side on your left hand when
you stand on the first point facing the second, looking at the picture as it is shown (y grows downwards):
for ``[[0, 300], [768, 300]]`` left is above the line (smaller y), for ``[[400, 0], [400, 576]]`` left is the
right half of the picture (x > 400). ``in_side`` names the side that is "in"; moving onto it is
``direction: in``, moving off it ``direction: out``.

The rule, per track and line, on the track's anchor point (``anchor``, as for zones) at each frame where the
track has a detection (so a track carried over skipped frames, ``detect_fps``, moves in one step from one
detected frame to the next, and a crossing between them counts once):

1. The track *crossed* the segment when the anchor's motion from its previous position to this one
   intersects the segment itself (touching counts; passing beyond an end point does not).
2. The track *settles* on a side when its anchor is at least ``margin_px`` from the line (perpendicular
   distance); closer than that it keeps the side it had.
3. A crossing counts (one event, one count) when the track settles on the side opposite the one it had
   settled on before, and crossed the segment since it left that side. Settling again on the same side
   forgets the crossing.

So a track standing or jittering on the line counts nothing (it never gets ``margin_px`` away on the other
side), a U-turn back through the line counts nothing, a track that walks around an end of the segment counts
nothing, and a track first seen closer than ``margin_px`` to the line counts only once it has settled on one
side and then crossed. The event is stamped at the frame that settles it (``margin_px`` past the line).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from streamd.analytics.zones import anchor_points

if TYPE_CHECKING:
    from streamd.config.lines import LineConfig


@dataclass(frozen=True, slots=True)
class LineEvent:
    """A track crossed ``line``: onto its "in" side (``direction`` "in") or off it ("out")."""

    line: str
    direction: str  # "in" | "out"
    track_id: int
    class_id: int
    event: str = "cross"


def _cross(ax: np.ndarray, ay: np.ndarray, bx: np.ndarray, by: np.ndarray, px: np.ndarray, py: np.ndarray):
    """z of (b - a) x (p - a), elementwise (broadcast): > 0 when p is clockwise of a->b on the screen."""
    return (bx - ax) * (py - ay) - (by - ay) * (px - ax)


def segments_intersect(p: np.ndarray, q: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Moves p->q (..., 2) against segments a->b (broadcast to p): True where they share a point (touching
    included); a move lying along the segment's line, or no move at all, crosses nothing."""
    o_p = _cross(a[..., 0], a[..., 1], b[..., 0], b[..., 1], p[..., 0], p[..., 1])
    o_q = _cross(a[..., 0], a[..., 1], b[..., 0], b[..., 1], q[..., 0], q[..., 1])
    o_a = _cross(p[..., 0], p[..., 1], q[..., 0], q[..., 1], a[..., 0], a[..., 1])
    o_b = _cross(p[..., 0], p[..., 1], q[..., 0], q[..., 1], b[..., 0], b[..., 1])
    return (o_p * o_q <= 0) & (o_a * o_b <= 0) & ~((o_p == 0) & (o_q == 0))


class LineSet:
    """A stream's lines as arrays: end points ``a``, ``b`` (k, 2), the sign of the "in" side (+1 left),
    ``margin`` (k,), per line its anchor and classes (None: every class)."""

    def __init__(self, lines: Sequence[LineConfig]) -> None:
        self.names = [ln.name for ln in lines]
        pts = np.asarray([ln.points for ln in lines], np.float64).reshape(len(self.names), 2, 2)
        self.a, self.b = pts[:, 0], pts[:, 1]
        self.length = np.hypot(*(self.b - self.a).T)
        self.in_sign = np.asarray([1 if ln.in_side == "left" else -1 for ln in lines], np.int8)
        self.margin = np.asarray([ln.margin_px for ln in lines], np.float64)
        self.anchors = [ln.anchor for ln in lines]
        self.classes = [None if ln.classes is None else np.asarray(ln.classes, np.int64) for ln in lines]

    def __len__(self) -> int:
        return len(self.names)

    def outside(self, width: int, height: int) -> list[str]:
        """Names of lines with an end point outside a ``width`` x ``height`` frame."""
        size = np.array([width, height], np.float64)
        far = np.logical_or((self.a > size).any(axis=1), (self.b > size).any(axis=1))
        return [self.names[k] for k in np.flatnonzero(far)]

    def points(self, xyxy: np.ndarray) -> np.ndarray:
        """(n, 4) boxes -> (n, k, 2): each box's anchor point for each line."""
        out = np.empty((len(xyxy), len(self.names), 2), np.float64)
        for anchor in set(self.anchors):
            cols = [k for k, a in enumerate(self.anchors) if a == anchor]
            out[:, cols] = anchor_points(xyxy, anchor)[:, None, :]
        return out

    def left_distance(self, q: np.ndarray) -> np.ndarray:
        """(n, k, 2) points -> (n, k) distance to each line, positive on its left side (module docstring)."""
        a, b = self.a, self.b
        return -_cross(a[:, 0], a[:, 1], b[:, 0], b[:, 1], q[..., 0], q[..., 1]) / self.length

    def wanted(self, class_id: np.ndarray) -> np.ndarray:
        """(n,) classes -> (n, k): line k counts class_id[i]."""
        out = np.ones((len(class_id), len(self.names)), bool)
        for k, classes in enumerate(self.classes):
            if classes is not None:
                out[:, k] = np.isin(class_id, classes)
        return out


class LineCrossings:
    """Per track, per line: the anchor's last position, the side it settled on (+1 left, -1 right, 0 not yet)
    and whether it crossed the segment since; ``counts`` per (line, class label, direction), added into the
    dict given (one the caller keeps across a stream's incarnations, so its counters never go back)."""

    def __init__(
        self, lines: LineSet, names: Sequence[str] = (), counts: dict[tuple[str, str, str], int] | None = None
    ) -> None:
        self.lines = lines
        self.names = tuple(names)
        self.prev: dict[int, np.ndarray] = {}  # (k, 2)
        self.side: dict[int, np.ndarray] = {}  # (k,) int8
        self.crossed: dict[int, np.ndarray] = {}  # (k,) bool
        self.counts: dict[tuple[str, str, str], int] = {} if counts is None else counts

    def update(self, track_id: np.ndarray, class_id: np.ndarray, xyxy: np.ndarray) -> list[LineEvent]:
        """Tracked detections of one frame (rows with track_id >= 0 are read) -> the crossings they settle."""
        rows = np.flatnonzero(track_id >= 0)
        if len(rows) == 0:
            return []
        lines, k = self.lines, len(self.lines)
        ids = track_id[rows].tolist()
        classes = class_id[rows]
        q = lines.points(xyxy[rows].astype(np.float64))
        p = np.array([self.prev.get(tid, q[i]) for i, tid in enumerate(ids)]).reshape(q.shape)
        side = np.array([self.side.get(tid, np.zeros(k, np.int8)) for tid in ids]).reshape(q.shape[:2])
        crossed = np.array([self.crossed.get(tid, np.zeros(k, bool)) for tid in ids]).reshape(side.shape)
        crossed |= segments_intersect(p, q, lines.a, lines.b)
        d = lines.left_distance(q)
        settled = np.abs(d) >= lines.margin
        now = np.where(settled, np.sign(d), side).astype(np.int8)
        count = settled & crossed & (side != 0) & (now != side) & lines.wanted(classes)
        crossed &= ~settled  # a settled track starts afresh from its side
        events = []
        for i, j in zip(*np.nonzero(count), strict=True):  # only the crossings
            direction = "in" if now[i, j] == lines.in_sign[j] else "out"
            events.append(LineEvent(lines.names[j], direction, ids[i], int(classes[i])))
        for i, tid in enumerate(ids):
            self.prev[tid], self.side[tid], self.crossed[tid] = q[i], now[i], crossed[i]
        for e in events:
            label = self.names[e.class_id] if 0 <= e.class_id < len(self.names) else str(e.class_id)
            key = (e.line, label, e.direction)
            self.counts[key] = self.counts.get(key, 0) + 1
        return events

    def end(self, track_ids: list[int]) -> None:
        """Tracks that ended: forget them (a crossing they had not settled does not count)."""
        for tid in track_ids:
            self.prev.pop(tid, None)
            self.side.pop(tid, None)
            self.crossed.pop(tid, None)

    def end_all(self) -> None:
        self.end(list(self.prev))
