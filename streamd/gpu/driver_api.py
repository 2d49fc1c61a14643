"""The CUDA calls an engine makes itself (events, stream capture, graphs, a host round trip), as int handles.

``CudaApi`` is the one seam between an engine and CUDA: ``TensorRTEngine(cuda_api=...)`` takes any object
with these methods (the tests pass the fake in tests/engines/fake_tensorrt); ``DriverApi`` is the real one,
on this package's CUDA layer (``streamd.gpu.cuda``: one ``check``, one ``CUDAError``, the device's primary
context shared with torch, TensorRT and the decoders). Streams are the caller's: borrowed, never destroyed.
"""

from __future__ import annotations

import threading
from typing import Protocol

import numpy as np

from streamd.gpu.cuda import CUDAError, check, driver


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

    def close(self) -> None: ...


class DriverApi:
    """``CudaApi`` over the CUDA driver API on the device's primary context; each calling thread makes that
    context current once. Raises ``streamd.gpu.cuda.CUDAError``."""

    def __init__(self, device: int = 0) -> None:
        from streamd.gpu.cuda import Context

        self._drv = driver()
        self.device = device
        self._ctx = Context(device)
        self._local = threading.local()
        self._local.ready = True  # Context made it current in this thread

    def _current(self) -> None:
        if not getattr(self._local, "ready", False):
            self._ctx.activate()
            self._local.ready = True

    def device_info(self, device: int) -> tuple[str, tuple[int, int]]:
        from streamd.gpu.cuda import device_info

        return device_info(device)

    def event_create(self) -> int:
        self._current()
        flags = self._drv.CUevent_flags.CU_EVENT_DISABLE_TIMING
        return int(check(self._drv.cuEventCreate(flags), "cuEventCreate"))

    def event_record(self, event: int, stream: int) -> None:
        self._current()
        check(self._drv.cuEventRecord(self._drv.CUevent(event), self._drv.CUstream(stream)), "cuEventRecord")

    def stream_wait_event(self, stream: int, event: int) -> None:
        self._current()
        drv = self._drv
        check(drv.cuStreamWaitEvent(drv.CUstream(stream), drv.CUevent(event), 0), "cuStreamWaitEvent")

    def event_destroy(self, event: int) -> None:
        self._current()
        check(self._drv.cuEventDestroy(self._drv.CUevent(event)), "cuEventDestroy")

    def begin_capture(self, stream: int) -> None:
        self._current()
        drv = self._drv
        mode = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        check(drv.cuStreamBeginCapture(drv.CUstream(stream), mode), "cuStreamBeginCapture")

    def end_capture(self, stream: int) -> int:
        self._current()
        drv = self._drv
        graph = check(drv.cuStreamEndCapture(drv.CUstream(stream)), "cuStreamEndCapture")
        try:
            graph_exec = check(drv.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        finally:
            drv.cuGraphDestroy(graph)  # the executable graph keeps what it needs
        return int(graph_exec)

    def abort_capture(self, stream: int) -> None:
        drv = self._drv
        try:
            graph = check(drv.cuStreamEndCapture(drv.CUstream(stream)), "cuStreamEndCapture")
        except CUDAError:  # the capture was already invalidated: nothing to drop
            return
        if int(graph):
            drv.cuGraphDestroy(graph)

    def graph_launch(self, graph_exec: int, stream: int) -> None:
        self._current()
        drv = self._drv
        check(drv.cuGraphLaunch(drv.CUgraphExec(graph_exec), drv.CUstream(stream)), "cuGraphLaunch")

    def graph_destroy(self, graph_exec: int) -> None:
        self._current()
        check(self._drv.cuGraphExecDestroy(self._drv.CUgraphExec(graph_exec)), "cuGraphExecDestroy")

    def stream_create(self) -> int:
        self._current()
        flags = self._drv.CUstream_flags.CU_STREAM_NON_BLOCKING
        return int(check(self._drv.cuStreamCreate(flags), "cuStreamCreate"))

    def stream_synchronize(self, stream: int) -> None:
        self._current()
        check(self._drv.cuStreamSynchronize(self._drv.CUstream(stream)), "cuStreamSynchronize")

    def stream_destroy(self, stream: int) -> None:
        self._current()
        check(self._drv.cuStreamDestroy(self._drv.CUstream(stream)), "cuStreamDestroy")

    def mem_alloc(self, nbytes: int) -> int:
        self._current()
        return int(check(self._drv.cuMemAlloc(max(nbytes, 1)), f"cuMemAlloc({nbytes})"))

    def mem_free(self, ptr: int) -> None:
        self._current()
        check(self._drv.cuMemFree(self._drv.CUdeviceptr(ptr)), "cuMemFree")

    def copy_to_device(self, dst: int, src: np.ndarray) -> None:
        self._current()
        if not src.flags.c_contiguous:
            raise ValueError("copy_to_device: the host array must be C-contiguous")
        check(self._drv.cuMemcpyHtoD(self._drv.CUdeviceptr(dst), src.ctypes.data, src.nbytes), "cuMemcpyHtoD")

    def copy_to_host(self, dst: np.ndarray, src: int) -> None:
        self._current()
        if not dst.flags.c_contiguous:
            raise ValueError("copy_to_host: the host array must be C-contiguous")
        check(self._drv.cuMemcpyDtoH(dst.ctypes.data, self._drv.CUdeviceptr(src), dst.nbytes), "cuMemcpyDtoH")

    def close(self) -> None:
        """Release the primary-context reference taken in ``__init__``; safe to call twice."""
        self._ctx.close()
