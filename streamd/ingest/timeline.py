"""A stream's timeline: frame indices and pts that only increase, and when each picture's packet arrived.

Pure: pts and arrival times in, pts, arrival times and indices out. It reads no clock except the one it is
given, for a picture whose packet it cannot find, and does no I/O, so it is tested without servers or
decoders (``tests/ingest/test_timeline.py``).

- ``pts`` is the source's own presentation time on the first pass/session (ffprobe's ``pts_time`` for a
  file; FFmpeg's RTSP timeline for a camera). A later pass or session continues the timeline: its first
  picture comes ``max(period, gap)`` after the last one put out, where ``gap`` is the real time between their
  packets' arrivals (live streams only; a file pass continues one period later). So pts keep increasing and
  an outage shows as a jump of its real length.
- A picture without a pts at the start of a live session (FFmpeg's RTSP client gives the first packet none)
  is held: it takes the next picture's pts minus one period, or, when the session ends first, the last
  pts put out plus one period.
- Arrival matching: a decoder gives pictures in display order, packets come in decode order (B-frames), so
  each picture takes the arrival time of the packet with its own pts; a picture without a pts takes the
  oldest packet without one, else the oldest packet.
- Indices count the frames put out (:meth:`Timeline.commit`), across passes, reconnects and, through
  :meth:`Timeline.resume_at`, restarts of the worker process.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

DEFAULT_PERIOD_S = 0.04  # frame period assumed when the container states no frame rate

T = TypeVar("T")


@dataclass(slots=True)
class Stamp(Generic[T]):
    """A picture placed on the timeline: ``item`` as given, its ``pts`` (seconds, None when the source gave
    none and none can be guessed) and the clock time its packet ``arrived``."""

    item: T
    pts: float | None
    arrived: float


class Timeline(Generic[T]):
    """One stream's timeline across passes (files) or sessions (live streams).

    Per pass/session: :meth:`begin`, then :meth:`packet` for every packet read and :meth:`picture` for every
    picture decoded, in order; each stamp it returns that is put out is passed to :meth:`commit` (a stamp the
    stream stops before is not); at the end :meth:`release_held` and :meth:`end`. ``clock`` is the clock of
    the arrival times (``time.perf_counter`` in the stream thread).
    """

    def __init__(self, live: bool, clock: Callable[[], float] = time.perf_counter) -> None:
        self.live = live
        self.index = 0  # the next frame's index
        self.last_pts: float | None = None  # pts of the last frame put out
        self.last_arrival: float | None = None  # clock time the last frame put out arrived (None: none yet)
        self.period = (
            0.0  # seconds per frame: the source's stated rate, else the last known, else the default
        )
        self._clock = clock
        self._time_base = 0.0
        self._offset: float | None = (
            None  # pts on the timeline = source pts + offset; set at the first picture
        )
        self._held: tuple[T, float] | None = None  # a session's first picture without pts, and its arrival
        self._arrivals: collections.deque[tuple[int | None, float]] = collections.deque(maxlen=64)

    def begin(self, fps: float | None, time_base: float) -> None:
        """A pass or session starts: ``fps`` as the source states it (None: unknown), ``time_base`` in seconds
        per pts tick of its packets."""
        if fps:
            self.period = 1.0 / fps
        self.period = self.period or DEFAULT_PERIOD_S
        self._time_base = time_base
        self._offset = None
        self._held = None
        self._arrivals.clear()

    def packet(self, pts: int | None, arrived: float) -> None:
        """A packet was read (``pts`` in ticks of the time base) at clock time ``arrived``."""
        self._arrivals.append((pts, arrived))

    def picture(self, item: T, pts: float | None) -> list[Stamp[T]]:
        """A decoded picture with the source's ``pts`` (seconds): the stamps to put out now, in order (none
        while the picture is held, two when it releases the held one)."""
        arrived = self._arrival(pts)
        if pts is None:
            if self.live and self._offset is None and self._held is None:
                self._held = (item, arrived)  # its pts comes from the next picture
                return []
            guess = None
            if self.last_pts is not None and (self.live or self._offset is not None):
                guess = self.last_pts + self.period
            return [Stamp(item, guess, arrived)]
        out = []
        if self._held is not None:
            held, held_arrived = self._held
            self._held = None
            out.append(Stamp(held, self._place(pts - self.period, held_arrived), held_arrived))
        out.append(Stamp(item, self._place(pts, arrived), arrived))
        return out

    def commit(self, pts: float | None, arrived: float) -> int:
        """A frame with ``pts`` that arrived at ``arrived`` was put out: returns its index."""
        index = self.index
        self.index += 1
        if pts is not None:
            self.last_pts = pts
        self.last_arrival = arrived
        return index

    def release_held(self) -> Stamp[T] | None:
        """At the end of a pass/session whose pictures all went out: the held picture, if any, one period
        after the last frame (no pts when there was none)."""
        if self._held is None:
            return None
        item, arrived = self._held
        self._held = None
        return Stamp(item, None if self.last_pts is None else self.last_pts + self.period, arrived)

    def end(self) -> None:
        """The pass/session is over: a picture still held is dropped."""
        self._held = None

    def resume_at(self, index: int, pts: float | None, outage_s: float) -> None:
        """Continue a stream stopped elsewhere: indices from ``index``, pts after ``pts`` (when known) with an
        outage of ``outage_s`` seconds before now as the jump."""
        self.index = index
        if pts is not None:
            self.last_pts = pts
            self.last_arrival = self._clock() - outage_s

    def _arrival(self, pts: float | None) -> float:
        """When the packet of the picture with ``pts`` (seconds) arrived."""
        arrivals = self._arrivals
        if not arrivals:
            return self._clock()
        if pts is not None and self._time_base:
            key = round(pts / self._time_base)
            for i, (p, t) in enumerate(arrivals):
                if p == key:
                    del arrivals[i]
                    return t
        for i, (p, t) in enumerate(arrivals):  # no pts to match: the oldest packet without one
            if p is None:
                del arrivals[i]
                return t
        return arrivals.popleft()[1]

    def _place(self, pts: float, arrived: float) -> float:
        """The source's ``pts`` (seconds, this pass/session) on the stream's continuous timeline."""
        if self._offset is None:  # the first picture of this pass or session
            if self.last_pts is None:
                self._offset = 0.0  # the source's own timeline
            else:
                gap = 0.0
                if self.live and self.last_arrival is not None:
                    gap = arrived - self.last_arrival
                self._offset = self.last_pts + max(self.period, gap) - pts
        return pts + self._offset
