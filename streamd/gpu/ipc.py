"""CUDA memory and events shared between processes (``cuIpc*``): a decode worker's preprocess writes into
memory the engine process reads, and the engine process waits on the worker's event without any host sync.

A handle is 64 opaque bytes (``bytes`` here, so it pickles); ``cuda.bindings`` exposes the structs only by
address, hence the ctypes copies. Memory must come from ``cuMemAlloc`` (``DeviceBuffer``), and an event
must be made ``CU_EVENT_INTERPROCESS`` (no timing). The importer closes what it opened; the exporter frees
the memory.
"""

from __future__ import annotations

import ctypes
import weakref
from typing import Any

from streamd.gpu.cuda import DeviceBuffer, Stream, _quiet, check, driver

HANDLE_BYTES = 64


def _to_bytes(handle: Any) -> bytes:
    return ctypes.string_at(handle.getPtr(), HANDLE_BYTES)


def _from_bytes(kind: Any, data: bytes) -> Any:
    if len(data) != HANDLE_BYTES:
        raise ValueError(f"a CUDA IPC handle is {HANDLE_BYTES} bytes, got {len(data)}")
    handle = kind()
    ctypes.memmove(handle.getPtr(), data, HANDLE_BYTES)
    return handle


def export_memory(buf: DeviceBuffer) -> bytes:
    return _to_bytes(check(driver().cuIpcGetMemHandle(buf.raw), "cuIpcGetMemHandle"))


class ImportedMemory:
    """Another process's ``DeviceBuffer`` in this process's context; ``ptr`` as an int."""

    def __init__(self, handle: bytes, nbytes: int) -> None:
        drv = driver()
        flags = int(drv.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
        raw = check(
            drv.cuIpcOpenMemHandle(_from_bytes(drv.CUipcMemHandle, handle), flags), "cuIpcOpenMemHandle"
        )
        self.ptr, self.nbytes = int(raw), int(nbytes)
        self._finalizer = weakref.finalize(self, _quiet, drv.cuIpcCloseMemHandle, raw)

    def close(self) -> None:
        self._finalizer()


class IpcEvent:
    """A sync-only event another process can wait on (``handle``)."""

    def __init__(self) -> None:
        drv = driver()
        flags = int(drv.CUevent_flags.CU_EVENT_INTERPROCESS) | int(drv.CUevent_flags.CU_EVENT_DISABLE_TIMING)
        self.raw = check(drv.cuEventCreate(flags), "cuEventCreate")
        self.handle = _to_bytes(check(drv.cuIpcGetEventHandle(self.raw), "cuIpcGetEventHandle"))
        self._finalizer = weakref.finalize(self, _quiet, drv.cuEventDestroy, self.raw)

    def record(self, stream: Stream) -> None:
        check(driver().cuEventRecord(self.raw, stream.raw), "cuEventRecord")

    def close(self) -> None:
        self._finalizer()


class ImportedEvent:
    """Another process's ``IpcEvent``: ``Stream.wait`` takes it like a local event."""

    def __init__(self, handle: bytes) -> None:
        drv = driver()
        self.raw = check(
            drv.cuIpcOpenEventHandle(_from_bytes(drv.CUipcEventHandle, handle)), "cuIpcOpenEventHandle"
        )
        self._finalizer = weakref.finalize(self, _quiet, drv.cuEventDestroy, self.raw)

    def close(self) -> None:
        self._finalizer()


def copy_dtod(dst: int, src: int, nbytes: int, stream: Stream) -> None:
    """Asynchronous device -> device copy between raw addresses (an imported buffer's included)."""
    check(driver().cuMemcpyDtoDAsync(dst, src, nbytes, stream.raw), "cuMemcpyDtoDAsync")
