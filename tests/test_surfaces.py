"""One NV12 type: the decoder's lease exposes its pixels as ``streamd.types.Nv12Surface`` (no GPU needed)."""

from __future__ import annotations

from typing import Any

from streamd.ingest.decode.pool import Nv12Lease, SurfacePool
from streamd.ingest.sources.base import VideoInfo
from streamd.types import Nv12Surface, SurfaceLease


class _Buf:
    def __init__(self, nbytes: int) -> None:
        self.ptr = 0x7000_0000
        self.nbytes = nbytes

    def close(self) -> None:
        pass


class _FakeGpu:
    """The part of streamd.gpu.decoder_io.DecoderGpu the pool and the lease use."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def alloc(self, nbytes: int) -> _Buf:
        return _Buf(nbytes)

    def event(self) -> _Buf:  # an object with close(), as the events are
        return _Buf(0)

    def record(self, event: object, stream: Any = None) -> None:
        self.calls.append(("record", stream))

    def wait(self, event: object, stream: Any = None) -> None:
        self.calls.append(("wait", stream))

    def synchronize(self, event: object) -> None:
        self.calls.append(("synchronize", None))

    def forget(self, ptr: int) -> None:
        pass


def test_the_lease_exposes_its_pixels_as_the_one_nv12_type() -> None:
    gpu = _FakeGpu()
    pool = SurfacePool(gpu, 2)
    slot = pool.acquire(1920, 1080, 2048, timeout_s=1.0)
    assert slot is not None
    info = VideoInfo("h264", 1920, 1080, 30.0, 1 / 90000, color_matrix="bt709")
    lease = Nv12Lease(slot, pool, gpu, info, device=0)
    assert isinstance(lease, SurfaceLease)
    assert lease.planes == Nv12Surface(
        0x7000_0000, 0x7000_0000 + 2048 * 1080, 1920, 1080, 2048, 2048, "bt709"
    )
    lease.wait("s1")
    lease.release("s1")
    assert lease.released and ("wait", "s1") in gpu.calls


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_burst_does_not_keep_its_buffers_for_ever() -> None:
    """After a burst of 10 held at once, a stream holding 1 at a time keeps its pool at 10 for two trim
    windows (the burst may come back), then frees all but 1 held + TRIM_SPARE; a new burst grows it again;
    a held buffer is never freed."""
    gpu, clock = _FakeGpu(), _Clock()
    pool = SurfacePool(gpu, 32, clock=clock)
    burst = [pool.acquire(1920, 1080, 2048, timeout_s=0) for _ in range(10)]
    for slot in burst:
        pool.release(slot)
    sizes = []
    for _ in range(3 * 30):  # 1 s per frame, one buffer held at a time
        clock.t += 1.0
        slot = pool.acquire(1920, 1080, 2048, timeout_s=0)
        pool.release(slot)
        sizes.append(pool.size)
    assert sizes[0] == 10 and sizes[58] == 10  # windows 1 and 2: the burst's peak still counts
    assert pool.size == 1 + SurfacePool.TRIM_SPARE and pool.trimmed == 10 - pool.size
    held = [pool.acquire(1920, 1080, 2048, timeout_s=0) for _ in range(8)]  # a new burst: allocated again
    assert all(h is not None for h in held) and pool.size == 8
    clock.t += 200.0
    pool.release(held.pop())  # a trim now frees free buffers only: the 7 held stay
    assert pool.size >= 7
