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

Cost per frame does not grow with the number of streams (one worker carries ~100 cameras; its Python is
the limit): queues that hold frames wait in a FIFO (``_ready``: round robin is pop, take one, push back),
totals are counters, and a ``put`` wakes the batching thread only when that can end its wait — the batch's
first frame (its timeout starts), enough frames to fill it, a frame that fills a ``block`` queue (its
producer then waits for room), or a frame of one of the last streams it waits for. Waking it at every ``put``
and scanning every queue at every wake cost O(streams) per frame. A stream that goes quiet while a batch
waits does not wake it: that batch goes at its timeout.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Iterator, Sequence

from streamd.types import Frame


class StreamQueue:
    """Bounded queue of decoded frames of one stream, owned by a :class:`Batcher` (its lock guards it).

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
        owner: Batcher,
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
        self._owner = owner
        self._ready = False  # in the owner's FIFO of queues that hold frames
        self._cond = owner.cond

    def put(self, frame: Frame, stop: threading.Event) -> bool:
        """Queue a frame; returns False if ``stop`` was set while waiting for room (``block`` policy)."""
        with self._cond:
            if self.policy == "block":
                while len(self._frames) >= self.capacity and not stop.is_set():
                    self._cond.wait(0.1)
                if stop.is_set():
                    return False
                self._frames.append(frame)
                self._owner._added(self)
            else:
                self._frames.append(frame)
                self._owner._added(self)
                self._trim(time.perf_counter())
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
            self._owner._pending -= 1

    def close(self) -> None:
        """The stream has ended: no more frames will come."""
        with self._cond:
            if not self.closed:
                self.closed = True
                self._owner._closed(self)

    def __len__(self) -> int:
        return len(self._frames)


class Batcher:
    ACTIVE_S = 1.0  # a stream that delivered a frame this recently is expected to deliver the next one

    def __init__(self, batch_size: int, timeout_s: float) -> None:
        self.batch_size = batch_size
        self.timeout_s = timeout_s
        self.cond = threading.Condition()  # the lock of every queue; producers of ``block`` queues wait on it
        self._wake = threading.Condition(self.cond._lock)  # type: ignore[attr-defined]  # the batching thread
        self._queues: list[StreamQueue] = []
        self._ready: collections.deque[StreamQueue] = collections.deque()  # queues holding frames, in turn
        self._pending = 0  # frames in all queues
        self._open = 0  # queues not closed
        self._open_block = 0  # ... of them with the block policy (a batch then fills instead of going early)
        self._last_frame: dict[int, float] = {}  # id(queue) -> monotonic time a frame was last taken from it
        self.early = 0  # batches pushed before the timeout because every active stream was in them
        self._holds = 0  # > 0: a reload is swapping streams; their queues closing is not the end
        # What the waiting batching thread needs (set while it waits, under the lock): any frame (its batch
        # is empty: the first starts the timeout), enough frames to fill it, or a frame of one of the active
        # streams not in it yet (``_missing``; None while a ``block`` queue is open: no early batch then).
        self._waiting = False
        self._empty = False
        self._room = 0
        self._missing: dict[int, StreamQueue] | None = None

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
                self._wake.notify_all()

    def add_stream(self, stream_id: str, capacity: int, policy: str) -> StreamQueue:
        with self.cond:
            q = StreamQueue(stream_id, capacity, policy, self)
            self._queues.append(q)
            self._open += 1
            self._open_block += policy == "block"
            return q

    def discard(self, q: StreamQueue) -> None:
        """Forget a closed, drained queue (a reload replaced or removed its stream). The last queue stays, so
        that a pipeline whose streams all ended still reads as finished."""
        with self.cond:
            if q.closed and not q._frames and q in self._queues and len(self._queues) > 1:
                self._queues.remove(q)
                self._last_frame.pop(id(q), None)
                if q._ready:
                    self._ready.remove(q)
                    q._ready = False

    @property
    def queues(self) -> Sequence[StreamQueue]:
        return tuple(self._queues)

    # -- called by the queues, under the lock --------------------------------------------------------------
    def _added(self, q: StreamQueue) -> None:
        """A frame went into ``q``: the batching thread wakes if that may end its wait."""
        self._pending += 1
        if not q._ready:
            q._ready = True
            self._ready.append(q)
        if self._waiting and (
            self._empty
            or self._pending >= self._room
            or (q.policy == "block" and len(q._frames) >= q.capacity)  # its producer now waits for room
            or (self._missing is not None and id(q) in self._missing and len(self._missing) <= self._room)
        ):
            self._waiting = False
            self._wake.notify()

    def _closed(self, q: StreamQueue) -> None:
        self._open -= 1
        self._open_block -= q.policy == "block"
        if self._missing is not None:  # not waited for any more (else a batch could wait out its timeout)
            self._missing.pop(id(q), None)
        self._wake.notify_all()  # the end of the work, or one stream fewer to wait for
        self.cond.notify_all()

    # -- the batching thread -------------------------------------------------------------------------------
    def _take(self, batch: list[Frame], contributors: set[int], now: float) -> None:
        """Round robin into ``batch`` until it is full or no queue holds a frame: one frame per stream per
        turn; ``contributors`` collects the queues that gave one. Caller holds the lock."""
        ready, room = self._ready, self.batch_size - len(batch)
        taken = 0
        while taken < room and ready:
            q = ready.popleft()
            if not q._frames:  # emptied meanwhile
                q._ready = False
                continue
            batch.append(q._frames.popleft())
            taken += 1
            contributors.add(id(q))
            self._last_frame[id(q)] = now
            if q._frames:
                ready.append(q)
            else:
                q._ready = False
        if taken:
            self._pending -= taken
            if self._open_block:
                self.cond.notify_all()  # room for blocked producers

    def _absent(self, contributors: set[int], now: float) -> dict[int, StreamQueue] | None:
        """The active streams without a frame in the batch; None while a ``block`` queue is open: files read
        as fast as possible always have more to give, so batches fill up instead of going early."""
        if self._open_block:
            return None
        last = self._last_frame
        return {
            id(q): q
            for q in self._queues
            if not q.closed and id(q) not in contributors and now - last.get(id(q), -1e9) < self.ACTIVE_S
        }

    def _everyone_in(self, missing: dict[int, StreamQueue], contributors: set[int], now: float) -> bool:
        """Every stream that is currently delivering frames already has one in the batch. ``missing`` (from
        ``_absent``) loses the streams that gave a frame since, and — only when it has no more streams than
        the batch has room for (else the batch fills or times out first) — those that closed or went quiet."""
        for key in contributors.intersection(missing):
            del missing[key]
        if len(missing) > self.batch_size - len(contributors):
            return False
        for key, q in list(missing.items()):
            if q.closed or now - self._last_frame.get(key, -1e9) >= self.ACTIVE_S:
                del missing[key]
        return not missing

    def finished(self) -> bool:
        with self.cond:
            return self._done()

    def _done(self) -> bool:
        return not self._holds and not self._open and not self._pending

    def next_batch(self, stop: threading.Event) -> list[Frame] | None:
        """Block for the next batch; None when every stream has ended and drained, or ``stop`` is set."""
        batch: list[Frame] = []
        contributors: set[int] = set()
        missing: dict[int, StreamQueue] | None = None
        deadline: float | None = None
        with self.cond:
            try:
                while True:
                    now = time.monotonic()
                    self._take(batch, contributors, now)
                    if len(batch) >= self.batch_size or stop.is_set() or self._done():
                        return batch or None
                    if batch:
                        if deadline is None:
                            deadline = now + self.timeout_s
                            missing = self._absent(contributors, now)
                        if missing is not None and self._everyone_in(missing, contributors, now):
                            self.early += 1
                            return batch
                        if now >= deadline:
                            return batch
                    self._waiting, self._empty = True, not batch
                    self._room, self._missing = self.batch_size - len(batch), missing
                    self._wake.wait(deadline - now if deadline is not None else 0.25)
            finally:
                self._waiting, self._missing = False, None
