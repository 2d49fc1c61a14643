"""Scheduler: stages overlap across slots, results leave in order, a failing stage ends the run."""

from __future__ import annotations

import random
import threading
import time

import numpy as np

from streamd.pipeline.batcher import Batcher
from streamd.pipeline.scheduler import Scheduler
from streamd.stages.contract import Slot
from streamd.types import Detections, Frame, FrameResult, Transform, to_source_padded


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


def _padded(rng: np.random.Generator, counts: list[int], max_det: int) -> np.ndarray:
    """NMS output as the GPU downloads it: [B, max_det, 6], rows past a frame's count are garbage."""
    det = rng.uniform(-50, 700, (len(counts), max_det, 6)).astype(np.float32)  # some boxes leave the frame
    det[:, :, 5] = rng.integers(0, 80, (len(counts), max_det))
    return det


def test_padded_to_source_equals_frame_by_frame() -> None:
    """The GPU collect maps a whole batch back to source pixels at once; each frame's boxes must be exactly
    (float32 bit for bit) what that frame's own ``Transform.to_source`` gives, empty frames too."""
    rng = np.random.default_rng(7)
    for _ in range(50):
        b = int(rng.integers(1, 33))
        counts = [int(rng.choice([0, 0, 1, 5, 40, 100])) for _ in range(b)]
        det = _padded(rng, counts, 100)
        det[:, ::7, :4] = -0.0  # a box at the origin of a frame without padding: to_source keeps the sign
        extra = int(rng.integers(0, 3))  # buffers are made for max_batch: rows past the batch are ignored
        det_all = np.concatenate([det, _padded(rng, [0] * extra, 100)])
        counts_all = np.array(counts + [7] * extra, np.int32)
        scales = rng.uniform(0.1, 2, (b, 2))
        transforms = [Transform(float(sx), float(sy), float(rng.choice([0, 37.5])), 0.0) for sx, sy in scales]
        sizes = [(int(rng.integers(64, 2000)), int(rng.integers(64, 2000))) for _ in range(b)]
        got = to_source_padded(det_all, counts_all, transforms, sizes)
        assert len(got) == b
        for k, (g, t, (w, h)) in enumerate(zip(got, transforms, sizes, strict=True)):
            rows = det[k, : counts[k]]
            want = t.to_source(rows[:, :4].copy(), w, h)
            assert g.xyxy.dtype == np.float32 and g.xyxy.shape == want.shape
            np.testing.assert_array_equal(g.xyxy.view(np.uint32), want.view(np.uint32))  # bits: -0.0 too
            np.testing.assert_array_equal(g.score, rows[:, 4])
            np.testing.assert_array_equal(g.class_id, rows[:, 5].astype(np.int32))
            assert not np.shares_memory(g.xyxy, det_all) and not np.shares_memory(g.score, det_all)


class BoxStages(SleepyStages):
    """Stages whose frames have detections (already in source pixels, as ``collect`` gives them)."""

    def collect(self, slot: Slot) -> list[Detections]:
        return [_random_detections(np.random.default_rng(f.index), f.index % 4) for f in slot.frames]


def test_scheduler_passes_each_frame_its_own_detections() -> None:
    batcher = Batcher(batch_size=4, timeout_s=0.001)
    feed(batcher, 40)
    results: list[FrameResult] = []
    sched = Scheduler(batcher, BoxStages(), results.extend, ring_slots=2)  # type: ignore[arg-type]
    sched.start()
    assert sched.join(timeout=30) and sched.error is None
    assert [r.frame.index for r in results] == list(range(40))
    for r in results:
        want = _random_detections(np.random.default_rng(r.frame.index), r.frame.index % 4)
        np.testing.assert_array_equal(r.detections.xyxy, want.xyxy)
        assert set(r.latency_ms) >= {"decode", "queue", "batch", "total", "arrival"}
    assert all(v >= 0 for v in sched.cpu_s.values())
