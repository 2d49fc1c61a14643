"""NVDEC (our NvdecDecoder on our demuxer) against the CPU decoder, on the real clips. Needs a GPU.

Skipped cleanly without PyNvVideoCodec or a CUDA device. The reference is the CPU twin: ``CpuDecoder`` where
PyAV is installed; on the GPU box (no PyAV) OpenCV's FFmpeg software decoder with ``CAP_PROP_CONVERT_RGB=0``,
whose Y plane is bit-identical to ``CpuDecoder``'s (checked on every CI run by
``tests/decode/test_cpu_decoder.py::test_opencv_luma_reference_equals_cpu_decoder``).

Bound: PSNR >= 40 dB on Y per frame. H.264 and HEVC decoding is bit-exact by specification, so the expected
result is identical pixels (PSNR reported as inf); 40 dB leaves room only for a non-conformant decoder.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

from streamd.decode.nvdec import nvdec_available

ROOT = Path(__file__).resolve().parents[3]
CLIPS = {
    "h264": ROOT / "samples" / "vtest.mp4",
    "hevc": ROOT / "samples" / "vtest-hevc.mp4",
}
SIZE_PARTS = [ROOT / "tests" / "decode" / "data" / n for n in ("size-320x240.ts", "size-640x360.ts")]
MIN_PSNR_DB = 40.0

_ok, _why = nvdec_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _ok, reason=f"no NVDEC here: {_why}")]


def reference_luma(path: Path) -> list[np.ndarray]:
    """Y planes of every frame, in display order, from the CPU twin."""
    if importlib.util.find_spec("av") is not None:
        from streamd.decode.cpu import CpuDecoder
        from streamd.sources import demuxer_class

        dmx = demuxer_class("pyav")(str(path), annexb=True)
        dec = CpuDecoder(dmx.info, keep_luma=True)
        out = [p.luma for pkt in dmx.packets() for p in dec.decode(pkt)] + [p.luma for p in dec.flush()]
        dmx.close()
        return out
    import cv2

    cap = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG, [cv2.CAP_PROP_CONVERT_RGB, 0])
    out = []
    while True:
        ok, y = cap.read()
        if not ok:
            break
        out.append(y.copy())
    return out


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def nvdec_frames(path: Path, *, hold: bool = False, demux: str = "opencv", **options):
    """Decode with our demuxer + NvdecDecoder; returns (decoder, pictures). Surfaces are held if ``hold``."""
    from streamd.decode.nvdec import NvdecDecoder
    from streamd.sources import demuxer_class

    dmx = demuxer_class(demux)(str(path), annexb=True)
    dec = NvdecDecoder(dmx.info, **options)
    pics = [p for pkt in dmx.packets() for p in dec.decode(pkt)] + dec.flush()
    dmx.close()
    return dec, pics


@pytest.mark.parametrize("clip", ["h264", "hevc"])
def test_nvdec_equals_cpu_decoder(clip: str) -> None:
    from streamd.decode.nvdec import download_nv12

    ref = reference_luma(CLIPS[clip])
    # Hold every surface until the end: proves the pooled copies outlive PyNvVideoCodec's buffer recycling.
    dec, pics = nvdec_frames(CLIPS[clip], pool_size=len(ref) + 4)
    assert len(pics) == len(ref), f"{clip}: NVDEC gave {len(pics)} frames, CPU {len(ref)}"
    values = []
    for i, (pic, y_ref) in enumerate(zip(pics, ref, strict=True)):
        nv12 = download_nv12(pic.surface)
        assert nv12.shape == (pic.height * 3 // 2, pic.width)
        values.append(psnr(nv12[: pic.height], y_ref))
        assert values[-1] >= MIN_PSNR_DB, f"{clip} frame {i}: PSNR {values[-1]:.1f} dB"
        pic.surface.release()
    pts = [p.pts for p in pics]
    assert pts == sorted(pts) and pts[1] - pts[0] == pytest.approx(0.1, abs=1e-3)
    finite = [v for v in values if math.isfinite(v)]
    print(
        f"{clip}: {len(values)} frames, identical {len(values) - len(finite)}, "
        f"min PSNR {min(values):.2f} dB; source memory {dec.source_memory}; pool {dec.pool.size}"
    )
    dec.close()


def test_no_host_memory_on_the_decode_path() -> None:
    """PyNvVideoCodec's output and our pooled surfaces are device memory: the copy between them is D2D."""
    from streamd.gpu import cuda

    ctx = cuda.Context(0)  # the consumer's own retain of the primary context, like the pipeline's
    consumer = cuda.Stream(ctx)
    dec, pics = nvdec_frames(CLIPS["hevc"], pool_size=128)
    assert dec.source_memory == "device"
    for p in pics[:8]:
        assert dec._gpu.memory_type(p.surface.luma_ptr) == "device"
        assert dec._gpu.memory_type(p.surface.chroma_ptr) == "device"
    # Read on a consumer stream: it waits for `ready`; the pool waits for `consumed` (no host sync).
    dec.close()  # surfaces held downstream stay valid after the decoder is closed
    for p in pics:
        p.surface.wait(consumer)
        p.surface.release(consumer)
    consumer.synchronize()
    consumer.close()
    ctx.close()


def test_resolution_change_mid_stream(tmp_path: Path) -> None:
    """320x240 then 640x360 in one MPEG-TS stream: every frame decoded, equal to the CPU decoder.

    The reference decodes the two parts separately (OpenCV's YUV output does not follow a size change).
    """
    from streamd.decode.nvdec import download_nv12

    joined = tmp_path / "size-change.ts"
    joined.write_bytes(b"".join(p.read_bytes() for p in SIZE_PARTS))
    ref = [y for part in SIZE_PARTS for y in reference_luma(part)]
    # The test holds every picture until the end, so the pool must hold them all (with 8 the decoder waits
    # for a free buffer, then drops the picture and counts it: designed back-pressure, not a decode error).
    dec, pics = nvdec_frames(joined, pool_size=len(ref) + 4)
    assert dec.dropped == 0
    assert [(p.width, p.height) for p in pics] == [(y.shape[1], y.shape[0]) for y in ref]
    for i, (pic, y_ref) in enumerate(zip(pics, ref, strict=True)):
        y = download_nv12(pic.surface)[: pic.height]
        assert psnr(y, y_ref) >= MIN_PSNR_DB, f"frame {i} ({pic.width}x{pic.height})"
        pic.surface.release()
    print(f"size change: {len(pics)} frames, recreated {dec.recreated}x")
    dec.close()
