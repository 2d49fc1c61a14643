"""Zones: polygons in source pixels, and which detections lie in them (vectorised over boxes and edges).

A detection is *in* a zone when its anchor point lies inside the polygon (even-odd rule). Anchors:
``bottom_center`` (default: where a person stands), ``center``, ``top_center``, ``bottom_left``,
``bottom_right``.

The frame's border: boxes are clipped to the frame, so the anchor of an object cut off by the frame lies
exactly on the border, and the even-odd rule puts a point on a polygon's right or bottom edge outside. A zone
drawn to the border (``[384, 576]`` on a 768x576 frame) would then lose such a box whenever the detector's box
reaches past the frame and keep it when it stops a fraction of a pixel short: membership flapped from frame to
frame. So, once the frame size is known, polygon points on the border (x <= 0 or x >= width - 1, likewise y:
the last pixel's row or column counts as the border) are moved ``EDGE_PX`` beyond it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

ANCHORS = ("bottom_center", "center", "top_center", "bottom_left", "bottom_right")
EDGE_PX = 1.0  # how far beyond the frame's border a polygon point on the border is moved
# Stream seconds a track must be seen outside a zone before it leaves (zones[].leave_after_s): a box's
# anchor jitters by a few pixels from frame to frame, so a track on a zone's edge would enter and leave again
# and again.
DEFAULT_LEAVE_AFTER_S = 0.5


def anchor_points(xyxy: np.ndarray, anchor: str) -> np.ndarray:
    """(n, 4) boxes -> (n, 2) anchor points."""
    x1, y1, x2, y2 = xyxy[:, 0], xyxy[:, 1], xyxy[:, 2], xyxy[:, 3]
    cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
    x, y = {
        "bottom_center": (cx, y2),
        "center": (cx, cy),
        "top_center": (cx, y1),
        "bottom_left": (x1, y2),
        "bottom_right": (x2, y2),
    }[anchor]
    return np.stack([x, y], axis=1).astype(np.float64)


def reach_border(polygon: np.ndarray, width: int, height: int) -> np.ndarray:
    """``polygon`` with its points on the frame's border moved ``EDGE_PX`` beyond it (module docstring)."""
    out = polygon.copy()
    for axis, size in ((0, width), (1, height)):
        coord = out[:, axis]
        coord[coord <= 0] = -EDGE_PX
        coord[coord >= size - 1] = size + EDGE_PX
    return out


def polygon_edges(polygon: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per edge (each (1, m)): start x, start y, end y, and dx/dy (0 for horizontal edges)."""
    ax, ay = polygon[:, 0][None], polygon[:, 1][None]
    bx, by = np.roll(polygon[:, 0], -1)[None], np.roll(polygon[:, 1], -1)[None]
    slope = np.where(by == ay, 0.0, (bx - ax) / np.where(by == ay, 1.0, by - ay))
    return ax, ay, by, slope


def points_in_polygon(points: np.ndarray, polygon: np.ndarray | tuple[np.ndarray, ...]) -> np.ndarray:
    """(n, 2) points, (m, 2) polygon vertices (or their ``polygon_edges``) -> (n,) bool, by the even-odd
    (crossing number) rule."""
    if len(points) == 0:
        return np.zeros(0, bool)
    ax, ay, by, slope = polygon_edges(polygon) if isinstance(polygon, np.ndarray) else polygon
    px, py = points[:, 0:1], points[:, 1:2]  # (n, 1)
    straddles = (ay > py) != (by > py)  # edge crosses the horizontal line through the point
    crossings = straddles & (px < ax + (py - ay) * slope)
    return (np.count_nonzero(crossings, axis=1) % 2) == 1


class ZoneSet:
    """A stream's zones: ``membership(xyxy, class_id, size) -> (n, z)`` bool (detection i in zone k)."""

    def __init__(self, zones: Sequence[object]) -> None:
        self.names = [z.name for z in zones]  # type: ignore[attr-defined]
        self.polygons = [np.asarray(z.polygon, np.float64) for z in zones]  # type: ignore[attr-defined]
        self.edges = [polygon_edges(p) for p in self.polygons]
        self.anchors = [z.anchor for z in zones]  # type: ignore[attr-defined]
        self.classes = [
            None if z.classes is None else np.asarray(z.classes, np.int64)  # type: ignore[attr-defined]
            for z in zones
        ]
        self.leave_after_s = [float(getattr(z, "leave_after_s", DEFAULT_LEAVE_AFTER_S)) for z in zones]
        self.dwell_s: list[float | None] = [getattr(z, "dwell_s", None) for z in zones]
        self._size: tuple[int, int] | None = None  # the frame size self.edges were fitted to (None: as drawn)

    def _fit(self, size: tuple[int, int]) -> None:
        if size != self._size and min(size) > 0:
            self._size = size
            self.edges = [polygon_edges(reach_border(p, *size)) for p in self.polygons]

    def __len__(self) -> int:
        return len(self.names)

    def outside(self, width: int, height: int) -> list[str]:
        """Names of zones with a point outside a ``width`` x ``height`` frame."""
        return [
            name
            for name, p in zip(self.names, self.polygons, strict=True)
            if (p[:, 0] > width).any() or (p[:, 1] > height).any()
        ]

    def membership(
        self, xyxy: np.ndarray, class_id: np.ndarray, size: tuple[int, int] | None = None
    ) -> np.ndarray:
        """Which zones each box is in; ``size`` (width, height) of the frame the boxes are clipped to."""
        out = np.zeros((len(xyxy), len(self.names)), bool)
        if size is not None:
            self._fit(size)
        if len(xyxy) == 0:
            return out
        points: dict[str, np.ndarray] = {}
        for k, (poly, anchor, classes) in enumerate(zip(self.edges, self.anchors, self.classes, strict=True)):
            if anchor not in points:
                points[anchor] = anchor_points(xyxy, anchor)
            inside = points_in_polygon(points[anchor], poly)
            if classes is not None:
                inside &= np.isin(class_id, classes)
            out[:, k] = inside
        return out
