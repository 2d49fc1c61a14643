"""The engine process's data path: merge the batches of every connected worker into engine batches.

Threads: one reader per worker socket (``Attach`` -> import its rows; ``Submit`` -> the queue), ``dispatch``
(take queued Submits in arrival order while their rows fit the engine batch; gather their rows into a free
slot; enqueue inference and NMS through the same ``Stages`` a worker uses on its own) and ``collect`` (wait
for a slot's results, send each worker its rows, free the slot). On the GPU gathering is a device-to-device
copy per Submit, after the worker's IPC event (no host wait): 20 MB per batch of 16 at 640², microseconds on
an H200 beside milliseconds of inference. Two slots: one batch in the engine, the next queued behind it; what
arrives meanwhile waits for a slot and goes as one batch (with three, a 30-camera RT-DETR-l run sent the
Submits of workers of batch 16 one by one: 16.5 rows per engine batch).

A worker that disconnects is forgotten: its queued Submits are dropped, and its imported rows are closed by
the dispatch thread once its GPU work that may still read them is done.
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from streamd.exitcodes import EX_SOFTWARE
from streamd.shared_engine.messages import Attach, Classes, EngineFacts, Results, Submit
from streamd.shared_engine.slots import ImportedRows, row_bytes
from streamd.stages.contract import Slot, Stages
from streamd.types import Detections, Frame

log = logging.getLogger("streamd.engine")


@dataclass(eq=False)
class Client:
    conn: Connection
    name: str
    rows: dict[int, ImportedRows] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    gone: bool = False

    def send(self, message: object) -> None:
        if self.gone:
            return
        with self.lock:
            try:
                self.conn.send(message)
            except (OSError, EOFError, ValueError):
                self.gone = True


@dataclass
class _Batch:
    slot: Slot
    parts: list[tuple[Client, Submit]]
    t0: float


def _fatal(what: str) -> None:
    """A batch failed in the engine process (a CUDA error can leave its context unusable, and a slot's
    buffers may still be in use on the GPU): exit at once, so the supervisor restarts the process and its
    workers, whose batches then fail, restart onto it. Answering the batch and going on risked a broken
    engine answering every batch with an error for good."""
    log.critical("engine: %s failed; the engine process exits and is restarted", what, exc_info=True)
    logging.shutdown()
    os._exit(EX_SOFTWARE)


def pack(dets: list[Detections]) -> tuple[np.ndarray, np.ndarray]:
    """Per-row detections -> (counts [n] int32, det [n, max count, 6] float32), the wire format."""
    counts = np.array([len(d.score) for d in dets], np.int32)
    det = np.zeros((len(dets), int(counts.max(initial=0)), 6), np.float32)
    for i, d in enumerate(dets):
        k = len(d.score)
        det[i, :k, :4], det[i, :k, 4], det[i, :k, 5] = d.xyxy, d.score, d.class_id
    return counts, det


def fullest_prefix(sizes: list[int], buckets: list[int]) -> int:
    """How many of the queued Submits (``sizes``: rows each, oldest first) to run now: the prefix that fills
    its engine batch size (the smallest of ``buckets`` that holds it) best, the longest of equals. A GPU
    engine runs a few batch sizes (CUDA graphs at powers of two): 40 rows run as 64, 37 % of the engine's
    work for nothing, where 32 now and 8 next run full (RT-DETR-l, 5 workers of batch 8: 0.72 of the
    engine's rate before, every detection after; bench/RESULTS.md)."""
    best, best_fill, rows = len(sizes), 0.0, 0
    for k, n in enumerate(sizes, 1):
        rows += n
        size = next((b for b in buckets if b >= rows), rows)
        if rows / size >= best_fill:
            best, best_fill = k, rows / size
    return best


class EngineServer:
    def __init__(self, stages: Stages, facts: EngineFacts, ring: int = 3) -> None:
        self.stages, self.facts = stages, facts
        self._row_bytes = row_bytes(facts)
        self._free: queue.Queue[Slot] = queue.Queue()
        for k in range(ring):
            self._free.put(stages.new_slot(k))
        self._pending: collections.deque[tuple[Client, Submit]] = collections.deque()
        self._cond = threading.Condition()
        self._inflight: queue.Queue[_Batch | None] = queue.Queue()
        self._gone: list[Client] = []  # disconnected workers whose imports the dispatch thread closes
        self._stop = threading.Event()
        self.batches = self.rows = 0
        self._threads = [
            threading.Thread(target=self._dispatch, name="dispatch", daemon=True),
            threading.Thread(target=self._collect, name="collect", daemon=True),
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def waiting(self) -> int:
        """Submits queued or in the engine's batches in flight."""
        return len(self._pending) + self._inflight.qsize()

    def serve(self, conn: Connection, name: str) -> None:
        """A worker connected: tell it the engine, then read its messages until it goes (own thread)."""
        client = Client(conn, name)
        client.send(self.facts)
        try:
            while not self._stop.is_set():
                message = conn.recv()
                if isinstance(message, Attach):
                    self._attach(client, message)
                elif isinstance(message, Submit):
                    with self._cond:
                        self._pending.append((client, message))
                        self._cond.notify()
                elif isinstance(message, Classes):
                    self.stages.set_classes(message.stream_id, message.thresholds)
        except (EOFError, OSError):
            pass
        except Exception:
            log.exception("engine: worker %s sent something unusable; dropping it", name)
        client.gone = True
        with self._cond:
            self._gone.append(client)
            self._cond.notify()
        log.info("engine: worker %s disconnected", name)

    def _attach(self, client: Client, attach: Attach) -> None:
        if self.facts.on_device:
            self.stages.ctx.ensure_current()  # type: ignore[attr-defined]
        old = client.rows.pop(attach.slot, None)
        if old is not None:
            old.close()
        client.rows[attach.slot] = ImportedRows(attach, self.facts)

    def _take(self) -> list[tuple[Client, Submit]] | None:
        """The Submits of the next engine batch: the oldest first, then later ones in order while they fit."""
        with self._cond:
            while not self._pending and not self._stop.is_set():
                self._reap()
                self._cond.wait(0.5)
            if self._stop.is_set():
                return None
            self._reap()
            parts: list[tuple[Client, Submit]] = []
            rows = 0
            while self._pending:
                client, sub = self._pending[0]
                if client.gone:
                    self._pending.popleft()
                    continue
                if parts and rows + len(sub.stream_ids) > self.facts.max_rows:
                    break
                self._pending.popleft()
                parts.append((client, sub))
                rows += len(sub.stream_ids)
            buckets = getattr(self.stages, "buckets", None)  # GpuStages: its CUDA graphs' batch sizes
            keep = fullest_prefix([len(s.stream_ids) for _, s in parts], buckets) if buckets else len(parts)
            self._pending.extendleft(reversed(parts[keep:]))  # the rest goes first next time
            return parts[:keep]

    def _reap(self) -> None:
        """Close the imports of workers that left (dispatch thread, under _cond). Their rows are read only by
        gather copies on S1: once S1 is idle, nothing reads them."""
        if not self._gone:
            return
        if self.facts.on_device:
            self.stages.s1.synchronize()  # type: ignore[attr-defined]
        for client in self._gone:
            for rows in client.rows.values():
                rows.close(unlink=True)  # a killed worker never unlinks its shared memory
            client.rows.clear()
        self._gone.clear()

    def _dispatch(self) -> None:
        try:
            self._dispatch_loop()
        except BaseException:
            _fatal("dispatching a batch")

    def _dispatch_loop(self) -> None:
        if self.facts.on_device:
            self.stages.ctx.activate()  # type: ignore[attr-defined]
        _, h, w = self.facts.input_shape
        while True:
            # A free slot first, then the Submits: while the engine runs the batches in flight, the workers'
            # Submits queue up and go as one batch (taken first, they went one by one, each in its own slot).
            slot = self._free.get()
            parts = self._take()
            if parts is None:
                self._inflight.put(None)
                return
            parts = [(c, s) for c, s in parts if s.slot in c.rows]
            if not parts:
                self._free.put(slot)
                continue
            t0 = time.perf_counter()
            self._gather(slot, parts)
            slot.frames = [Frame(sid, 0, None, w, h) for _, s in parts for sid in s.stream_ids]
            self.stages.infer(slot)
            self.stages.postprocess(slot)
            self._inflight.put(_Batch(slot, parts, t0))

    def _gather(self, slot: Slot, parts: list[tuple[Client, Submit]]) -> None:
        buf: Any = slot.buffers
        offset = 0
        if self.facts.on_device:
            from streamd.gpu.ipc import copy_dtod

            s1 = self.stages.s1  # type: ignore[attr-defined]
            buf.events[0].record(s1)
            for client, sub in parts:
                rows, n = client.rows[sub.slot], len(sub.stream_ids)
                s1.wait(rows.event)  # the worker's preprocess of these rows is done
                copy_dtod(buf.input.ptr + offset * self._row_bytes, rows.ptr, n * self._row_bytes, s1)
                offset += n
            buf.events[1].record(s1)
            return
        for client, sub in parts:
            rows, n = client.rows[sub.slot], len(sub.stream_ids)
            buf.input[offset : offset + n] = rows.array[:n]  # type: ignore[index]
            offset += n

    def _collect(self) -> None:
        try:
            self._collect_loop()
        except BaseException:
            _fatal("collecting a batch")

    def _collect_loop(self) -> None:
        on_device = self.facts.on_device
        if on_device:
            self.stages.ctx.activate()  # type: ignore[attr-defined]
        while True:
            batch = self._inflight.get()
            if batch is None:
                return
            slot, buf = batch.slot, batch.slot.buffers
            n = len(slot.frames)
            if on_device:
                buf.events[3].synchronize()  # type: ignore[attr-defined]
                counts, det = buf.host.counts[:n], buf.host.det[:n]  # type: ignore[attr-defined]
            else:
                counts, det = pack(buf.detections)  # type: ignore[attr-defined]
            ms = (time.perf_counter() - batch.t0) * 1e3
            offset = 0
            for client, sub in batch.parts:
                k = len(sub.stream_ids)
                c = counts[offset : offset + k].copy()
                d = det[offset : offset + k, : int(c.max(initial=0))].copy()
                client.send(Results(sub.slot, c, d, ms, n))
                offset += k
            self.batches += 1
            self.rows += n
            self._free.put(slot)

    def close(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        for t in self._threads:
            t.join(timeout=10)
        self.stages.close()
