"""A decode worker's stages when the engine is shared: the slot contract (``stages.contract.Stages``) with S1
here and S2/S3 in the engine process.

    preprocess (S1): frames -> this slot's exported rows (the CUDA kernel, then an IPC event; or OpenCV into
                     shared memory)
    infer (S2):      Submit(slot, stream ids) over the socket
    postprocess:     nothing (NMS runs in the engine process)
    collect:         wait for the slot's Results; boxes back to source pixels here

A reader thread files each Results under its slot. The engine process gone (a closed socket) or silent for
``ANSWER_S`` fails ``collect``: a stage failure, so the worker exits and the supervisor restarts it once the
engine process is back.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Sequence
from multiprocessing.connection import Client, Connection
from typing import TYPE_CHECKING, Any

import numpy as np

from streamd.config import Config
from streamd.engines.base import Engine, EngineError
from streamd.exitcodes import EX_CONFIG, EX_UNAVAILABLE, StartupError
from streamd.shared_engine.messages import Classes, EngineFacts, Results, Submit
from streamd.shared_engine.slots import WorkerRows
from streamd.stages.contract import Slot
from streamd.stages.preprocess.spec import PreprocessSpec
from streamd.types import Detections, to_source_padded

if TYPE_CHECKING:
    from streamd.gpu.cuda import Stream

log = logging.getLogger(__name__)
ANSWER_S = 60.0  # a batch's results later than this: the engine process is wedged
CONNECT_RETRY_S = 0.5
CLOSE_WAIT_S = 5.0  # at close, for the answers of batches still in the engine
# How long a worker waits for its engine process at start: a compiled engine's first start takes minutes.
CONNECT_S = 900.0


class EngineGone(RuntimeError):
    pass


def connect(address: str, authkey: bytes, deadline_s: float) -> tuple[Connection, EngineFacts]:
    """Connect to the engine process, retrying while it starts (its engine may take minutes to build)."""
    t_end = time.monotonic() + deadline_s
    while True:
        try:
            conn = Client(address, family="AF_UNIX", authkey=authkey)
            if not conn.poll(deadline_s):
                raise TimeoutError("no answer")
            facts = conn.recv()
            if not isinstance(facts, EngineFacts):
                raise ConnectionError(f"unexpected first message {type(facts).__name__}")
            return conn, facts
        except (OSError, EOFError, TimeoutError, ConnectionError) as exc:
            if time.monotonic() >= t_end:
                raise StartupError(
                    f"engine.shared: the engine process did not answer within {deadline_s:.0f} s ({exc})",
                    EX_UNAVAILABLE,
                ) from exc
            time.sleep(CONNECT_RETRY_S)


def remote_stages(config: Config, address: str, authkey: bytes, device: int) -> RemoteStages:
    """A worker's stages on the shared engine of its GPU; StartupError when it does not answer in time."""
    conn, facts = connect(address, authkey, CONNECT_S)
    m = config.model
    _, h, w = facts.input_shape
    pre = PreprocessSpec(w, h, m.channel_order, m.mean, m.std, m.resize, m.pad_value)
    batch = config.pipeline.batch_size
    try:
        if batch > facts.max_rows:
            raise StartupError(
                f"pipeline.batch_size {batch} is larger than the shared engine's batch {facts.max_rows}; "
                f"lower batch_size to at most {facts.max_rows}",
                EX_CONFIG,
            )
        return RemoteStages(conn, facts, pre, device, batch)
    except BaseException:
        conn.close()
        raise


class RemoteEngine:
    """The shared engine as a worker sees it (``Stages.engine``): its facts; it runs in the engine process."""

    def __init__(self, facts: EngineFacts, conn: Connection) -> None:
        self.facts, self._conn = facts, conn
        self.name = f"{facts.name} (shared)"
        self.on_device = facts.on_device
        self.max_batch = facts.max_rows
        self.input_shape = facts.input_shape
        self.input_dtype = np.dtype(facts.input_dtype)
        self.output_shape = facts.output_shape
        self.output_dtype = np.dtype(facts.output_dtype)

    def infer(self, batch: np.ndarray) -> np.ndarray:
        raise EngineError("the shared engine runs in the engine process; workers send it Submits")

    def enqueue(self, input_ptr: int, output_ptr: int, batch: int, stream: Stream) -> None:
        raise EngineError("the shared engine runs in the engine process; workers send it Submits")

    def close(self) -> None:
        self._conn.close()


