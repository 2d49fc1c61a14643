"""A worker's rows as both processes see them: exported by the worker (``WorkerRows``), imported by the engine
(``ImportedRows``); CUDA IPC memory plus an IPC event on the GPU, a shared-memory block on the CPU.

The worker, which makes a shared-memory block, unlinks it. Python < 3.13 also registers the block when the
engine process attaches it, with the resource tracker both processes share (spawned by one supervisor): a
second registration of the same name, which the worker's unlink clears; unregistering it here would make that
unlink fail in the tracker.
"""

from __future__ import annotations

import contextlib
import sys
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from streamd.shared_engine.messages import Attach, EngineFacts


def row_bytes(facts: EngineFacts) -> int:
    return int(np.prod(facts.input_shape)) * np.dtype(facts.input_dtype).itemsize


class WorkerRows:
    """One ring slot's ``rows`` (the worker's batch size) in the worker: ``ptr`` (GPU) or ``array`` (CPU,
    [rows, C, H, W])."""

    def __init__(self, facts: EngineFacts, slot: int, rows: int) -> None:
        self.slot = slot
        self.nbytes = rows * row_bytes(facts)
        self.on_device = facts.on_device
        self.ptr = 0
        self.array: np.ndarray | None = None
        self.event: Any = None
        if facts.on_device:
            from streamd.gpu.cuda import DeviceBuffer
            from streamd.gpu.ipc import IpcEvent, export_memory

            self._buffer = DeviceBuffer(self.nbytes)
            self.ptr, self.event = self._buffer.ptr, IpcEvent()
            self._memory: bytes | str = export_memory(self._buffer)
        else:
            self._shm = shared_memory.SharedMemory(create=True, size=self.nbytes)
            shape = (rows, *facts.input_shape)
            self.array = np.ndarray(shape, np.dtype(facts.input_dtype), buffer=self._shm.buf)
            self._memory = self._shm.name

    def attach(self) -> Attach:
        return Attach(self.slot, self.nbytes, self._memory, self.event.handle if self.event else None)

    def close(self) -> None:
        if self.on_device:
            self.event.close()
            self._buffer.close()
            return
        self.array = None
        self._shm.close()
        with contextlib.suppress(FileNotFoundError):  # the engine process unlinked it (it saw us go first)
            self._shm.unlink()


class ImportedRows:
    """A worker's ``WorkerRows`` in the engine process."""

    def __init__(self, attach: Attach, facts: EngineFacts) -> None:
        self.nbytes = attach.nbytes
        self.ptr = 0
        self.event: Any = None
        self.array: np.ndarray | None = None
        self._memory: Any = None
        if facts.on_device:
            from streamd.gpu.ipc import ImportedEvent, ImportedMemory

            assert isinstance(attach.memory, bytes) and attach.event is not None
            self._memory = ImportedMemory(attach.memory, attach.nbytes)
            self.ptr = self._memory.ptr
            self.event = ImportedEvent(attach.event)
        else:
            assert isinstance(attach.memory, str)
            if sys.version_info >= (3, 13):
                self._memory = shared_memory.SharedMemory(attach.memory, track=False)
            else:
                self._memory = shared_memory.SharedMemory(attach.memory)
            rows = attach.nbytes // row_bytes(facts)
            shape = (rows, *facts.input_shape)
            self.array = np.ndarray(shape, np.dtype(facts.input_dtype), buffer=self._memory.buf)

    def close(self, unlink: bool = False) -> None:
        """``unlink``: the worker is gone; its shared-memory block goes too (already gone is fine)."""
        if self.event is not None:
            self.event.close()
        self.array = None
        if self._memory is not None:
            self._memory.close()
            if unlink and isinstance(self._memory, shared_memory.SharedMemory):
                with contextlib.suppress(FileNotFoundError):
                    self._memory.unlink()
