"""StreamQueue's latest policy: drops only when the pipeline is really behind (age or hard limit)."""

from __future__ import annotations

import threading
import time

import numpy as np

from streamd.pipeline.batcher import Batcher
from streamd.types import Frame


def frame(i: int, arrived: float) -> Frame:
    return Frame(
        "cam", i, i / 25, 4, 4, image=np.zeros((4, 4, 3), np.uint8), t_decoded=arrived, t_arrival=arrived
    )


def test_a_burst_within_the_lag_bound_costs_nothing() -> None:
    """A decoder flush or a session's start puts many frames at once: all kept (capacity 2)."""
    b = Batcher(batch_size=4, timeout_s=0.0)
    stop = threading.Event()
    q = b.add_stream("cam", 2, "latest")
    now = time.perf_counter()
    for i in range(12):
        q.put(frame(i, now), stop)
    assert q.dropped == 0 and len(q) == 12
    q.close()
    got = []
    while (batch := b.next_batch(stop)) is not None:
        got += [f.index for f in batch]
    assert got == list(range(12))


def test_frames_older_than_the_lag_bound_are_dropped_oldest_first() -> None:
    b = Batcher(batch_size=8, timeout_s=0.0)
    stop = threading.Event()
    q = b.add_stream("cam", 2, "latest")
    now = time.perf_counter()
    for i in range(5):
        q.put(frame(i, now - 2.0), stop)  # arrived 2 s ago: the consumer is far behind
    assert q.dropped == 3 and [f.index for f in q._frames] == [3, 4]  # capacity newest kept
    q.put(frame(5, now), stop)
    assert q.dropped == 4 and [f.index for f in q._frames] == [4, 5]


def test_hard_limit_bounds_memory_even_for_fresh_frames() -> None:
    b = Batcher(batch_size=8, timeout_s=0.0)
    q = b.add_stream("cam", 2, "latest")
    q.hard_limit = 6
    now = time.perf_counter()
    for i in range(10):
        q.put(frame(i, now), threading.Event())
    assert len(q) == 6 and q.dropped == 4 and q._frames[0].index == 4


def test_block_policy_is_unchanged() -> None:
    b = Batcher(batch_size=8, timeout_s=0.0)
    stop = threading.Event()
    q = b.add_stream("file", 2, "block")
    q.put(frame(0, 0.0), stop)
    q.put(frame(1, 0.0), stop)
    stop.set()
    assert not q.put(frame(2, 0.0), stop) and q.dropped == 0
