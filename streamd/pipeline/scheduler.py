"""Runs batches through the slot ring: S1 -> S2 -> S3 -> host, one thread per stage, K slots in flight.

Slots circulate through bounded queues (free -> s1 -> s2 -> s3 -> collect -> free), so at most K batches
exist at once and a slow stage back-pressures the batcher, never grows memory. Results leave in batch order,
so each stream's frames stay in order.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable

from streamd.pipeline.batcher import Batcher
from streamd.stages.contract import Slot, Stages
from streamd.types import FrameResult

log = logging.getLogger(__name__)

_STOP = object()  # end-of-work marker passed down the stage queues


class Scheduler:
    def __init__(
        self,
        batcher: Batcher,
        stages: Stages,
        on_results: Callable[[list[FrameResult]], None],
        ring_slots: int = 3,
    ) -> None:
        self.batcher = batcher
        self.stages = stages
        self.on_results = on_results  # called once per batch, in batch order
        self.abort = threading.Event()
        self.error: BaseException | None = None
        self.batches = 0
        self.frames = 0
        # Host seconds each stage thread spent working (not waiting): which thread bounds the ring.
        self.busy_s = {"preprocess": 0.0, "infer": 0.0, "postprocess": 0.0, "collect": 0.0}
        # ... and the CPU seconds of it; busy minus CPU is time blocked: waiting for the GIL, for the GPU
        # (a ring entry's event), or for the pack threads (whose memcpy CPU is not counted here)
        self.cpu_s = dict.fromkeys(self.busy_s, 0.0)
        self._free: queue.Queue[Slot] = queue.Queue()
        for i in range(ring_slots):
            self._free.put(stages.new_slot(i))
        self._queues: list[queue.Queue] = [queue.Queue(maxsize=ring_slots) for _ in range(3)]
        steps = [
            ("s1-preprocess", self._feed),
            ("s2-infer", lambda: self._relay(self._queues[0], self._queues[1], stages.infer, "infer")),
            (
                "s3-postprocess",
                lambda: self._relay(self._queues[1], self._queues[2], stages.postprocess, "postprocess"),
            ),
            ("collect", self._collect),
        ]
        self._threads = [
            threading.Thread(target=self._guard, args=(fn,), name=n, daemon=True) for n, fn in steps
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for every stage thread; True if all finished."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self._threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def _guard(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as exc:  # a stage failure stops the pipeline instead of hanging it
            log.exception("pipeline stage %s failed", threading.current_thread().name)
            self.error = self.error or exc
            self.abort.set()
            for q in self._queues:
                _put_nowait_drop(q, _STOP)

    def _get(self, q: queue.Queue):
        while True:
            try:
                return q.get(timeout=0.25)
            except queue.Empty:
                if self.abort.is_set():
                    return _STOP

    def _put(self, q: queue.Queue, item: object) -> None:
        """Blocking put that gives up when the pipeline aborts (its consumer may be gone)."""
        while True:
            try:
                return q.put(item, timeout=0.25)
            except queue.Full:
                if self.abort.is_set():
                    return None

    def _feed(self) -> None:
        while True:
            batch = self.batcher.next_batch(self.abort)
            if batch is None:
                break
            slot = self._get(self._free)
            if slot is _STOP:
                break
            slot.frames, slot.stage_ms = batch, {}
            slot.t_start, cpu = time.perf_counter(), time.thread_time()
            self.stages.preprocess(slot)
            self.busy_s["preprocess"] += time.perf_counter() - slot.t_start
            self.cpu_s["preprocess"] += time.thread_time() - cpu
            self._put(self._queues[0], slot)
        self._put(self._queues[0], _STOP)

    def _relay(self, src: queue.Queue, dst: queue.Queue, step: Callable[[Slot], None], name: str) -> None:
        while (slot := self._get(src)) is not _STOP:
            t, cpu = time.perf_counter(), time.thread_time()
            step(slot)
            self.busy_s[name] += time.perf_counter() - t
            self.cpu_s[name] += time.thread_time() - cpu
            self._put(dst, slot)
        self._put(dst, _STOP)

    def _collect(self) -> None:
        while (slot := self._get(self._queues[2])) is not _STOP:
            t, cpu = time.perf_counter(), time.thread_time()
            source = self.stages.collect(slot)  # in source pixels
            now = time.perf_counter()
            frames = slot.frames
            # Python per batch where it can be (this thread bounds a fast ring): the latencies every frame
            # of the batch shares are rounded once.
            shared = {k: round(v, 3) for k, v in slot.stage_ms.items()}
            batch_ms = round((now - slot.t_start) * 1e3, 3)
            results = [
                FrameResult(
                    frame,
                    det,
                    {
                        **shared,
                        "decode": round(frame.decode_ms, 3),
                        "queue": round((slot.t_start - frame.t_decoded) * 1e3, 3),
                        "batch": batch_ms,
                        "total": round((now - frame.t_decoded) * 1e3 + frame.decode_ms, 3),
                        "arrival": round((now - (frame.t_arrival or frame.t_decoded)) * 1e3, 3),
                    },
                )
                for frame, det in zip(frames, source, strict=True)
            ]
            self.on_results(results)
            # host work only: the wait for the GPU (E3) is the slot's host_wait, not busy time
            self.busy_s["collect"] += time.perf_counter() - t - slot.stage_ms.get("host_wait", 0.0) / 1e3
            self.cpu_s["collect"] += time.thread_time() - cpu
            self.batches += 1
            self.frames += len(frames)
            slot.frames, slot.transforms = [], []
            self._free.put(slot)


def _put_nowait_drop(q: queue.Queue, item: object) -> None:
    with contextlib.suppress(queue.Full):
        q.put_nowait(item)
