"""Where each stream continues on another node: its position (``protocol.Resume``) kept in etcd.

The owner saves each stream's position a few times a second at most (``cluster.resume_every_s``) and once
more, marked final, when it gives the stream up cleanly. The next owner continues from it:

- final (a clean hand-over): the next frame index and the pts timeline exactly where the old owner stopped;
- not final (the owner died or was cut off): the old owner may have written up to ``elapsed`` seconds of
  frames after the saved position, so the successor skips past them — pts by the elapsed time plus a slack,
  the index by the frames that time holds at the stream's measured rate. An index or a pts is never written
  twice for a stream, and the jump says how long the stream was not watched.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from streamd.protocol import Resume

SLACK_S = 1.0  # a paced source may run up to its pacer's catch-up (1 s) ahead of real time
DEFAULT_RATE = 30.0  # frames per second assumed for a stream whose rate was never measured


@dataclass(frozen=True)
class Position:
    """A stream's saved position: ``resume`` plus how it was saved."""

    resume: Resume
    rate: float  # frames put out per second of real time, as measured by the owner (0: unknown)
    node: str
    final: bool

    def to_json(self) -> str:
        r = self.resume
        return json.dumps(
            {
                "index": r.index,
                "pts": r.pts,
                "wall_time": round(r.wall_time, 3),
                "rate": round(self.rate, 3),
                "node": self.node,
                "final": self.final,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Position | None:
        try:
            d = json.loads(text)
            pts = d.get("pts")
            resume = Resume(int(d["index"]), None if pts is None else float(pts), float(d["wall_time"]))
            return cls(resume, float(d.get("rate", 0.0)), str(d.get("node", "")), bool(d.get("final")))
        except (ValueError, KeyError, TypeError, AttributeError):
            return None  # written by something else: start the stream afresh rather than crash


def continue_from(position: Position, now: float) -> Resume:
    """Where the next owner starts (``now``: Unix time)."""
    r = position.resume
    if position.final:
        return r
    elapsed = max(0.0, now - r.wall_time) + SLACK_S
    rate = position.rate if position.rate > 0 else DEFAULT_RATE
    pts = None if r.pts is None else r.pts + elapsed
    return Resume(r.index + math.ceil(elapsed * rate), pts, now)


class RateMeter:
    """Frames per second of each stream, from the positions seen at each save (smoothed)."""

    def __init__(self) -> None:
        self._last: dict[str, Resume] = {}
        self.rate: dict[str, float] = {}

    def update(self, stream_id: str, r: Resume) -> float:
        prev = self._last.get(stream_id)
        self._last[stream_id] = r
        if prev is not None and r.wall_time - prev.wall_time >= 0.2 and r.index >= prev.index:
            now = (r.index - prev.index) / (r.wall_time - prev.wall_time)
            old = self.rate.get(stream_id)
            self.rate[stream_id] = now if old is None else 0.7 * old + 0.3 * now
        return self.rate.get(stream_id, 0.0)

    def forget(self, stream_id: str) -> None:
        self._last.pop(stream_id, None)
