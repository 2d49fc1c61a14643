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

    def event(self) -> object:
        return object()

    def record(self, event: object, stream: Any = None) -> None:
        self.calls.append(("record", stream))

    def wait(self, event: object, stream: Any = None) -> None:
        self.calls.append(("wait", stream))


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
