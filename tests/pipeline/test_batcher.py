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


def _take_one_each(b: Batcher, queues, stop: threading.Event) -> None:
    """Each stream delivers a frame that the batcher takes: every stream is active."""
    for q in queues:
        q.put(frame(q.stream_id, 0), stop)
    assert len(b.next_batch(stop) or []) == len(queues)


def _batch_in_thread(b: Batcher, stop: threading.Event) -> tuple[threading.Thread, list]:
    out: list = []
    t = threading.Thread(target=lambda: out.append((b.next_batch(stop), time.monotonic())))
    t.start()
    return t, out


def test_a_batch_goes_early_when_every_active_stream_is_in() -> None:
    """Three cameras, batch 8, timeout 2 s: once the last of them has a frame in, the batch goes at once (the
    frame that completes it must wake the batching thread)."""
    b = Batcher(batch_size=8, timeout_s=2.0)
    stop = threading.Event()
    qs = [b.add_stream(s, 4, "latest") for s in "abc"]
    _take_one_each(b, qs, stop)
    qs[0].put(frame("a", 1), stop)
    qs[1].put(frame("b", 1), stop)
    t, out = _batch_in_thread(b, stop)
    time.sleep(0.2)
    assert t.is_alive()  # c has not delivered yet: the batch waits
    sent = time.monotonic()
    qs[2].put(frame("c", 1), stop)
    t.join(1.0)
    assert not t.is_alive()
    batch, done = out[0]
    assert sorted(f.stream_id for f in batch) == ["a", "b", "c"] and done - sent < 0.5
    assert b.early == 2  # the warm-up batch went early too


def test_a_quiet_stream_stops_holding_batches_back() -> None:
    """A camera that delivered nothing for ACTIVE_S is not waited for."""
    b = Batcher(batch_size=8, timeout_s=2.0)
    b.ACTIVE_S = 0.3
    stop = threading.Event()
    qs = [b.add_stream(s, 4, "latest") for s in "abc"]
    _take_one_each(b, qs, stop)
    time.sleep(0.4)  # all three quiet now; a and b come back
    for q in qs[:2]:
        q.put(frame(q.stream_id, 1), stop)
    t0 = time.monotonic()
    batch = b.next_batch(stop)
    assert batch is not None and len(batch) == 2 and time.monotonic() - t0 < 0.5


def test_an_open_file_queue_makes_batches_fill_or_time_out() -> None:
    """A file read as fast as possible always has more to give: no early batch while one is open."""
    b = Batcher(batch_size=8, timeout_s=0.3)
    stop = threading.Event()
    live, file = b.add_stream("cam", 4, "latest"), b.add_stream("file", 4, "block")
    _take_one_each(b, [live, file], stop)
    live.put(frame("cam", 1), stop)
    file.put(frame("file", 1), stop)
    t0 = time.monotonic()
    batch = b.next_batch(stop)
    assert batch is not None and len(batch) == 2 and time.monotonic() - t0 >= 0.25


def test_the_batch_fills_from_many_streams_in_turn_and_the_end_is_seen() -> None:
    """112 cameras put one frame each in a round: batches of 16 take them in arrival order of the streams
    (round robin), each stream once per round; closing every queue ends the batches."""
    b = Batcher(batch_size=16, timeout_s=0.05)
    stop = threading.Event()
    qs = [b.add_stream(f"c{i:03d}", 4, "latest") for i in range(112)]
    for r in range(3):
        for q in qs:
            q.put(frame(q.stream_id, r), stop)
    for q in qs:
        q.close()
    got = []
    while (batch := b.next_batch(stop)) is not None:
        assert len(batch) == 16
        got += [(f.stream_id, f.index) for f in batch]
    assert got == [(q.stream_id, r) for r in range(3) for q in qs]
    assert b.finished()


def test_a_file_read_as_fast_as_possible_fills_whole_batches() -> None:
    """One file (capacity 2) and batch 8: its producer waits for room at 2 frames, so the frame that fills its
    queue must wake the batching thread; else every batch waits out its timeout with 2-4 frames."""
    b = Batcher(batch_size=8, timeout_s=0.5)
    stop = threading.Event()
    q = b.add_stream("file", 2, "block")

    def produce() -> None:
        for i in range(64):
            q.put(frame("file", i), stop)
        q.close()

    threading.Thread(target=produce, daemon=True).start()
    t0 = time.monotonic()
    sizes = []
    while (batch := b.next_batch(stop)) is not None:
        sizes.append(len(batch))
    assert sizes == [8] * 8 and time.monotonic() - t0 < 2.0


def test_streams_that_close_while_a_batch_waits_are_not_waited_for() -> None:
    """Five cameras, batch 4: the batch holds a's frame and waits for b-e; c, d, e end; b's frame then
    completes it at once (not at the 2 s timeout)."""
    b = Batcher(batch_size=4, timeout_s=0.05)
    stop = threading.Event()
    qs = {s: b.add_stream(s, 4, "latest") for s in "abcde"}
    for q in qs.values():
        q.put(frame(q.stream_id, 0), stop)
    while sum(len(q) for q in qs.values()):
        b.next_batch(stop)
    b.timeout_s = 2.0
    qs["a"].put(frame("a", 1), stop)
    t, out = _batch_in_thread(b, stop)
    time.sleep(0.2)
    for s in "cde":
        qs[s].close()
    time.sleep(0.1)
    sent = time.monotonic()
    qs["b"].put(frame("b", 1), stop)
    t.join(3)
    batch, done = out[0]
    assert sorted(f.stream_id for f in batch) == ["a", "b"] and done - sent < 0.5
