"""Reconnect pacing: exponential backoff with jitter and a hard cap, and a stall watch.

Failure ``n`` (from 0) waits ``min(cap, initial * 2**n)`` shrunk by a random factor in ``[1 - jitter, 1]``, so
waits never exceed the cap (a camera that comes back is picked up at most ``cap`` seconds later) and many
streams that failed together do not reconnect in lockstep. A success resets the sequence.
"""

from __future__ import annotations

import random
import time


class Backoff:
    """Delays between reopen attempts.

    ``attempts`` = reopen attempts after a failure before giving up (0 = never give up): the failure that
    ends a session (or a first open that fails) is followed by up to ``attempts`` reopens; when all of them
    fail too, :meth:`failure` returns None. A success (a decoded frame) resets the count.
    """

    def __init__(
        self,
        initial_s: float,
        max_s: float,
        *,
        attempts: int = 0,
        jitter: float = 0.2,
        rng: random.Random | None = None,
    ) -> None:
        if not 0 < initial_s <= max_s:
            raise ValueError(f"backoff: expected 0 < initial_s <= max_s, got {initial_s:g} and {max_s:g}")
        if not 0 <= jitter < 1:
            raise ValueError(f"backoff: jitter must be in [0, 1), got {jitter:g}")
        if attempts < 0:
            raise ValueError(f"backoff: attempts must be >= 0 (0 = forever), got {attempts}")
        self.initial_s = initial_s
        self.max_s = max_s
        self.attempts = attempts
        self.jitter = jitter
        self.failures = 0  # failures in a row since the last success
        self._rng = rng or random.Random()

    @property
    def reopens(self) -> int:
        """Reopen attempts made since the last success (each failure after the first one was a reopen)."""
        return max(0, self.failures - 1)

    @property
    def exhausted(self) -> bool:
        """True once ``attempts`` reopens after a failure failed as well (never when ``attempts`` is 0)."""
        return self.attempts > 0 and self.failures > self.attempts

    def failure(self) -> float | None:
        """Count a failure; return the seconds to wait before the next attempt, or None to give up."""
        self.failures += 1
        if self.exhausted:
            return None
        base = min(self.max_s, self.initial_s * 2.0 ** min(self.failures - 1, 60))
        return base * (1.0 - self.jitter * self._rng.random())

    def success(self) -> None:
        self.failures = 0


class StallWatch:
    """Notices a live stream that stops delivering: no packet, or no decoded frame, for ``timeout_s``.

    ``packet()``/``frame()`` mark progress; ``stalled()`` says whether either has been silent too long.
    Time starts at construction (an open stream that never delivers stalls too).
    """

    def __init__(self, timeout_s: float, clock=time.monotonic) -> None:
        self.timeout_s = timeout_s
        self._clock = clock
        now = clock()
        self.last_packet = now
        self.last_frame = now

    def packet(self) -> None:
        self.last_packet = self._clock()

    def frame(self) -> None:
        self.last_frame = self._clock()

    def stalled(self) -> str | None:
        """None while healthy, else why, naming the timeout and the real silence:
        ``"no packet for X s (stall_timeout_s T s)"`` or ``"no decoded frame for X s (...)"``."""
        now = self._clock()
        limit = f"(stall_timeout_s {self.timeout_s:g} s)"
        if now - self.last_packet > self.timeout_s:
            return f"no packet for {now - self.last_packet:.1f} s {limit}"
        if now - self.last_frame > self.timeout_s:
            return f"no decoded frame for {now - self.last_frame:.1f} s {limit}"
        return None
