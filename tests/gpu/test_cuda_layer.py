"""The CUDA layer on the device: errors, primary context sharing, streams, events, buffers, kernel cache."""

from __future__ import annotations

import gc

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def test_errors_carry_the_cuda_error_name(ctx: object) -> None:
    from streamd.gpu.cuda import CUDAError, DeviceBuffer

    with pytest.raises(CUDAError, match="CUDA_ERROR_OUT_OF_MEMORY") as info:
        DeviceBuffer(1 << 52)
    assert info.value.name == "CUDA_ERROR_OUT_OF_MEMORY"
    assert "cuMemAlloc" in str(info.value)


def test_primary_context_is_shared(ctx: object) -> None:
    from streamd.gpu.cuda import Context, check, driver

    other = Context(0)
    assert int(other.handle) == int(ctx.handle)
    assert int(check(driver().cuCtxGetCurrent())) == int(ctx.handle)
    other.close()
    other.close()  # twice is fine; ctx still holds its retain
    ctx.activate()
    assert ctx.compute_capability >= (7, 5)
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        torch.zeros(1, device="cuda")
        assert int(check(driver().cuCtxGetCurrent())) == int(ctx.handle), "torch uses another context"


def test_stream_priorities_events_and_copies(ctx: object) -> None:
    from streamd.gpu.cuda import (
        CUDAError,
        DeviceBuffer,
        Event,
        PinnedBuffer,
        Stream,
        check,
        copy_dtod,
        driver,
    )

    least, greatest = ctx.priority_range()
    hi = Stream(ctx, priority=greatest - 10)  # clamped into the range
    lo = Stream(ctx, priority=least)
    assert check(driver().cuStreamGetPriority(hi.raw)) == greatest == hi.priority
    assert check(driver().cuStreamGetPriority(lo.raw)) == least

    n = 1 << 22
    data = np.random.default_rng(0).integers(0, 2**31, n, dtype=np.int32)
    src, back = PinnedBuffer(4 * n), PinnedBuffer(4 * n)
    src.array(np.int32)[:] = data
    a, b = DeviceBuffer(4 * n), DeviceBuffer(4 * n)
    start, end = Event(timing=True), Event(timing=True)
    start.record(hi)
    a.upload(src, hi)
    uploaded = hi.record()
    lo.wait(uploaded)  # lo's copy starts only after hi's upload
    copy_dtod(b.ptr, a.ptr, 4 * n, lo)
    b.download(back, lo)
    done = lo.record(Event(blocking=True))
    hi.wait(done)
    end.record(hi)
    done.synchronize()
    end.synchronize()
    assert done.query() and np.array_equal(back.array(np.int32), data)
    assert start.elapsed_ms(end) > 0
    with pytest.raises(CUDAError):  # sync-only events have no timing
        uploaded.elapsed_ms(done)
    for obj in (a, b, src, back, hi, lo, start, end, uploaded, done):
        obj.close()
        obj.close()


def test_borrowed_stream_is_not_destroyed(ctx: object) -> None:
    from streamd.gpu.cuda import DeviceBuffer, Stream

    owner = Stream(ctx)
    borrowed = Stream.borrow(owner.handle, ctx)
    assert borrowed.handle == owner.handle and borrowed.borrowed
    borrowed.close()
    del borrowed
    gc.collect()
    buf = DeviceBuffer(1024)
    buf.fill_u32(7, owner)  # the owner's stream still works
    owner.synchronize()
    buf.close()
    owner.close()


def test_buffers_released_without_close(ctx: object) -> None:
    from streamd.gpu.cuda import DeviceBuffer, PinnedBuffer, check, driver

    free0, _ = check(driver().cuMemGetInfo())
    bufs = [DeviceBuffer(64 << 20) for _ in range(8)]
    pinned = [PinnedBuffer(8 << 20) for _ in range(4)]
    del bufs, pinned
    gc.collect()
    free1, _ = check(driver().cuMemGetInfo())
    assert free1 >= free0 - (64 << 20), "finalizers did not free device memory"


def test_kernel_cache_second_start_loads_cubin(ctx: object, tmp_path: object) -> None:
    from streamd.gpu.kernels import KernelLoader

    first = KernelLoader(ctx, cache_dir=tmp_path)
    m1 = first.module("postprocess")
    assert m1.info.how == "compiled" and m1.info.path is not None and m1.info.path.exists()
    first.close()
    second = KernelLoader(ctx, cache_dir=tmp_path)
    m2 = second.module("postprocess")
    assert m2.info.how == "cache" and m2.info.path == m1.info.path
    assert m2.info.seconds < m1.info.seconds
    m2.kernel("nms_select")
    second.close()
    m1.info.path.write_bytes(b"garbage")  # a corrupt entry is recompiled, not fatal
    third = KernelLoader(ctx, cache_dir=tmp_path)
    assert third.module("postprocess").info.how == "compiled"
    third.close()


def test_compile_errors_show_the_nvrtc_log(ctx: object, tmp_path: object) -> None:
    from streamd.gpu.kernels import KernelCompileError, KernelLoader

    (tmp_path / "broken.cu").write_text('extern "C" __global__ void k(int* p) { p[0] = undeclared_name; }\n')
    loader = KernelLoader(ctx, kernel_dir=tmp_path, cache_dir=tmp_path / "cache")
    with pytest.raises(KernelCompileError, match="undeclared_name") as info:
        loader.module("broken")
    assert "broken.cu" in info.value.log
    loader.close()


def test_closing_the_context_last_is_clean(ctx: object) -> None:
    """Objects outliving their Context's close() release quietly (``ctx`` still retains the context)."""
    from streamd.gpu.cuda import Context, DeviceBuffer, Stream

    local = Context(0)
    s = Stream(local)
    buf = DeviceBuffer(1 << 20)
    local.close()
    buf.close()
    s.close()
    ctx.activate()
