"""Per-stream bounded frame queues and the cross-stream batcher (like DeepStream's nvstreammux).

Decode threads ``put`` frames; the scheduler thread calls ``Batcher.next_batch``. A batch is pushed when it
holds ``batch_size`` frames, when every active live stream (one that delivered a frame within the last
second) already has a frame in it — waiting longer could only add frames from streams that have none to
give — or
``timeout`` seconds after its first frame arrived. Streams are served round
robin, one frame per stream per turn, so a fast stream cannot starve a slow one.

Queue policies: ``latest`` (live sources) drops the oldest frames — counted — only when the pipeline is
really behind (see :class:`StreamQueue`), so latency stays bounded while bursts cost nothing; ``block``
(files read as fast as possible) makes the decoder wait, so every frame is processed.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Iterator, Sequence

from streamd.types import Frame


class StreamQueue:
    """Bounded queue of decoded frames of one stream. All queues of a batcher share its condition.

    ``block``: ``put`` waits while ``capacity`` frames are queued (files read as fast as possible).

    ``latest`` (live streams): ``put`` never waits. A frame is dropped — the oldest first, counted in
    :attr:`dropped` — only when the pipeline is really behind: when more than ``capacity`` frames are queued
    *and* the oldest has waited longer than ``max_lag_s`` since its packet arrived (``Frame.t_arrival``, else
    ``t_decoded``), or when ``hard_limit`` frames are queued. So a burst that the consumer works off within
    ``max_lag_s`` (the first half second of an RTSP session arriving at once, a decoder flush releasing its
    reordered pictures) costs no frame, while a consumer that falls behind for good sees at most about
    ``max_lag_s`` of latency and keeps getting the newest frames.
    """

    MAX_LAG_S = 1.0  # default age bound of the latest policy
    HARD_LIMIT = 64  # default count bound of the latest policy (memory: BGR frames or NVDEC surfaces)

    def __init__(
        self,
        stream_id: str,
        capacity: int,
        policy: str,
        cond: threading.Condition,
        *,
        max_lag_s: float | None = None,
        hard_limit: int | None = None,
    ) -> None:
        if policy not in ("latest", "block"):
            raise ValueError(f"queue policy: expected 'latest' or 'block', got {policy!r}")
        self.stream_id = stream_id
        self.capacity = capacity
        self.policy = policy
        self.max_lag_s = self.MAX_LAG_S if max_lag_s is None else max_lag_s
        self.hard_limit = max(capacity, self.HARD_LIMIT if hard_limit is None else hard_limit)
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
                self._frames.append(frame)
            else:
                self._frames.append(frame)
                self._trim(time.perf_counter())
            self._cond.notify_all()
            return True

    def _trim(self, now: float) -> None:
        """Drop the oldest frames while the pipeline is behind (``latest``). Caller holds the lock."""
        frames = self._frames
        while len(frames) > self.capacity:
            head = frames[0]
            since = head.t_arrival or head.t_decoded
            if len(frames) <= self.hard_limit and since and now - since <= self.max_lag_s:
                return
            frames.popleft()
            self.dropped += 1

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
        self._holds = 0  # > 0: a reload is swapping streams; their queues closing is not the end

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """While held, every queue being closed does not read as "every stream ended": a reload that replaces
        a process's only stream closes the old queue before its successor's is added."""
        with self.cond:
            self._holds += 1
        try:
            yield
        finally:
            with self.cond:
                self._holds -= 1
                self.cond.notify_all()

    def add_stream(self, stream_id: str, capacity: int, policy: str) -> StreamQueue:
        with self.cond:
            q = StreamQueue(stream_id, capacity, policy, self.cond)
            self._queues.append(q)
            return q

    def discard(self, q: StreamQueue) -> None:
        """Forget a closed, drained queue (a reload replaced or removed its stream). The last queue stays, so
        that a pipeline whose streams all ended still reads as finished."""
        with self.cond:
            if q.closed and not q._frames and q in self._queues and len(self._queues) > 1:
                self._queues.remove(q)
                self._last_frame.pop(id(q), None)
                self._turn %= len(self._queues)

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
            return not self._holds and all(q.closed and not q._frames for q in self._queues)

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
                if not self._holds and all(q.closed and not q._frames for q in self._queues):
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
