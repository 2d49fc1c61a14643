"""``streams[].detect_fps``: which decoded frames go to the detector.

Stream time (the frame's pts, else its arrival time) is cut into slots of ``1 / detect_fps`` seconds from the
first frame; the first frame of each slot is detected, the others are skipped. Over any stretch the detector
therefore runs at most ``detect_fps`` times per second and, when the stream is faster, on average exactly that
often, also with jittery live timestamps (no drift from comparing each frame with the last detected one).
A 10 fps file with ``detect_fps: 5`` detects frames 0, 2, 4, ...
"""

from __future__ import annotations

import math

_EPS = 1e-6  # slot boundaries: pts such as 0.6 * 5 = 2.9999999999999996 still count as slot 3


class DetectRate:
    def __init__(self, detect_fps: float) -> None:
        if not detect_fps > 0:
            raise ValueError(f"detect_fps must be > 0, got {detect_fps!r}")
        self.fps = float(detect_fps)
        self._t0: float | None = None
        self._last_slot: int | None = None

    def should_detect(self, t: float) -> bool:
        """True when the frame at stream time ``t`` (seconds) is the first of its slot."""
        if self._t0 is None:
            self._t0 = t
        slot = math.floor((t - self._t0) * self.fps + _EPS)
        if self._last_slot is not None and slot < self._last_slot:  # time went back (new timeline): restart
            self._t0, slot = t, 0
        if self._last_slot is None or slot != self._last_slot:
            self._last_slot = slot
            return True
        return False
