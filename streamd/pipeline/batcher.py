"""Per-stream bounded frame queues and the cross-stream batcher (like DeepStream's nvstreammux).

Decode threads ``put`` frames; the scheduler thread calls ``Batcher.next_batch``. A batch is pushed when it
holds ``batch_size`` frames, when every active live stream (one that delivered a frame within the last
second) already has a frame in it — waiting longer could only add frames from streams that have none to
give — or
``timeout`` seconds after its first frame arrived. Streams are served round
robin, one frame per stream per turn, so a fast stream cannot starve a slow one.

Queue policies: ``latest`` (live sources) keeps the newest frames and drops the oldest — counted — when the
pipeline is behind, so latency stays bounded; ``block`` (files read as fast as possible) makes the decoder
wait, so every frame is processed.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Sequence

from streamd.types import Frame


class StreamQueue:
    """Bounded queue of decoded frames of one stream. All queues of a batcher share its condition."""

    def __init__(self, stream_id: str, capacity: int, policy: str, cond: threading.Condition) -> None:
        if policy not in ("latest", "block"):
            raise ValueError(f"queue policy: expected 'latest' or 'block', got {policy!r}")
        self.stream_id = stream_id
        self.capacity = capacity
        self.policy = policy
        self.dropped = 0
        self.closed = False
        self._frames: collections.deque[Frame] = collections.deque()
        self._cond = cond

    def put(self, frame: Frame, stop: threading.Event) -> bool:
        """Queue a frame; returns False if ``stop`` was set while waiting for room (``block`` policy)."""
        with self._cond:
            if self.policy == "block":
                while len(self._frames) >= self.capacity and not stop.is_set():
                    self._cond.wait(0.1)
                if stop.is_set():
                    return False
            elif len(self._frames) >= self.capacity:
                self._frames.popleft()
                self.dropped += 1
            self._frames.append(frame)
            self._cond.notify_all()
            return True

    def close(self) -> None:
        """The stream has ended: no more frames will come."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def __len__(self) -> int:
        return len(self._frames)


class Batcher:
    ACTIVE_S = 1.0  # a stream that delivered a frame this recently is expected to deliver the next one

    def __init__(self, batch_size: int, timeout_s: float) -> None:
        self.batch_size = batch_size
        self.timeout_s = timeout_s
        self.cond = threading.Condition()
        self._queues: list[StreamQueue] = []
        self._turn = 0
        self._last_frame: dict[int, float] = {}  # id(queue) -> monotonic time a frame was last taken from it
        self.early = 0  # batches pushed before the timeout because every active stream was in them

    def add_stream(self, stream_id: str, capacity: int, policy: str) -> StreamQueue:
        with self.cond:
            q = StreamQueue(stream_id, capacity, policy, self.cond)
            self._queues.append(q)
            return q

    @property
    def queues(self) -> Sequence[StreamQueue]:
        return tuple(self._queues)

    def _take(self, batch: list[Frame], contributors: set[int], now: float) -> None:
        """Round-robin pop into ``batch`` until full or all queues are empty; ``contributors`` collects the
        queues that gave a frame. Caller holds the lock."""
        n = len(self._queues)
        progressed = True
        while len(batch) < self.batch_size and progressed:
            progressed = False
            for k in range(n):
                q = self._queues[(self._turn + k) % n]
                if q._frames and len(batch) < self.batch_size:
                    batch.append(q._frames.popleft())
                    contributors.add(id(q))
                    self._last_frame[id(q)] = now
                    progressed = True
            self._turn = (self._turn + 1) % max(n, 1)
        if batch:
            self.cond.notify_all()  # room for blocked producers

    def _everyone_in(self, contributors: set[int], now: float) -> bool:
        """Every stream that is currently delivering frames already has one in the batch. Files read as fast
        as possible (``block``) always have more to give, so while one is open batches fill up instead."""
        for q in self._queues:
            if q.closed:
                continue
            if q.policy == "block":
                return False
            if id(q) in contributors:
                continue
            if now - self._last_frame.get(id(q), -1e9) < self.ACTIVE_S:
                return False
        return True

    def finished(self) -> bool:
        with self.cond:
            return all(q.closed and not q._frames for q in self._queues)

    def next_batch(self, stop: threading.Event) -> list[Frame] | None:
        """Block for the next batch; None when every stream has ended and drained, or ``stop`` is set."""
        batch: list[Frame] = []
        contributors: set[int] = set()
        deadline: float | None = None
        with self.cond:
            while True:
                now = time.monotonic()
                self._take(batch, contributors, now)
                if len(batch) >= self.batch_size:
                    return batch
                if stop.is_set():
                    return batch or None
                if all(q.closed and not q._frames for q in self._queues):
                    return batch or None
                if batch and self._everyone_in(contributors, now):
                    self.early += 1
                    return batch
                if batch:
                    deadline = deadline or now + self.timeout_s
                    if now >= deadline:
                        return batch
                    self.cond.wait(deadline - now)
                else:
                    self.cond.wait(0.25)