class RemoteStages:
    def __init__(
        self, conn: Connection, facts: EngineFacts, pre: PreprocessSpec, device: int = 0, batch: int = 0
    ) -> None:
        self.engine: Engine = RemoteEngine(facts, conn)
        self._conn, self.facts = conn, facts
        self.batch = batch or facts.max_rows  # rows per slot: the worker's batch
        self._send_lock = threading.Lock()
        self._rows: dict[int, WorkerRows] = {}
        self._answers: dict[int, Results] = {}
        self._outstanding: set[int] = set()  # slots submitted and not answered yet
        self._cond = threading.Condition()
        self._gone: str | None = None
        self._staging: dict[int, Any] = {}
        if facts.on_device:
            from streamd.gpu.cuda import Context, Stream
            from streamd.gpu.kernels import KernelLoader
            from streamd.stages.cuda_input import DTYPE_NAMES, GpuInput

            self.ctx = Context(device)
            self.loader = KernelLoader(self.ctx)
            self.s1 = Stream(self.ctx, self.ctx.priority_range()[0])
            dtype = DTYPE_NAMES[np.dtype(facts.input_dtype)]
            self._gpu = GpuInput(pre, self.ctx, self.loader, self.s1, max_batch=self.batch, dtype=dtype)
        else:
            from streamd.stages.host_frames import HostFrames
            from streamd.stages.preprocess.cpu import CpuPreprocessor

            self._cpu, self._host = CpuPreprocessor(pre), HostFrames()
        self._reader = threading.Thread(target=self._read, name="engine-answers", daemon=True)
        self._reader.start()

    def _send(self, message: object) -> None:
        with self._send_lock:
            try:
                self._conn.send(message)
            except (OSError, EOFError, ValueError) as exc:
                raise EngineGone(f"the shared engine process is gone ({exc})") from exc

    def _read(self) -> None:
        try:
            while True:
                message = self._conn.recv()
                if isinstance(message, Results):
                    with self._cond:
                        self._answers[message.slot] = message
                        self._outstanding.discard(message.slot)
                        self._cond.notify_all()
        except (EOFError, OSError) as exc:
            why = f"the shared engine process closed the connection ({type(exc).__name__})"
        except Exception as exc:
            why = f"reading the shared engine's answers failed ({exc})"
        with self._cond:
            self._gone = why
            self._cond.notify_all()

    def new_slot(self, index: int) -> Slot:
        if self.facts.on_device:
            self.ctx.activate()
        rows = WorkerRows(self.facts, index, self.batch)
        self._rows[index] = rows
        self._send(rows.attach())
        if self.facts.on_device:
            from streamd.stages.cuda_input import Staging

            self._staging[index] = Staging()
        return Slot(index, buffers=rows)

    def preprocess(self, slot: Slot) -> None:
        t = time.perf_counter()
        rows: WorkerRows = slot.buffers  # type: ignore[assignment]
        if self.facts.on_device:
            self.ctx.ensure_current()
            slot.transforms = self._gpu(slot.frames, self._staging[slot.index], rows.ptr)
            rows.event.record(self.s1)
        else:
            self._host.convert_pending(slot.frames)
            out = rows.array
            assert out is not None
            slot.transforms = [self._cpu(f.image, out[i]) for i, f in enumerate(slot.frames)]  # type: ignore[arg-type]
        slot.stage_ms["preprocess"] = (time.perf_counter() - t) * 1e3

    def infer(self, slot: Slot) -> None:
        with self._cond:
            self._outstanding.add(slot.index)
        self._send(Submit(slot.index, tuple(f.stream_id for f in slot.frames)))

    def postprocess(self, slot: Slot) -> None:
        """NMS runs in the engine process."""

    def set_classes(self, stream_id: str, thresholds: Sequence[float] | None) -> None:
        """The engine process runs the NMS: it gets the row, ahead of this worker's later Submits (one
        socket, in order)."""
        row = None if thresholds is None else tuple(float(t) for t in thresholds)
        try:
            self._send(Classes(stream_id, row))
        except EngineGone:  # the stream's first Submit fails the same way: a stage failure, and a restart
            log.warning("engine: the shared engine process is gone; stream %s's classes not sent", stream_id)

    def collect(self, slot: Slot) -> list[Detections]:
        t = time.perf_counter()
        deadline = time.monotonic() + ANSWER_S
        with self._cond:
            while slot.index not in self._answers:
                if self._gone is not None:
                    raise EngineGone(self._gone)
                if (
                    not self._cond.wait(max(0.0, deadline - time.monotonic()))
                    and time.monotonic() >= deadline
                ):
                    raise EngineGone(f"the shared engine did not answer a batch within {ANSWER_S:.0f} s")
            answer = self._answers.pop(slot.index)
        slot.stage_ms.update(engine=answer.engine_ms, host_wait=(time.perf_counter() - t) * 1e3)
        frames = slot.frames
        return to_source_padded(
            answer.det, answer.counts, slot.transforms, [(f.width, f.height) for f in frames]
        )

    def warmed(self) -> None:
        """The engine process warmed the engine; nothing here to give back."""

    def close(self) -> None:
        # Rows the engine may still copy from are freed only once their batches are answered (an abort
        # leaves Submits uncollected), or the engine is gone; bounded, as everything at shutdown.
        deadline = time.monotonic() + CLOSE_WAIT_S
        with self._cond:
            while self._outstanding and self._gone is None and time.monotonic() < deadline:
                self._cond.wait(0.1)
        # close() alone does not wake a thread blocked in recv() on it: shut the socket down first, so the
        # reader ends now and the engine process sees this worker go at once.
        with contextlib.suppress(OSError), socket.socket(fileno=os.dup(self._conn.fileno())) as sock:
            sock.shutdown(socket.SHUT_RDWR)
        self._reader.join(timeout=5)
        self._conn.close()
        if self.facts.on_device:
            self.ctx.activate()
            self.s1.synchronize()
            self._gpu.close()
            for staging in self._staging.values():
                staging.close()
        else:
            self._host.close()
        for rows in self._rows.values():
            rows.close()
        if self.facts.on_device:
            self.s1.close()
            self.loader.close()
            self.ctx.close()
