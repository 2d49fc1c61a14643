"""Plane geometry the config checks and the analytics share (numpy only): is a zone polygon usable."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _segments_cross(p1: np.ndarray, p2: np.ndarray, q1: np.ndarray, q2: np.ndarray) -> bool:
    """True when segments p1-p2 and q1-q2 intersect (touching or collinear overlap included)."""

    def orient(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> float:
        return float((b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0]))

    def on_segment(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> bool:
        return min(a[0], b[0]) <= c[0] <= max(a[0], b[0]) and min(a[1], b[1]) <= c[1] <= max(a[1], b[1])

    d1, d2 = orient(q1, q2, p1), orient(q1, q2, p2)
    d3, d4 = orient(p1, p2, q1), orient(p1, p2, q2)
    if ((d1 > 0) != (d2 > 0)) and d1 != 0 and d2 != 0 and ((d3 > 0) != (d4 > 0)) and d3 != 0 and d4 != 0:
        return True
    return (
        (d1 == 0 and on_segment(q1, q2, p1))
        or (d2 == 0 and on_segment(q1, q2, p2))
        or (d3 == 0 and on_segment(p1, p2, q1))
        or (d4 == 0 and on_segment(p1, p2, q2))
    )


def polygon_problem(points: Sequence[Sequence[float]]) -> str | None:
    """Why ``points`` is not a usable zone polygon (None when it is): fewer than 3 points, repeated points,
    zero area, or two edges that cross (a self-intersecting "bow tie")."""
    if len(points) < 3:
        return f"a polygon needs at least 3 points [x, y], got {len(points)}"
    poly = np.asarray(points, np.float64)
    for i in range(len(poly)):
        if np.array_equal(poly[i], poly[(i + 1) % len(poly)]):
            return f"points {i} and {(i + 1) % len(poly)} are the same point {poly[i].tolist()}; delete one"
    m = len(poly)
    for i in range(m):
        for j in range(i + 1, m):
            if j == i + 1 or (i == 0 and j == m - 1):
                continue  # neighbouring edges share a point
            if _segments_cross(poly[i], poly[(i + 1) % m], poly[j], poly[(j + 1) % m]):
                return (
                    f"edges {i}-{(i + 1) % m} and {j}-{(j + 1) % m} cross (the polygon intersects itself); "
                    "list the points in order around the area"
                )
    x, y = poly[:, 0], poly[:, 1]
    area = 0.5 * abs(float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))))
    if area == 0:
        return "the points lie on one line (the polygon has no area)"
    return None
