"""Backoff (exponential, jitter, cap, attempts) and the stall watch."""

from __future__ import annotations

import random

import pytest

from streamd.ingest.sources.backoff import Backoff, StallWatch


def test_doubles_up_to_the_cap_without_jitter() -> None:
    b = Backoff(0.5, 4.0, jitter=0.0)
    assert [b.failure() for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def test_jitter_stays_within_its_band_and_under_the_cap() -> None:
    b = Backoff(0.5, 30.0, jitter=0.2, rng=random.Random(7))
    for n in range(200):
        delay = b.failure()
        base = min(30.0, 0.5 * 2**n)
        assert delay is not None and 0.8 * base <= delay <= base <= 30.0
    delays = [Backoff(1, 1, rng=random.Random(s)).failure() for s in range(20)]
    assert len(set(delays)) > 10  # streams that failed together do not retry in lockstep


def test_success_resets_and_attempts_count_reopens_after_the_failure() -> None:
    """reconnect_attempts N: the failure that ends a session is followed by N reopen attempts."""
    b = Backoff(1.0, 8.0, attempts=3, jitter=0.0)
    assert [b.failure(), b.failure()] == [1.0, 2.0]  # the failure, then reopen 1 failed
    b.success()
    assert b.failures == 0 and b.failure() == 1.0  # a new failure: up to 3 reopens again
    assert [b.failure(), b.failure()] == [2.0, 4.0] and b.reopens == 2 and not b.exhausted
    assert b.failure() is None and b.exhausted and b.reopens == 3  # reopen 3 failed: give up
    one = Backoff(1.0, 8.0, attempts=1, jitter=0.0)
    assert one.failure() == 1.0 and one.failure() is None  # exactly one reopen attempt
    forever = Backoff(1.0, 2.0, attempts=0)
    assert all(forever.failure() is not None for _ in range(1000)) and not forever.exhausted


@pytest.mark.parametrize(
    ("args", "kw"), [((0, 1), {}), ((2, 1), {}), ((1, 2), {"jitter": 1.0}), ((1, 2), {"attempts": -1})]
)
def test_rejects_bad_settings(args, kw) -> None:
    with pytest.raises(ValueError):
        Backoff(*args, **kw)


def test_stall_watch() -> None:
    now = [100.0]
    w = StallWatch(2.0, clock=lambda: now[0])
    assert w.stalled() is None
    now[0] = 101.5
    w.packet()
    now[0] = 102.5
    assert w.stalled() == "no decoded frame for 2.5 s (stall_timeout_s 2 s)"  # packets flow, nothing decodes
    w.frame()
    assert w.stalled() is None
    now[0] = 104.0
    assert w.stalled() == "no packet for 2.5 s (stall_timeout_s 2 s)"
