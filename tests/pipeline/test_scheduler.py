"""Scheduler: stages overlap across slots, results leave in order, a failing stage ends the run."""

from __future__ import annotations

import random
import threading
import time

import numpy as np

from streamd.pipeline.batcher import Batcher
from streamd.pipeline.scheduler import Scheduler
from streamd.pipeline.stages import Slot
from streamd.types import Detections, Frame, FrameResult, Transform, detections_to_source


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


def _random_detections(rng: np.random.Generator, n: int) -> Detections:
    xyxy = rng.uniform(-50, 700, (n, 4)).astype(np.float32)  # some outside the frame: clipped
    return Detections(xyxy, rng.random(n, dtype=np.float32), rng.integers(0, 80, n).astype(np.int32))


def test_batch_to_source_equals_frame_by_frame() -> None:
    """The collect thread maps a whole batch back to source pixels at once; each frame's boxes must be
    exactly (float32 bit for bit) what that frame's own ``Transform.to_source`` gives, empty frames too."""
    rng = np.random.default_rng(7)
    for _ in range(50):
        b = int(rng.integers(1, 33))
        dets = [_random_detections(rng, int(rng.choice([0, 0, 1, 5, 40]))) for _ in range(b)]
        transforms = [
            Transform(float(rng.uniform(0.1, 2)), float(rng.uniform(0.1, 2)), float(rng.uniform(0, 60)), 0.0)
            for _ in range(b)
        ]
        sizes = [(int(rng.integers(64, 2000)), int(rng.integers(64, 2000))) for _ in range(b)]
        got = detections_to_source(dets, transforms, sizes)
        assert len(got) == b
        for g, d, t, (w, h) in zip(got, dets, transforms, sizes, strict=True):
            want = t.to_source(d.xyxy, w, h)
            assert g.xyxy.dtype == np.float32 and g.xyxy.shape == want.shape
            np.testing.assert_array_equal(g.xyxy, want)
            np.testing.assert_array_equal(g.score, d.score)
            np.testing.assert_array_equal(g.class_id, d.class_id)


class BoxStages(SleepyStages):
    """Stages whose frames have detections and different letterbox transforms."""

    def preprocess(self, slot: Slot) -> None:
        slot.transforms = [Transform(0.5 + f.index % 3, 1.5, f.index % 7, 2.0) for f in slot.frames]

    def collect(self, slot: Slot) -> list[Detections]:
        return [_random_detections(np.random.default_rng(f.index), f.index % 4) for f in slot.frames]


def test_scheduler_results_are_in_source_pixels() -> None:
    batcher = Batcher(batch_size=4, timeout_s=0.001)
    feed(batcher, 40)
    results: list[FrameResult] = []
    sched = Scheduler(batcher, BoxStages(), results.extend, ring_slots=2)  # type: ignore[arg-type]
    sched.start()
    assert sched.join(timeout=30) and sched.error is None
    assert [r.frame.index for r in results] == list(range(40))
    for r in results:
        i = r.frame.index
        det = _random_detections(np.random.default_rng(i), i % 4)
        want = Transform(0.5 + i % 3, 1.5, i % 7, 2.0).to_source(det.xyxy, 2, 2)
        np.testing.assert_array_equal(r.detections.xyxy, want)
        assert set(r.latency_ms) >= {"decode", "queue", "batch", "total", "arrival"}
    assert all(v >= 0 for v in sched.cpu_s.values())
