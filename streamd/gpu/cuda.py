"""Thin CUDA driver layer over ``cuda.bindings``: one error path, primary context, streams, events, buffers.

Every driver call goes through :func:`check`, which raises :class:`CUDAError` carrying the CUDA error name.
Every owner has a ``close()`` that is safe to call twice, and a ``weakref.finalize`` holding only the raw
handle, so cleanup never keeps the owner alive; errors during that cleanup (say at interpreter exit, after the
context is gone) are ignored. Borrowed handles (a stream from PyNvVideoCodec or torch) are never destroyed.

Threads: the driver's current context is per thread. :class:`Context` makes it current in the thread that
creates it; any other thread that calls into this module must call ``ctx.activate()`` once first.
``cuda.bindings`` is imported lazily (first use), so importing this module never needs it.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from streamd.exitcodes import EX_UNAVAILABLE, StartupError

if TYPE_CHECKING:
    from collections.abc import Callable

_drv: Any = None


def driver() -> Any:
    """``cuda.bindings.driver``, imported on first use."""
    global _drv
    if _drv is None:
        try:
            from cuda.bindings import driver as drv
        except ImportError as exc:  # pragma: no cover - depends on the machine
            raise CUDAError(
                "CUDA_ERROR_NOT_AVAILABLE", "cuda.bindings is not installed (pip install cuda-bindings)"
            ) from exc
        _drv = drv
    return _drv


_made_current = threading.local()  # .ctx: the Context this thread last activated


class CUDAError(StartupError, RuntimeError):
    """A CUDA driver call failed. ``name`` is the CUDA error name (``CUDA_ERROR_OUT_OF_MEMORY``...). At
    start-up (no driver, no device, CUDA init) it ends the program with exit code 69 (``EX_UNAVAILABLE``)."""

    def __init__(self, name: str, message: str, call: str = "") -> None:
        self.name = name
        self.call = call
        where = f" in {call}" if call else ""
        super().__init__(f"{name}{where}: {message}", EX_UNAVAILABLE)


def _error_text(err: Any) -> tuple[str, str]:
    drv = driver()
    try:
        e1, name = drv.cuGetErrorName(err)
        e2, text = drv.cuGetErrorString(err)
        name_s = name.decode() if e1 == drv.CUresult.CUDA_SUCCESS and name else str(err)
        text_s = text.decode() if e2 == drv.CUresult.CUDA_SUCCESS and text else "unknown error"
        return name_s, text_s
    except Exception:
        return str(err), "unknown error"


def _nothing() -> None:
    pass


def check(result: Any, call: str = "") -> Any:
    """Unwrap a ``cuda.bindings.driver`` return value ``(err, *outs)`` (or a bare ``err``).

    Returns None, the single output, or a tuple of outputs; raises :class:`CUDAError` when ``err`` is not
    ``CUDA_SUCCESS``.
    """
    if isinstance(result, tuple):
        err, outs = result[0], result[1:]
    else:
        err, outs = result, ()
    if err != driver().CUresult.CUDA_SUCCESS:
        name, text = _error_text(err)
        raise CUDAError(name, text, call)
    if not outs:
        return None
    return outs[0] if len(outs) == 1 else outs


def _quiet(fn: Callable[..., Any], *args: Any) -> None:
    """Finalizer body: release a handle, ignoring failures (the context may already be gone)."""
    with contextlib.suppress(Exception):
        fn(*args)


def device_count() -> int:
    """CUDA devices the driver sees; 0 without cuda-python, a driver or a device (never raises)."""
    try:
        drv = driver()
        check(drv.cuInit(0), "cuInit")
        return int(check(drv.cuDeviceGetCount(), "cuDeviceGetCount"))
    except Exception:
        return 0


def device_info(device: int = 0) -> tuple[str, tuple[int, int]]:
    """(GPU name, (compute capability major, minor)) of ``device``, without making a context."""
    drv = driver()
    check(drv.cuInit(0), "cuInit")
    dev = check(drv.cuDeviceGet(device), f"cuDeviceGet({device})")
    raw = check(drv.cuDeviceGetName(256, dev), "cuDeviceGetName")
    attr = drv.CUdevice_attribute
    cc = (
        check(drv.cuDeviceGetAttribute(getattr(attr, f"CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_{part}"), dev))
        for part in ("MAJOR", "MINOR")
    )
    major, minor = (int(v) for v in cc)
    return raw.split(b"\0", 1)[0].decode(errors="replace").strip(), (major, minor)


def gpu_available(device: int = 0) -> tuple[bool, str]:
    """Whether CUDA device ``device`` can be used here, and if not, why. The one such check in streamd (the
    engine choice, pytest skips and diagnostics all ask it)."""
    try:
        drv = driver()
        check(drv.cuInit(0), "cuInit")
        n = check(drv.cuDeviceGetCount(), "cuDeviceGetCount")
    except CUDAError as exc:
        return False, str(exc)
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}"
    if n <= device:
        return False, f"CUDA device {device} requested but {n} device(s) present"
    return True, ""


class Context:
    """The device's primary context (shared with PyNvVideoCodec, torch, ...), retained and made current.

    ``close()`` releases this retain; the driver destroys the context only when the last user releases it.
    Close buffers, streams and modules before the context.
    """

    def __init__(self, device: int = 0) -> None:
        drv = driver()
        check(drv.cuInit(0), "cuInit")
        self.ordinal = device
        self.device = check(drv.cuDeviceGet(device), "cuDeviceGet")
        self.handle = check(drv.cuDevicePrimaryCtxRetain(self.device), "cuDevicePrimaryCtxRetain")
        self._finalizer = weakref.finalize(self, _quiet, drv.cuDevicePrimaryCtxRelease, self.device)
        self.activate()

    def activate(self) -> None:
        """Make this context current in the calling thread (once per thread that uses CUDA)."""
        check(driver().cuCtxSetCurrent(self.handle), "cuCtxSetCurrent")
        _made_current.ctx = self

    def ensure_current(self) -> None:
        """``activate`` unless this thread already made this context current: for threads that run only
        this context's work (the pipeline's stage threads; torch and TensorRT use the same primary
        context), where a driver call per stage call was a measurable share of a batch-1 ring's GIL time."""
        if getattr(_made_current, "ctx", None) is not self:
            self.activate()

    def attribute(self, attr: str) -> int:
        """A device attribute by its short name, e.g. ``compute_capability_major``."""
        drv = driver()
        enum = getattr(drv.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{attr.upper()}")
        return int(check(drv.cuDeviceGetAttribute(enum, self.device), "cuDeviceGetAttribute"))

    @property
    def compute_capability(self) -> tuple[int, int]:
        return self.attribute("compute_capability_major"), self.attribute("compute_capability_minor")

    @property
    def name(self) -> str:
        raw = check(driver().cuDeviceGetName(256, self.device), "cuDeviceGetName")
        return raw.split(b"\0", 1)[0].decode()

    @property
    def driver_version(self) -> int:
        """The driver's CUDA version as an integer, e.g. 13000 for 13.0."""
        return int(check(driver().cuDriverGetVersion(), "cuDriverGetVersion"))

    def priority_range(self) -> tuple[int, int]:
        """(lowest, highest) stream priority; numerically lower is higher priority, e.g. (0, -5)."""
        least, greatest = check(driver().cuCtxGetStreamPriorityRange(), "cuCtxGetStreamPriorityRange")
        return int(least), int(greatest)

    def synchronize(self) -> None:
        check(driver().cuCtxSynchronize(), "cuCtxSynchronize")

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Stream:
    """A CUDA stream. ``priority`` is clamped to the device's range (lower number = higher priority)."""

    def __init__(self, ctx: Context, priority: int = 0, *, non_blocking: bool = True) -> None:
        drv = driver()
        least, greatest = ctx.priority_range()
        self.ctx = ctx
        self.priority = min(max(priority, greatest), least)
        flags = int(drv.CUstream_flags.CU_STREAM_NON_BLOCKING) if non_blocking else 0
        self._raw = check(drv.cuStreamCreateWithPriority(flags, self.priority), "cuStreamCreateWithPriority")
        self._handle = int(self._raw)
        self.borrowed = False
        self._finalizer = weakref.finalize(self, _quiet, drv.cuStreamDestroy, self._raw)

    @classmethod
    def borrow(cls, handle: int, ctx: Context | None = None) -> Stream:
        """Wrap a stream owned by someone else (``torch.cuda.Stream.cuda_stream``...); never destroyed.

        Needs no CUDA until a driver call uses it: an engine takes a borrowed stream and may hand only its
        ``handle`` to its library (torch, TensorRT, ONNX Runtime), or to a fake in the tests."""
        self = cls.__new__(cls)
        self.ctx = ctx  # type: ignore[assignment]
        self.priority = 0
        self._raw = None
        self._handle = int(handle)
        self.borrowed = True
        self._finalizer = weakref.finalize(self, _quiet, _nothing)  # borrowed: never destroyed by us
        return self

    @property
    def raw(self) -> Any:
        """The ``CUstream`` for driver calls."""
        if self._raw is None:
            self._raw = driver().CUstream(self._handle)
        return self._raw

    @property
    def handle(self) -> int:
        """The ``CUstream`` as an integer (for torch.cuda.ExternalStream, TensorRT, PyNvVideoCodec, ...)."""
        return self._handle

    def synchronize(self) -> None:
        check(driver().cuStreamSynchronize(self.raw), "cuStreamSynchronize")

    def wait(self, event: Event) -> None:
        """Make later work on this stream wait for ``event`` (no host blocking)."""
        check(driver().cuStreamWaitEvent(self.raw, event.raw, 0), "cuStreamWaitEvent")

    def record(self, event: Event | None = None) -> Event:
        """Record ``event`` (a new sync-only event if None) on this stream and return it."""
        event = event or Event()
        event.record(self)
        return event

    def close(self) -> None:
        self._finalizer()


class Event:
    """A CUDA event. Sync-only (``CU_EVENT_DISABLE_TIMING``) unless ``timing``; ``blocking`` makes host waits
    sleep instead of spin (``CU_EVENT_BLOCKING_SYNC``)."""

    def __init__(self, *, timing: bool = False, blocking: bool = False) -> None:
        drv = driver()
        flags = 0 if timing else int(drv.CUevent_flags.CU_EVENT_DISABLE_TIMING)
        if blocking:
            flags |= int(drv.CUevent_flags.CU_EVENT_BLOCKING_SYNC)
        self.timing = timing
        self.raw = check(drv.cuEventCreate(flags), "cuEventCreate")
        self._finalizer = weakref.finalize(self, _quiet, drv.cuEventDestroy, self.raw)

    def record(self, stream: Stream) -> None:
        check(driver().cuEventRecord(self.raw, stream.raw), "cuEventRecord")

    def synchronize(self) -> None:
        check(driver().cuEventSynchronize(self.raw), "cuEventSynchronize")

    def query(self) -> bool:
        """True when all work before the record has completed."""
        drv = driver()
        err = drv.cuEventQuery(self.raw)[0]
        if err == drv.CUresult.CUDA_ERROR_NOT_READY:
            return False
        check((err,), "cuEventQuery")
        return True

    def elapsed_ms(self, end: Event) -> float:
        """Milliseconds from this event to ``end`` (both timing events, both completed)."""
        return float(check(driver().cuEventElapsedTime(self.raw, end.raw), "cuEventElapsedTime"))

    def close(self) -> None:
        self._finalizer()


class DeviceBuffer:
    """``nbytes`` of device memory (``cuMemAlloc``); ``ptr`` is the device address as an int."""

    def __init__(self, nbytes: int) -> None:
        drv = driver()
        self.nbytes = int(nbytes)
        self.raw = check(drv.cuMemAlloc(max(self.nbytes, 1)), "cuMemAlloc")
        self.ptr = int(self.raw)
        self._finalizer = weakref.finalize(self, _quiet, drv.cuMemFree, self.raw)

    def upload(
        self, host: np.ndarray | PinnedBuffer, stream: Stream, *, offset: int = 0, nbytes: int | None = None
    ) -> None:
        """Copy host memory into this buffer at ``offset``, asynchronously on ``stream``.

        Pageable numpy memory is copied synchronously by the driver; pinned memory truly asynchronously
        (keep it unchanged until the stream has passed this point).
        """
        src, size = _host_span(host, nbytes)
        self._bounds(offset, size)
        check(driver().cuMemcpyHtoDAsync(self.ptr + offset, src, size, stream.raw), "cuMemcpyHtoDAsync")

    def download(
        self, host: np.ndarray | PinnedBuffer, stream: Stream, *, offset: int = 0, nbytes: int | None = None
    ) -> None:
        """Copy ``nbytes`` (default: the host buffer's size) from ``offset`` to host memory on ``stream``."""
        dst, size = _host_span(host, nbytes)
        self._bounds(offset, size)
        check(driver().cuMemcpyDtoHAsync(dst, self.ptr + offset, size, stream.raw), "cuMemcpyDtoHAsync")

    def fill_u8(self, value: int, stream: Stream, *, offset: int = 0, nbytes: int | None = None) -> None:
        size = self.nbytes - offset if nbytes is None else nbytes
        self._bounds(offset, size)
        check(driver().cuMemsetD8Async(self.ptr + offset, value & 0xFF, size, stream.raw), "cuMemsetD8Async")

    def fill_u32(self, value: int, stream: Stream, *, offset: int = 0, count: int | None = None) -> None:
        n = (self.nbytes - offset) // 4 if count is None else count
        self._bounds(offset, 4 * n)
        check(
            driver().cuMemsetD32Async(self.ptr + offset, value & 0xFFFFFFFF, n, stream.raw),
            "cuMemsetD32Async",
        )

    def _bounds(self, offset: int, size: int) -> None:
        if offset < 0 or size < 0 or offset + size > self.nbytes:
            raise ValueError(
                f"device buffer of {self.nbytes} bytes: range [{offset}, {offset + size}) is outside it"
            )

    def close(self) -> None:
        self._finalizer()


class PinnedBuffer:
    """``nbytes`` of page-locked host memory (``cuMemHostAlloc``) for truly asynchronous copies.

    ``array()`` returns numpy views; they do not keep the buffer alive, so keep the ``PinnedBuffer``.
    """

    def __init__(self, nbytes: int) -> None:
        drv = driver()
        self.nbytes = int(nbytes)
        self.ptr = int(check(drv.cuMemHostAlloc(max(self.nbytes, 1), 0), "cuMemHostAlloc"))
        self._finalizer = weakref.finalize(self, _quiet, drv.cuMemFreeHost, self.ptr)
        self._bytes = (ctypes.c_uint8 * max(self.nbytes, 1)).from_address(self.ptr)

    def array(
        self, dtype: Any = np.uint8, shape: tuple[int, ...] | int | None = None, offset: int = 0
    ) -> np.ndarray:
        """A numpy view (from ``offset``, ``shape`` elements of ``dtype``; default: the whole buffer)."""
        dt = np.dtype(dtype)
        count = (self.nbytes - offset) // dt.itemsize if shape is None else int(np.prod(shape))
        if offset + count * dt.itemsize > self.nbytes:
            raise ValueError(
                f"pinned buffer of {self.nbytes} bytes: view of {count} x {dt} at {offset} does not fit"
            )
        view = np.frombuffer(self._bytes, dtype=dt, count=count, offset=offset)  # type: ignore[call-overload]
        return view if shape is None else view.reshape(shape)

    def close(self) -> None:
        self._bytes = None  # type: ignore[assignment]
        self._finalizer()


def _host_span(host: np.ndarray | PinnedBuffer, nbytes: int | None) -> tuple[int, int]:
    if isinstance(host, PinnedBuffer):
        size = host.nbytes if nbytes is None else nbytes
        if size > host.nbytes:
            raise ValueError(f"copy of {size} bytes does not fit a pinned buffer of {host.nbytes} bytes")
        return host.ptr, size
    if not host.flags.c_contiguous:
        raise ValueError("host array must be C-contiguous")
    size = host.nbytes if nbytes is None else nbytes
    if size > host.nbytes:
        raise ValueError(f"copy of {size} bytes does not fit a host array of {host.nbytes} bytes")
    return host.ctypes.data, size


def copy_htod(dst: int, src: int, nbytes: int, stream: Stream) -> None:
    """Asynchronous host -> device copy between raw addresses (``src`` pinned for true asynchrony)."""
    check(driver().cuMemcpyHtoDAsync(dst, src, nbytes, stream.raw), "cuMemcpyHtoDAsync")


def copy_dtoh(dst: int, src: int, nbytes: int, stream: Stream) -> None:
    """Asynchronous device -> host copy between raw addresses (``dst`` pinned for true asynchrony)."""
    check(driver().cuMemcpyDtoHAsync(dst, src, nbytes, stream.raw), "cuMemcpyDtoHAsync")


def copy_dtod(dst: int, src: int, nbytes: int, stream: Stream) -> None:
    """Asynchronous device -> device copy between raw addresses."""
    check(driver().cuMemcpyDtoDAsync(dst, src, nbytes, stream.raw), "cuMemcpyDtoDAsync")


def device_pointer(obj: Any) -> int:
    """A device address from an int, a :class:`DeviceBuffer`, a torch tensor (``data_ptr()``) or anything
    with ``__cuda_array_interface__`` (CuPy, Numba)."""
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, DeviceBuffer):
        return obj.ptr
    if hasattr(obj, "data_ptr"):
        return int(obj.data_ptr())
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        return int(cai["data"][0])
    raise TypeError(f"expected a device pointer (int, DeviceBuffer, tensor), got {type(obj).__name__}")
