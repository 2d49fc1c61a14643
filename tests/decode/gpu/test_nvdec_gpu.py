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

from streamd.ingest.decode.nvdec import nvdec_available

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
        from streamd.ingest.decode.cpu import CpuDecoder
        from streamd.ingest.sources import DemuxOptions, demuxer_class

        dmx = demuxer_class("pyav")(str(path), DemuxOptions(annexb=True))
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
    from streamd.ingest.decode.nvdec import NvdecDecoder
    from streamd.ingest.sources import DemuxOptions, demuxer_class

    dmx = demuxer_class(demux)(str(path), DemuxOptions(annexb=True))
    dec = NvdecDecoder(dmx.info, **options)
    pics = [p for pkt in dmx.packets() for p in dec.decode(pkt)] + dec.flush()
    dmx.close()
    return dec, pics


@pytest.mark.parametrize("clip", ["h264", "hevc"])
def test_nvdec_equals_cpu_decoder(clip: str) -> None:
    from streamd.ingest.decode.nvdec import download_nv12

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


@pytest.mark.parametrize("clip", ["h264", "hevc"])
def test_deferred_copies_equal_the_cpu_decoder(clip: str) -> None:
    """``defer_copy`` (streams with detect_fps): every third picture taken at once, every third released
    uncopied, every third left undecided until after the next Decode() (the decoder copies it first); every
    picture taken equals the CPU decoder's, held to the end like the test above."""
    from streamd.ingest.decode.nvdec import NvdecDecoder, download_nv12
    from streamd.ingest.sources import DemuxOptions, demuxer_class

    ref = reference_luma(CLIPS[clip])
    dmx = demuxer_class("opencv")(str(CLIPS[clip]), DemuxOptions(annexb=True))
    dec = NvdecDecoder(dmx.info, pool_size=len(ref) + 4, defer_copy=True)
    taken: dict[int, object] = {}
    undecided: list[tuple[int, object]] = []
    n = 0

    def decide(pictures) -> None:
        nonlocal n
        for late_index, late in undecided:  # the call that gave these is over: the decoder copied them
            taken[late_index] = late.deferred.take()
        undecided.clear()
        for pic in pictures:
            assert pic.surface is None and pic.deferred is not None
            if n % 3 == 0:
                taken[n] = pic.deferred.take()
            elif n % 3 == 1:
                pic.deferred.release()
            else:
                undecided.append((n, pic))
            n += 1

    for pkt in dmx.packets():
        decide(dec.decode(pkt))
    decide(dec.flush())
    decide([])
    dmx.close()
    assert n == len(ref) and dec.dropped == 0
    for i, lease in sorted(taken.items()):
        assert lease is not None
        value = psnr(download_nv12(lease)[: lease.height], ref[i])
        assert value >= MIN_PSNR_DB, f"{clip} frame {i}: PSNR {value:.1f} dB"
        lease.release()
    assert sorted(taken) == [i for i in range(len(ref)) if i % 3 != 1]
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
    from streamd.ingest.decode.nvdec import download_nv12

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


# --- low delay for live streams, one decoder across passes --------------------------------------------
# ipp-*.ts: the first 60 frames of samples/vtest.mp4 scaled to 640x360 / 1920x1080, 30 fps, H.264 without
# B-frames (x264 veryfast, bframes=0, keyint 30; crf 26 / 30), in MPEG-TS, made with PyAV's libx264 (like a
# camera). The box has no encoder, so they are committed (105 KB / 262 KB).
IPP = {
    "640x360": ROOT / "tests" / "decode" / "data" / "ipp-640x360.ts",
    "1920x1080": ROOT / "tests" / "decode" / "data" / "ipp-1920x1080.ts",
}
LOW_DELAY_P99_MS = 10.0  # a live 1080p30 picture within 10 ms of its packet (p99, whole pipeline)


def test_decoder_kept_across_passes_and_every_picture_delivered() -> None:
    """A looping file / reconnecting camera: flush (ENDOFSTREAM) at the end of each pass delivers every
    picture, and the same PyNvVideoCodec decoder decodes the next pass (no teardown, no creation)."""
    from streamd.ingest.decode.nvdec import NvdecDecoder, download_nv12
    from streamd.ingest.sources import DemuxOptions, demuxer_class

    ref = reference_luma(CLIPS["hevc"])
    dec = None
    for n in range(3):
        dmx = demuxer_class("opencv")(str(CLIPS["hevc"]), DemuxOptions(annexb=True))
        if dec is None:
            dec = NvdecDecoder(dmx.info, pool_size=16)
        else:
            assert dec.restart(dmx.info), "same format: the decoder must be kept"
        got = []

        def pictures(dmx=dmx, dec=dec):  # consume each picture before decoding more (the pool is 16 deep)
            for pkt in dmx.packets():
                yield from dec.decode(pkt)
            yield from dec.flush()

        for pic in pictures():
            got.append((pic.pts, download_nv12(pic.surface)[: pic.height]))
            pic.surface.release()
        dmx.close()
        assert len(got) == len(ref), f"pass {n}: {len(got)} of {len(ref)} pictures"
        assert [round(p, 3) for p, _ in got] == [round(k * 0.1, 3) for k in range(len(ref))]
        worst = min(psnr(y, r) for (_, y), r in zip(got, ref, strict=True))
        assert worst >= MIN_PSNR_DB, f"pass {n}: min PSNR {worst:.1f} dB"
    assert dec is not None and dec.created == 1, f"{dec.created} PyNvVideoCodec decoders for 3 passes"
    print(f"3 passes x {len(ref)} pictures, one decoder (created {dec.created})")
    dec.close()


