"""The few CUDA driver calls the engines make themselves: device identity, events, stream capture.

Everything goes through ``DriverCuda`` (cuda-python's ``cuda.bindings.driver``, imported when first used) and
one ``check`` that raises ``CudaError("CUDA_ERROR_X: what it means")``. Engines take a ``CudaApi`` so that
tests can drive them with a fake; handles are plain ints. Streams are borrowed (the caller's), never
destroyed here.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

import numpy as np

from streamd.engines.base import EngineError


class CudaError(EngineError):
    """A CUDA driver call failed; the message names the call and the CUDA error."""


class CudaApi(Protocol):
    """What an engine needs from CUDA besides its own library. All handles are ints."""

    def device_info(self, device: int) -> tuple[str, tuple[int, int]]:
        """(GPU name, (compute capability major, minor)) of device ``device``."""
        ...

    def event_create(self) -> int:
        """A new event without timing (the cheap kind used only for ordering)."""
        ...

    def event_record(self, event: int, stream: int) -> None: ...

    def stream_wait_event(self, stream: int, event: int) -> None: ...

    def event_destroy(self, event: int) -> None: ...

    def begin_capture(self, stream: int) -> None:
        """Start capturing ``stream`` into a graph (thread-local mode: other threads may keep using CUDA)."""
        ...

    def end_capture(self, stream: int) -> int:
        """End the capture begun on ``stream``; returns an instantiated graph (``CUgraphExec``)."""
        ...

    def abort_capture(self, stream: int) -> None:
        """End a capture that failed half-way, dropping what was captured; never raises."""
        ...

    def graph_launch(self, graph_exec: int, stream: int) -> None: ...

    def graph_destroy(self, graph_exec: int) -> None: ...

    # Host round trips (``Engine.infer`` on device engines: tests and tools, never the pipeline).
    def stream_create(self) -> int: ...

    def stream_synchronize(self, stream: int) -> None: ...

    def stream_destroy(self, stream: int) -> None: ...

    def mem_alloc(self, nbytes: int) -> int: ...

    def mem_free(self, ptr: int) -> None: ...

    def copy_to_device(self, dst: int, src: np.ndarray) -> None:
        """Synchronous copy of a C-contiguous host array to device memory at ``dst``."""
        ...

    def copy_to_host(self, dst: np.ndarray, src: int) -> None:
        """Synchronous copy from device memory at ``src`` into a C-contiguous host array."""
        ...


def _driver() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise CudaError(
            "cuda-python (cuda.bindings.driver) is not installed; "
            "install the gpu extra: pip install 'streamd[gpu]'"
        ) from exc
    return driver


def device_count() -> int:
    """Number of CUDA devices the driver sees (0 without a driver)."""
    drv = _driver()
    (err,) = drv.cuInit(0)
    if err != drv.CUresult.CUDA_SUCCESS:
        return 0
    err, count = drv.cuDeviceGetCount()
    return int(count) if err == drv.CUresult.CUDA_SUCCESS else 0


class DriverCuda:
    """``CudaApi`` over the CUDA driver API, on the device's primary context (shared with torch, TensorRT
    and the decoders). Each thread that calls in makes that context current first."""

    def __init__(self, device: int = 0) -> None:
        self._drv = _driver()
        self.device = device
        self._local = threading.local()
        self.check(self._drv.cuInit(0), "cuInit")
        self._dev = self.check(self._drv.cuDeviceGet(device), f"cuDeviceGet({device})")
        self._ctx = self.check(self._drv.cuDevicePrimaryCtxRetain(self._dev), "cuDevicePrimaryCtxRetain")
        self._closed = False

    def check(self, result: tuple[Any, ...], call: str) -> Any:
        """Raise ``CudaError`` unless ``result[0]`` is CUDA_SUCCESS; return the single output (or the
        tuple)."""
        err, outs = result[0], result[1:]
        if err != self._drv.CUresult.CUDA_SUCCESS:
            _, name = self._drv.cuGetErrorName(err)
            _, text = self._drv.cuGetErrorString(err)
            name = name.decode() if isinstance(name, bytes) else str(err)
            text = text.decode() if isinstance(text, bytes) else ""
            raise CudaError(f"{call}: {name}: {text}")
        if not outs:
            return None
        return outs[0] if len(outs) == 1 else outs

    def _current(self) -> None:
        if getattr(self._local, "ready", False):
            return
        self.check(self._drv.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")
        self._local.ready = True

    def device_info(self, device: int) -> tuple[str, tuple[int, int]]:
        drv = self._drv
        dev = self.check(drv.cuDeviceGet(device), f"cuDeviceGet({device})")
        raw = self.check(drv.cuDeviceGetName(256, dev), "cuDeviceGetName")
        name = raw.split(b"\0", 1)[0].decode(errors="replace").strip()
        attr = drv.CUdevice_attribute
        major = self.check(
            drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "cc"
        )
        minor = self.check(
            drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "cc"
        )
        return name, (int(major), int(minor))

    def event_create(self) -> int:
        self._current()
        flags = self._drv.CUevent_flags.CU_EVENT_DISABLE_TIMING
        return int(self.check(self._drv.cuEventCreate(flags), "cuEventCreate"))

    def event_record(self, event: int, stream: int) -> None:
        self._current()
        drv = self._drv
        self.check(drv.cuEventRecord(drv.CUevent(event), drv.CUstream(stream)), "cuEventRecord")

    def stream_wait_event(self, stream: int, event: int) -> None:
        self._current()
        drv = self._drv
        self.check(drv.cuStreamWaitEvent(drv.CUstream(stream), drv.CUevent(event), 0), "cuStreamWaitEvent")

    def event_destroy(self, event: int) -> None:
        self._current()
        self.check(self._drv.cuEventDestroy(self._drv.CUevent(event)), "cuEventDestroy")

    def begin_capture(self, stream: int) -> None:
        self._current()
        drv = self._drv
        mode = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        self.check(drv.cuStreamBeginCapture(drv.CUstream(stream), mode), "cuStreamBeginCapture")

    def end_capture(self, stream: int) -> int:
        self._current()
        drv = self._drv
        graph = self.check(drv.cuStreamEndCapture(drv.CUstream(stream)), "cuStreamEndCapture")
        try:
            graph_exec = self.check(drv.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        finally:
            drv.cuGraphDestroy(graph)  # the executable graph keeps what it needs
        return int(graph_exec)

    def abort_capture(self, stream: int) -> None:
        drv = self._drv
        err, graph = drv.cuStreamEndCapture(drv.CUstream(stream))
        if err == drv.CUresult.CUDA_SUCCESS and int(graph):
            drv.cuGraphDestroy(graph)

    def graph_launch(self, graph_exec: int, stream: int) -> None:
        self._current()
        drv = self._drv
        self.check(drv.cuGraphLaunch(drv.CUgraphExec(graph_exec), drv.CUstream(stream)), "cuGraphLaunch")

    def graph_destroy(self, graph_exec: int) -> None:
        self._current()
        self.check(self._drv.cuGraphExecDestroy(self._drv.CUgraphExec(graph_exec)), "cuGraphExecDestroy")

    def stream_create(self) -> int:
        self._current()
        flags = self._drv.CUstream_flags.CU_STREAM_NON_BLOCKING
        return int(self.check(self._drv.cuStreamCreate(flags), "cuStreamCreate"))

    def stream_synchronize(self, stream: int) -> None:
        self._current()
        self.check(self._drv.cuStreamSynchronize(self._drv.CUstream(stream)), "cuStreamSynchronize")

    def stream_destroy(self, stream: int) -> None:
        self._current()
        self.check(self._drv.cuStreamDestroy(self._drv.CUstream(stream)), "cuStreamDestroy")

    def mem_alloc(self, nbytes: int) -> int:
        self._current()
        return int(self.check(self._drv.cuMemAlloc(max(nbytes, 1)), f"cuMemAlloc({nbytes})"))

    def mem_free(self, ptr: int) -> None:
        self._current()
        self.check(self._drv.cuMemFree(self._drv.CUdeviceptr(ptr)), "cuMemFree")

    def copy_to_device(self, dst: int, src: np.ndarray) -> None:
        self._current()
        if not src.flags.c_contiguous:
            raise CudaError("copy_to_device: the host array must be C-contiguous")
        self.check(
            self._drv.cuMemcpyHtoD(self._drv.CUdeviceptr(dst), src.ctypes.data, src.nbytes), "cuMemcpyHtoD"
        )

    def copy_to_host(self, dst: np.ndarray, src: int) -> None:
        self._current()
        if not dst.flags.c_contiguous:
            raise CudaError("copy_to_host: the host array must be C-contiguous")
        self.check(
            self._drv.cuMemcpyDtoH(dst.ctypes.data, self._drv.CUdeviceptr(src), dst.nbytes), "cuMemcpyDtoH"
        )

    def close(self) -> None:
        """Release the primary-context reference taken in ``__init__``; safe to call twice."""
        if not self._closed:
            self._closed = True
            self._drv.cuDevicePrimaryCtxRelease(self._dev)
