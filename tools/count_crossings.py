#!/usr/bin/env python3
"""Count line crossings from streamd's JSON lines, independently of streamd (a cross-check for its counts).

Reads the frame lines (not the event lines, not the ``predicted`` lines of skipped frames: streamd counts on
detected frames only), follows each ``track_id``'s anchor point (the bottom center of its box, unless
``--anchor`` says otherwise) from one line to the next, and applies the rule documented for
``streams[].lines`` in docs/config.md, written here from that text with its own geometry (parametric
intersection, a unit normal), plain Python only:

- the move from the previous anchor to this one *crosses* the segment when the two segments share a point;
- a track *settles* on a side when its anchor is at least ``margin`` pixels from the line; closer, it keeps
  the side it had;
- a crossing counts when the track settles on the side opposite the one it had settled on, having crossed
  the segment since; settling on the same side forgets the crossing.

"left" is the side on your left standing on the first point facing the second, with y growing downwards.

    python tools/count_crossings.py out.jsonl --line street:480,120,540,560 [--in-side left] [--margin 8]

prints JSON: ``{"counts": {line: {"in": n, "out": n}}, "events": [[line, direction, track_id, frame], ...]}``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable


def anchor_of(box: list[float], anchor: str) -> tuple[float, float]:
    x1, y1, x2, y2 = box
    return {
        "bottom_center": ((x1 + x2) / 2, y2),
        "center": ((x1 + x2) / 2, (y1 + y2) / 2),
        "top_center": ((x1 + x2) / 2, y1),
        "bottom_left": (x1, y2),
        "bottom_right": (x2, y2),
    }[anchor]


def moves_through(p, q, a, b) -> bool:
    """Do segments p-q and a-b share a point? Solve p + s (q - p) = a + u (b - a) for s, u in [0, 1]."""
    rx, ry = q[0] - p[0], q[1] - p[1]
    sx, sy = b[0] - a[0], b[1] - a[1]
    denom = rx * sy - ry * sx
    if denom == 0:  # parallel (or no move): running along the line is not crossing it
        return False
    wx, wy = a[0] - p[0], a[1] - p[1]
    s = (wx * sy - wy * sx) / denom
    u = (wx * ry - wy * rx) / denom
    return 0 <= s <= 1 and 0 <= u <= 1


def left_distance(pt, a, b) -> float:
    """Signed distance of ``pt`` to the line a->b, positive on its left (screen coordinates, y down)."""
    dx, dy = b[0] - a[0], b[1] - a[1]
    nx, ny = dy, -dx  # the left-hand normal when y grows downwards
    return ((pt[0] - a[0]) * nx + (pt[1] - a[1]) * ny) / math.hypot(nx, ny)


def count(records: Iterable[dict], lines: dict, margin: float, anchor: str, in_side: str) -> dict:
    in_sign = 1 if in_side == "left" else -1
    state: dict[tuple[int, str], dict] = {}  # (track, line) -> previous point, settled side, crossed
    counts = {name: {"in": 0, "out": 0} for name in lines}
    events = []
    for r in records:
        if r.get("type") == "event" or r.get("predicted"):
            continue
        for det in r["detections"]:
            tid = det.get("track_id")
            if tid is None:
                continue
            q = anchor_of(det["box"], anchor)
            for name, (a, b) in lines.items():
                st = state.get((tid, name))
                if st is None:
                    st = state[(tid, name)] = {"p": q, "side": 0, "crossed": False}
                if moves_through(st["p"], q, a, b):
                    st["crossed"] = True
                dist = left_distance(q, a, b)
                if abs(dist) >= margin:
                    side = 1 if dist > 0 else -1
                    if st["side"] != 0 and side != st["side"] and st["crossed"]:
                        direction = "in" if side == in_sign else "out"
                        counts[name][direction] += 1
                        events.append([name, direction, tid, r["frame"]])
                    st["side"], st["crossed"] = side, False
                st["p"] = q
    return {"counts": counts, "events": events}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("jsonl", help="streamd's output (JSON lines)")
    ap.add_argument("--line", action="append", required=True, help="NAME:x1,y1,x2,y2 (repeatable)")
    ap.add_argument("--in-side", choices=("left", "right"), default="left")
    ap.add_argument("--margin", type=float, default=8.0, help="pixels past the line that settle a side")
    ap.add_argument("--anchor", default="bottom_center")
    ap.add_argument("--stream", help="only this stream's lines")
    args = ap.parse_args(argv)
    lines = {}
    for spec in args.line:
        name, _, coords = spec.partition(":")
        x1, y1, x2, y2 = (float(v) for v in coords.split(","))
        lines[name] = ((x1, y1), (x2, y2))
    with open(args.jsonl) as f:
        records = [json.loads(text) for text in f if text.strip()]
    if args.stream:
        records = [r for r in records if r.get("stream") == args.stream]
    json.dump(count(records, lines, args.margin, args.anchor, args.in_side), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