@pytest.mark.parametrize("size", sorted(IPP))
def test_low_delay_gives_each_picture_from_its_own_packet(size: str) -> None:
    """Live stream without B-frames: DisplayDecodeLatencyType.LOW + ENDOFPICTURE, so every Decode() returns
    the picture of the packet it was given (zero display delay); the default mode holds pictures back."""
    import time

    from streamd.ingest.decode.nvdec import NvdecDecoder, download_nv12
    from streamd.ingest.sources import DemuxOptions, demuxer_class

    ref = reference_luma(IPP[size])
    dmx = demuxer_class("opencv")(str(IPP[size]), DemuxOptions(annexb=True))
    packets = list(dmx.packets())
    dmx.close()
    assert len(packets) == len(ref) == 60
    dec = NvdecDecoder(dmx.info, low_delay=True, pool_size=8)
    assert dec.latency == "low"
    took_ms = []
    for i, pkt in enumerate(packets):
        t0 = time.perf_counter()
        pics = dec.decode(pkt)
        if pics:
            pics[0].surface.ready.synchronize()  # the pixels are there, not only enqueued
        took_ms.append((time.perf_counter() - t0) * 1e3)
        assert len(pics) == 1, f"{size} packet {i}: {len(pics)} pictures (zero delay expected)"
        assert pics[0].pts == pytest.approx(pkt.pts * dmx.info.time_base, abs=1e-6)
        assert psnr(download_nv12(pics[0].surface)[: pics[0].height], ref[i]) >= MIN_PSNR_DB, f"{size} {i}"
        pics[0].surface.release()
    assert dec.flush() == []
    dec.close()
    native = NvdecDecoder(dmx.info, low_delay=False, pool_size=80)
    held = [len(native.decode(p)) for p in packets]
    rest = native.flush()
    assert native.latency == "native" and sum(held) + len(rest) == 60
    native.close()
    p99 = float(np.percentile(took_ms[5:], 99))
    print(
        f"{size}: low delay: picture out of the Decode() of its own packet, decode+copy p50 "
        f"{np.median(took_ms[5:]):.2f} ms p99 {p99:.2f} ms; native mode: first picture after packet "
        f"{next(i for i, n in enumerate(held) if n) + 1}"
    )
    assert p99 <= LOW_DELAY_P99_MS


def test_looping_stream_creates_one_decoder_and_loses_no_frame() -> None:
    """A file loop pass must not tear down / create an NVDEC decoder (that held the GIL and stalled
    every other stream). StreamReader on a looping clip: 5 passes, one decoder, frames and pts continuous."""
    import threading
    import time

    from streamd.config.streams import StreamConfig
    from streamd.ingest.reader import StreamReader
    from streamd.pipeline.batcher import Batcher

    batcher = Batcher(8, 0.005)
    queue = batcher.add_stream("loop", 4, "block")
    stop = threading.Event()
    cfg = StreamConfig(id="loop", url=str(IPP["640x360"]), loop=True)
    worker = StreamReader(
        cfg, queue, stop, decoder="nvdec", demux="opencv", decoder_options={"pool_size": 24}
    )
    worker.start()
    frames: list[tuple[int, float | None, float]] = []
    deadline = time.monotonic() + 60
    while len(frames) < 300 and time.monotonic() < deadline:
        batch = batcher.next_batch(stop) or []
        for f in batch:
            frames.append((f.index, f.pts, time.perf_counter()))
            f.surface.release()
    decoder = worker.slot.decoder
    stop.set()
    assert worker.join(10)
    assert worker.stats.decoder == "nvdec" and len(frames) >= 300, worker.stats
    assert [f[0] for f in frames] == list(range(len(frames)))
    steps = np.diff([f[1] for f in frames])
    assert np.allclose(steps, 1 / 30, atol=1e-3), steps[np.abs(steps - 1 / 30) > 1e-3]
    assert worker.stats.decoders_created == 1 and decoder is not None and decoder.created == 1, worker.stats
    gaps = np.diff([f[2] for f in frames]) * 1e3
    boundary = [gaps[k - 1] for k in range(60, len(frames), 60)]
    print(
        f"{len(frames)} frames over {worker.stats.opens} passes, one decoder; inter-frame gap p50 "
        f"{np.median(gaps):.2f} ms, at the pass boundaries max {max(boundary):.2f} ms"
    )
