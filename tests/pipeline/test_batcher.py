"""Batcher: full batches, timeouts for partial ones, round-robin fairness, drop-oldest vs block policies."""

from __future__ import annotations

import threading
import time

import numpy as np

from streamd.pipeline.batcher import Batcher
from streamd.types import Frame


def frame(sid: str, i: int) -> Frame:
    return Frame(sid, i, i / 10, 4, 4, image=np.zeros((4, 4, 3), np.uint8))


def test_round_robin_across_streams() -> None:
    b = Batcher(batch_size=4, timeout_s=0.05)
    stop = threading.Event()
    qa, qb = b.add_stream("a", 8, "block"), b.add_stream("b", 8, "block")
    for i in range(6):
        qa.put(frame("a", i), stop)
    for i in range(2):
        qb.put(frame("b", i), stop)
    batch = b.next_batch(stop)
    assert batch is not None
    assert sorted(f.stream_id for f in batch) == ["a", "a", "b", "b"]  # b not starved by a's backlog
    assert [f.index for f in batch if f.stream_id == "a"] == [0, 1]


def test_partial_batch_pushed_after_timeout() -> None:
    b = Batcher(batch_size=8, timeout_s=0.05)
    stop = threading.Event()
    q = b.add_stream("a", 8, "block")
    q.put(frame("a", 0), stop)
    t = time.monotonic()
    batch = b.next_batch(stop)
    assert batch is not None and len(batch) == 1
    assert 0.04 <= time.monotonic() - t < 1.0


def test_latest_policy_drops_oldest_and_counts() -> None:
    b = Batcher(batch_size=8, timeout_s=0.0)
    stop = threading.Event()
    q = b.add_stream("cam", 3, "latest")
    for i in range(10):
        q.put(frame("cam", i), stop)
    assert q.dropped == 7
    q.close()
    batch = b.next_batch(stop)
    assert batch is not None and [f.index for f in batch] == [7, 8, 9]
    assert b.next_batch(stop) is None  # closed and drained


def test_block_policy_waits_and_honours_stop() -> None:
    b = Batcher(batch_size=2, timeout_s=0.0)
    stop = threading.Event()
    q = b.add_stream("file", 2, "block")
    q.put(frame("file", 0), stop)
    q.put(frame("file", 1), stop)
    done = []
    producer = threading.Thread(target=lambda: done.append(q.put(frame("file", 2), stop)))
    producer.start()
    time.sleep(0.2)
    assert producer.is_alive() and q.dropped == 0  # waiting for room, not dropping
    assert [f.index for f in b.next_batch(stop) or []] == [0, 1]
    producer.join(2)
    assert done == [True]
    blocked = threading.Thread(
        target=lambda: done.append(q.put(frame("file", 3), stop) and q.put(frame("file", 4), stop))
    )
    blocked.start()
    time.sleep(0.2)
    stop.set()
    blocked.join(2)
    assert not blocked.is_alive() and done[-1] is False
