"""The CUDA side of an NVDEC decoder (``streamd.ingest.decode.nvdec``): its context, stream, events, pooled
buffers and device-to-device copies, on this package's CUDA layer (``streamd.gpu.cuda``). ``cuda.bindings``
is imported when a ``DecoderGpu`` is made, never on import.
"""

from __future__ import annotations

from typing import Any


class DecoderGpu:
    """The CUDA side of one NVDEC decoder (context, stream, events, buffers, copies) on ``streamd.gpu.cuda``.

    One small object so that CPU tests can stand a fake in its place (``NvdecDecoder(gpu=...)``).
    """

    def __init__(self, device: int) -> None:
        from streamd.gpu import cuda

        self._cuda = cuda
        self._drv = cuda.driver()
        self.device = device
        self.ctx = cuda.Context(device)
        self.stream = cuda.Stream(self.ctx)
        self.context_handle = int(self.ctx.handle)
        self.stream_handle = self.stream.handle
        dev = self._drv.CUmemorytype.CU_MEMORYTYPE_DEVICE
        self._copies: dict[int, Any] = {}  # one reusable CUDA_MEMCPY2D per destination pointer
        self._dev_type = dev

    def event(self) -> Any:
        return self._cuda.Event()

    def alloc(self, nbytes: int) -> Any:
        return self._cuda.DeviceBuffer(nbytes)

    def record(self, event: Any, stream: Any = None) -> None:
        """Record ``event`` on ``stream`` (a ``streamd.gpu.cuda.Stream``, a raw handle, or None: ours)."""
        if stream is None:
            event.record(self.stream)
        elif hasattr(stream, "raw"):
            event.record(stream)
        else:
            event.record(self._cuda.Stream.borrow(int(stream), self.ctx))

    def wait(self, event: Any, stream: Any = None) -> None:
        """Make ``stream`` (default ours) wait for ``event``."""
        if stream is None:
            self.stream.wait(event)
        elif hasattr(stream, "raw"):
            stream.wait(event)
        else:
            self._cuda.Stream.borrow(int(stream), self.ctx).wait(event)

    def synchronize(self, event: Any) -> None:
        event.synchronize()

    def copy_plane(self, dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, rows: int) -> None:
        """Device-to-device 2-D copy of ``rows`` rows of ``width`` bytes, asynchronous on our stream."""
        m = self._copies.get(dst)
        if m is None:
            m = self._copies[dst] = self._drv.CUDA_MEMCPY2D()
            m.srcMemoryType = self._dev_type
            m.dstMemoryType = self._dev_type
        m.srcDevice, m.srcPitch = src, src_pitch
        m.dstDevice, m.dstPitch = dst, dst_pitch
        m.WidthInBytes, m.Height = width, rows
        self._cuda.check(self._drv.cuMemcpy2DAsync(m, self.stream.raw), "cuMemcpy2DAsync")

    def copy_linear(self, dst: int, src: int, nbytes: int) -> None:
        """Device-to-device copy of ``nbytes`` contiguous bytes, asynchronous on our stream."""
        self._cuda.check(self._drv.cuMemcpyDtoDAsync(dst, src, nbytes, self.stream.raw), "cuMemcpyDtoDAsync")

    def forget(self, dst: int) -> None:
        self._copies.pop(dst, None)

    def memory_type(self, ptr: int) -> str:
        """``device`` | ``host`` | ``array`` | ``unified`` | ``unknown``: where ``ptr`` lives."""
        drv = self._drv
        attr = drv.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE
        try:
            value = self._cuda.check(drv.cuPointerGetAttribute(attr, ptr), "cuPointerGetAttribute")
        except self._cuda.CUDAError:
            return "unknown"
        names = {1: "host", 2: "device", 3: "array", 4: "unified"}
        return names.get(int(value), "unknown")

    def close_stream(self) -> None:
        self.stream.synchronize()
        self.stream.close()

    def release_context(self) -> None:
        """Drop our retain of the primary context (last: after every buffer and event of ours is freed)."""
        self.ctx.close()
