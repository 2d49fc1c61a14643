"""Scheduler: stages overlap across slots, results leave in order, a failing stage ends the run."""

from __future__ import annotations

import random
import threading
import time

import numpy as np

from streamd.pipeline.batcher import Batcher
from streamd.pipeline.scheduler import Scheduler
from streamd.pipeline.stages import Slot
from streamd.types import Detections, Frame, FrameResult, Transform


class SleepyStages:
    """Stages that take random time and record how many slots are inside stages at once."""

    engine = None

    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at = fail_at
        self.active = 0
        self.max_active = 0
        self.lock = threading.Lock()
        self.batches = 0

    def new_slot(self, index: int) -> Slot:
        return Slot(index)

    def _work(self, slot: Slot) -> None:
        with self.lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        time.sleep(random.uniform(0.002, 0.01))
        with self.lock:
            self.active -= 1

    def preprocess(self, slot: Slot) -> None:
        slot.transforms = [Transform(1, 1, 0, 0)] * len(slot.frames)
        self._work(slot)

    def infer(self, slot: Slot) -> None:
        self.batches += 1
        if self.fail_at is not None and self.batches == self.fail_at:
            raise RuntimeError("engine exploded")
        self._work(slot)

    def postprocess(self, slot: Slot) -> None:
        self._work(slot)

    def collect(self, slot: Slot) -> list[Detections]:
        return [Detections.empty() for _ in slot.frames]

    def close(self) -> None:
        pass


def feed(batcher: Batcher, n: int) -> None:
    stop = threading.Event()
    q = batcher.add_stream("s", n, "block")
    for i in range(n):
        q.put(Frame("s", i, None, 2, 2, image=np.zeros((2, 2, 3), np.uint8)), stop)
    q.close()


def test_results_in_order_with_stages_overlapping() -> None:
    batcher = Batcher(batch_size=3, timeout_s=0.001)
    feed(batcher, 90)
    stages = SleepyStages()
    results: list[FrameResult] = []
    sched = Scheduler(batcher, stages, results.extend, ring_slots=3)  # type: ignore[arg-type]
    sched.start()
    assert sched.join(timeout=30)
    assert sched.error is None
    assert [r.frame.index for r in results] == list(range(90))
    assert stages.max_active >= 2  # different batches were in different stages at the same time


def test_failing_stage_stops_the_pipeline() -> None:
    batcher = Batcher(batch_size=2, timeout_s=0.001)
    feed(batcher, 60)
    sched = Scheduler(batcher, SleepyStages(fail_at=5), lambda r: None, ring_slots=3)  # type: ignore[arg-type]
    sched.start()
    assert sched.join(timeout=10), "a failed stage must not leave the other stages waiting forever"
    assert isinstance(sched.error, RuntimeError)
