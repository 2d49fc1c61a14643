"""The CPU decoder on both demux backends, and the NVDEC decoder's control flow with a stand-in GPU.

The real NVDEC comparison is ``tests/decode/gpu/test_nvdec_gpu.py`` (needs a GPU).
"""

from __future__ import annotations

import ctypes
import gc
import logging
import subprocess
import sys
import weakref
from fractions import Fraction
from types import SimpleNamespace

import cv2
import numpy as np
import pytest

from streamd.ingest.decode import DecodeError, close_later, create_decoder, wait_closed
from streamd.ingest.decode.cpu import CpuDecoder
from streamd.ingest.sources import DemuxOptions, Packet, available_backends, demuxer_class
from streamd.ingest.sources.base import VideoInfo
from tests.sources.conftest import CLIP, CLIP_HEVC


def decode_all(clip, backend: str, annexb: bool, **kw):
    dmx = demuxer_class(backend)(str(clip), DemuxOptions(annexb=annexb))
    dec = CpuDecoder(dmx.info, **kw)
    pics = [p for pkt in dmx.packets() for p in dec.decode(pkt)] + dec.flush()
    dmx.close()
    return pics


@pytest.mark.parametrize(("clip", "count"), [(CLIP, 795), (CLIP_HEVC, 100)])
def test_every_demux_path_gives_identical_pictures(clip, count) -> None:
    runs = {
        (b, a): decode_all(clip, b, a, keep_luma=True) for b in available_backends() for a in (False, True)
    }
    ref = runs[next(iter(runs))]
    assert len(ref) == count
    assert ref[0].image.shape == (576, 768, 3) and ref[0].image.dtype == np.uint8
    assert [round(p.pts, 3) for p in ref] == [round(i * 0.1, 3) for i in range(count)]
    for key, pics in runs.items():
        assert len(pics) == count, key
        assert all(np.array_equal(a.image, b.image) for a, b in zip(ref, pics, strict=True)), key


@pytest.mark.parametrize("clip", [CLIP, CLIP_HEVC])
def test_opencv_luma_reference_equals_cpu_decoder(clip) -> None:
    """The GPU test's reference where PyAV is missing: OpenCV with CONVERT_RGB=0 returns the Y plane, and it
    is bit-identical to CpuDecoder's."""
    cap = cv2.VideoCapture(str(clip), cv2.CAP_FFMPEG, [cv2.CAP_PROP_CONVERT_RGB, 0])
    ys = []
    while (got := cap.read())[0]:
        ys.append(got[1].copy())
    lumas = [p.luma for p in decode_all(clip, "pyav", False, keep_luma=True)]
    assert len(ys) == len(lumas)
    assert all(np.array_equal(a, b) for a, b in zip(ys, lumas, strict=True))


@pytest.mark.parametrize("annexb", [False, True])
def test_corrupt_packet_is_skipped_and_counted_and_the_decoder_goes_on(annexb: bool) -> None:
    """2000 random bytes inside an H.264 slice: FFmpeg conceals it and flags the picture corrupt; we skip
    and count it. (FFmpeg's HEVC decoder does not flag such damage; NVDEC reports none either.)"""
    dmx = demuxer_class("pyav")(str(CLIP), DemuxOptions(annexb=annexb))
    packets = list(dmx.packets())[:40]
    damaged = packets[3].view().copy()
    damaged[7000:9000] = np.random.default_rng(3).integers(0, 256, 2000, dtype=np.uint8)
    packets[3] = Packet(damaged, packets[3].pts)
    dec = CpuDecoder(dmx.info)
    out, errors = [], 0
    for p in packets:
        try:
            out += dec.decode(p)
        except DecodeError:
            errors += 1
    out += dec.flush()
    assert errors + dec.skipped >= 1  # noticed
    last = max(p.pts for p in packets) * dmx.info.time_base
    assert len(out) + dec.skipped + errors >= 40 and out[-1].pts == pytest.approx(last)  # and went on


def test_unknown_codec_and_decoder_names() -> None:
    with pytest.raises(DecodeError):
        CpuDecoder(VideoInfo("no-such-codec", 1, 1, None, 0.1))
    with pytest.raises(ValueError, match="cpu, nvdec"):
        create_decoder("quantum", VideoInfo("h264", 1, 1, None, 0.1))


def test_importing_streamd_needs_no_gpu_packages() -> None:
    code = (
        "import sys, streamd, streamd.ingest.decode.nvdec, streamd.ingest.reader\n"
        "import streamd.ingest.sources.opencv\n"
        "gpu = ('PyNvVideoCodec', 'cuda', 'cuda.bindings', 'torch', 'tensorrt')\n"
        "bad = [m for m in gpu if m in sys.modules]\n"
        "assert not bad, bad\n"
        "from streamd.ingest.decode.nvdec import nvdec_available\n"
        "ok, why = nvdec_available(); assert not ok and why, why\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# --- NVDEC control flow with a stand-in GPU and PyNvVideoCodec --------------------------------------------


class FakeEvent:
    def __init__(self, log):
        self.log, self.closed = log, False

    def record(self, stream):
        self.log.append(("record", id(self), stream))

    def synchronize(self):
        self.log.append(("sync", id(self)))

    def close(self):
        self.closed = True


class FakeGpu:
    device, context_handle, stream_handle = 0, 111, 222

    def __init__(self):
        self.log: list = []
        self._next = 0x1000_0000
        self.freed: list[int] = []

    def event(self):
        return FakeEvent(self.log)

    def alloc(self, nbytes):
        ptr, self._next = self._next, self._next + nbytes + 0x1000
        gpu = self
        return SimpleNamespace(ptr=ptr, nbytes=nbytes, close=lambda: gpu.freed.append(ptr))

    def record(self, event, stream=None):
        self.log.append(("record", id(event), stream or "ours"))

    def wait(self, event, stream=None):
        self.log.append(("wait", id(event), stream or "ours"))

    def synchronize(self, event):
        self.log.append(("sync", id(event)))

    def copy_linear(self, dst, src, nbytes):
        self.log.append(("copy", dst, src, nbytes))

    def copy_plane(self, *args):
        self.log.append(("copy2d", *args))

    def forget(self, dst):
        pass

    def memory_type(self, ptr):
        return "device"

    def close_stream(self):
        self.log.append(("close_stream",))

    def release_context(self):
        self.log.append(("release_context",))


class FakeFrame:
    shape = (72, 64)  # NV12: (H * 3 / 2, W)

    def __init__(self, pts, ptr):
        self.pts, self.ptr = pts, ptr

    def GetPtrToPlane(self, i):
        return self.ptr

    def getPTS(self):
        return self.pts


class FakeNvDecoder:
    """Outputs each packet's picture one call later (a reorder delay); fails on packets starting b'BAD'."""

    def __init__(self, nvc, kw):
        self.nvc, self.kw, self.pending, self.fed = nvc, kw, [], []

    def GetWidth(self):
        return 64

    def GetHeight(self):
        return 48

    def Decode(self, pd):
        data = ctypes.string_at(pd.bsl_data, pd.bsl) if pd.bsl else b""
        self.fed.append((data, pd.pts, pd.decode_flag))
        if data.startswith(b"BAD"):
            raise RuntimeError("bitstream error")
        if b"FULL" in data:  # PyNvVideoCodec 2.2.4's text when the GPU holds no more decoders (H200)
            raise RuntimeError(
                "HandleVideoSequence : \nError code : 2\nError Type : m_api.cuvidCreateDecoder(&m_hDecoder, "
                "&videoDecodeCreateInfo) returned error 2\nat NvDecoder.cpp:430\n"
            )
        if pd.decode_flag == self.nvc.VideoPacketFlag.ENDOFSTREAM:
            out, self.pending = self.pending, []
            return out
        out, self.pending = self.pending, [FakeFrame(pd.pts, 0xD000_0000 + len(self.fed))]
        return out


class FakeNvc:
    cudaVideoCodec = SimpleNamespace(H264="H264", HEVC="HEVC")
    VideoPacketFlag = SimpleNamespace(ENDOFPICTURE=1, ENDOFSTREAM=2)
    DisplayDecodeLatencyType = SimpleNamespace(NATIVE="NATIVE", LOW="LOW", ZERO="ZERO")

    class PacketData:
        def __init__(self):
            self.bsl_data, self.bsl, self.pts, self.decode_flag = 0, 0, 0, 0

    def __init__(self):
        self.decoders: list[FakeNvDecoder] = []

    def CreateDecoder(self, **kw):
        dec = FakeNvDecoder(self, kw)
        self.decoders.append(_Tracked(dec))
        return dec


class _Tracked:
    """What the test keeps of a fake decoder: its calls, and whether the decoder itself was dropped."""

    def __init__(self, dec: FakeNvDecoder) -> None:
        self.kw, self.fed, self._ref = dec.kw, dec.fed, weakref.ref(dec)

    @property
    def released(self) -> bool:
        gc.collect()
        return self._ref() is None


INFO = VideoInfo("h264", 64, 48, 10.0, 0.01, extradata=b"\x00\x00\x00\x01gSPS", annexb=True)


def make_nvdec(**kw):
    from streamd.ingest.decode.nvdec import NvdecDecoder

    gpu, nvc = FakeGpu(), FakeNvc()
    return NvdecDecoder(INFO, gpu=gpu, nvc=nvc, **kw), gpu, nvc


def pkt(data: bytes, pts: int) -> Packet:
    return Packet(np.frombuffer(data, np.uint8), pts)


def test_nvdec_feeds_our_packets_on_our_context_and_copies_each_picture() -> None:
    dec, gpu, nvc = make_nvdec()
    kw = nvc.decoders[0].kw
    assert kw["usedevicememory"] is True and (kw["cudacontext"], kw["cudastream"]) == (111, 222)
    assert (kw["maxwidth"], kw["maxheight"]) == (1920, 1088)
    assert dec.decode(pkt(b"\x00\x00\x00\x01e-IDR", 0)) == []
    pics = dec.decode(pkt(b"\x00\x00\x00\x01A-P", 10)) + dec.flush()
    fed = nvc.decoders[0].fed
    assert fed[0][0] == b"\x00\x00\x00\x01gSPS\x00\x00\x00\x01e-IDR"  # parameter sets once, in front
    assert fed[1][0] == b"\x00\x00\x00\x01A-P" and fed[1][1] == 10 and fed[2][2] == 2
    assert [p.pts for p in pics] == [0.0, 0.1]
    s = pics[0].surface
    assert (s.width, s.height, s.pitch) == (64, 48, 64) and s.chroma_ptr == s.luma_ptr + 64 * 48
    copies = [e for e in gpu.log if e[0] == "copy"]
    assert copies[0][1:] == (s.luma_ptr, 0xD000_0000 + 1, 64 * 48 * 3 // 2)  # D2D, Y+UV in one go
    ready = gpu.log.index(("record", id(s.ready), "ours"))
    assert gpu.log.index(copies[0]) < ready  # event after the copy


def test_surfaces_return_to_the_pool_after_the_consumer_stream() -> None:
    dec, gpu, _ = make_nvdec(pool_size=2, acquire_timeout_s=0.05)
    pics = [p for i in range(4) for p in dec.decode(pkt(b"\x00\x00\x01x", i))]
    assert len(pics) == 2 and dec.dropped == 1 and dec.pool.size == 2  # all held: third picture dropped
    first = pics[0].surface
    first.release("consumer-stream")
    first.release("consumer-stream")  # twice is harmless
    assert first.released and dec.pool.free == 1
    consumed = next(e for e in gpu.log if e[0] == "record" and e[2] == "consumer-stream")
    pics += dec.decode(pkt(b"\x00\x00\x01x", 9))
    assert ("wait", consumed[1], "ours") in gpu.log  # the next copy into it waits for the consumer
    del pics[1]
    gc.collect()
    assert dec.pool.free == 1  # dropped unread (e.g. by the stream queue): back at once
    dec.close()
    assert ("close_stream",) in gpu.log and ("release_context",) not in gpu.log  # a surface is still held
    pics[-1].surface.release()
    assert gpu.log[-1] == ("release_context",) and len(gpu.freed) == 2  # last buffer gone, then the context


def _logged_decode(dec, gpu) -> None:
    """Put each Decode() call of the fake PyNvVideoCodec decoder into the GPU log (order against copies)."""
    inner = dec._dec.Decode

    def decode(pd):
        gpu.log.append(("Decode",))
        return inner(pd)

    dec._dec.Decode = decode


def test_deferred_pictures_are_copied_only_when_taken() -> None:
    """detect_fps: a picture the stream skips is released uncopied; one it keeps is copied when taken; one
    still undecided at the next Decode() (a picture the timeline holds back) is copied before that call."""
    dec, gpu, _ = make_nvdec(defer_copy=True)
    _logged_decode(dec, gpu)
    copies = lambda: [e for e in gpu.log if e[0] == "copy"]  # noqa: E731
    assert dec.decode(pkt(b"\x00\x00\x01x", 0)) == []  # the fake gives each picture one call later
    skipped = dec.decode(pkt(b"\x00\x00\x01x", 1))
    assert len(skipped) == 1 and skipped[0].pts == 0.0 and skipped[0].surface is None
    skipped[0].deferred.release()
    kept = dec.decode(pkt(b"\x00\x00\x01x", 2))
    assert copies() == [] and dec.pool.size == 0  # the skipped one: no copy, no pooled buffer
    lease = kept[0].deferred.take()  # goes on: copied now (from the buffer Decode() #2 gave), with its event
    copied = copies()
    assert len(copied) == 1 and copied[0][1:] == (lease.luma_ptr, 0xD000_0000 + 2, 64 * 48 * 3 // 2)
    assert gpu.log.index(copied[0]) < gpu.log.index(("record", id(lease.ready), "ours"))
    assert dec.pool.size == 1 and kept[0].deferred.take() is None  # taken once
    # Undecided across a call: copied before the next Decode(), and take() gives that copy.
    held = dec.decode(pkt(b"\x00\x00\x01x", 3))[0]
    gpu.log.clear()
    dec.decode(pkt(b"\x00\x00\x01x", 4))[0].deferred.release()
    assert [e[0] for e in gpu.log] == ["copy", "record", "Decode"]
    late = held.deferred.take()
    assert late is not None and late.luma_ptr == gpu.log[0][1] and len(copies()) == 1  # no second copy
    lease.release()
    late.release()


def test_a_deferred_picture_without_a_free_buffer_is_dropped_and_counted() -> None:
    dec, gpu, _ = make_nvdec(defer_copy=True, pool_size=2, acquire_timeout_s=0.05)

    def picture(i: int):  # the picture of packet i - 1 (the fake's delay), decided before the next call
        return dec.decode(pkt(b"\x00\x00\x01x", i))[0]

    assert dec.decode(pkt(b"\x00\x00\x01x", 0)) == []
    leases = [picture(i).deferred.take() for i in (1, 2)]
    assert all(lease is not None for lease in leases) and dec.pool.size == 2
    assert picture(3).deferred.take() is None and dec.dropped == 1  # both buffers held downstream
    picture(4).deferred.release()  # a skipped one needs no buffer at all
    assert dec.dropped == 1
    undecided = picture(5)
    dec.close()  # an undecided picture is let go with the decoder, uncopied
    assert undecided.deferred.take() is None
    assert sum(e[0] == "copy" for e in gpu.log) == 2
    for lease in leases:
        lease.release()


def test_decode_after_flush_keeps_the_decoder_and_errors_recreate_it() -> None:
    """A file pass / live session ends with a flush (ENDOFSTREAM: every picture out); the next one goes on
    with the same PyNvVideoCodec decoder, parameter sets sent again in front."""
    dec, _, nvc = make_nvdec()
    out = dec.decode(pkt(b"\x00\x00\x01x", 0)) + dec.flush()
    assert [p.pts for p in out] == [0.0]
    assert dec.restart(INFO)
    out = dec.decode(pkt(b"\x00\x00\x01y", 1)) + dec.flush()
    assert [p.pts for p in out] == [0.01] and len(nvc.decoders) == 1 and dec.created == 1
    fed = nvc.decoders[0].fed
    assert fed[2][0] == b"\x00\x00\x00\x01gSPS\x00\x00\x01y"  # parameter sets again after the flush
    assert not dec.restart(
        VideoInfo("h264", 128, 96, 10.0, 0.01, extradata=b"\x00\x00\x00\x01gSPS", annexb=True)
    )
    assert not dec.restart(
        VideoInfo("h264", 64, 48, 10.0, 0.01, extradata=b"\x00\x00\x00\x01gOTHER", annexb=True)
    )
    dec.decode(pkt(b"\x00\x00\x01z", 2))
    for _ in range(3):
        with pytest.raises(DecodeError, match="bitstream error"):
            dec.decode(pkt(b"BAD", 3))
    assert len(nvc.decoders) == 2 and dec.recreated == 1
    assert (nvc.decoders[1].kw["maxwidth"], nvc.decoders[1].kw["maxheight"]) == (3840, 2176)
    assert wait_closed(5) and nvc.decoders[0].released  # the old one was dropped on the closer thread


def test_no_room_for_a_decoder_is_decoder_full_and_never_grows_the_decoder() -> None:
    """Failed NVDEC session creation is not a corrupt packet: DecoderFull (the stream waits and retries),
    and no recreation with twice the size headroom (that asks the full GPU for more)."""
    from streamd.ingest.decode import DecoderFull

    dec, _, nvc = make_nvdec()
    for i in range(2 * 3):
        with pytest.raises(DecoderFull, match=r"no room for another decoder on GPU 0.*cuvidCreateDecoder"):
            dec.decode(pkt(b"\x00\x00\x01FULL", i))
    assert len(nvc.decoders) == 1 and dec.recreated == 0


def test_no_room_at_a_format_change_keeps_the_old_sequences_pictures() -> None:
    from streamd.ingest.decode import DecoderFull

    dec, _, nvc = make_nvdec()
    assert dec.decode(pkt(b"\x00\x00\x00\x01gSPS-A\x00\x00\x00\x01e-IDR", 0)) == []  # one picture pending
    with pytest.raises(DecoderFull) as caught:
        dec.decode(pkt(b"\x00\x00\x00\x01gSPS-B\x00\x00\x00\x01eFULL", 1))
    assert [p.pts for p in caught.value.pictures] == [0.0] and len(nvc.decoders) == 2


def test_other_session_failures_are_not_decoder_full() -> None:
    """A profile or size NVDEC cannot take fails creation with another code: not 'the GPU is full'."""
    from streamd.ingest.decode import DecoderFull

    dec, _, _ = make_nvdec()
    nvc_error = "HandleVideoSequence : cuvidCreateDecoder(&m_hDecoder, &info) returned error 801"

    def refuse(pd):
        raise RuntimeError(nvc_error)

    dec._dec.Decode = refuse
    with pytest.raises(DecodeError) as caught:
        dec.decode(pkt(b"\x00\x00\x01x", 0))
    assert not isinstance(caught.value, DecoderFull)


def test_new_sps_flushes_and_replaces_the_decoder_off_the_decode_thread() -> None:
    dec, _, nvc = make_nvdec()
    sps_a, sps_b = b"\x00\x00\x00\x01\x67AAAA", b"\x00\x00\x00\x01\x67BBBB"
    out = dec.decode(pkt(sps_a + b"\x00\x00\x01\x65x", 0))
    out += dec.decode(pkt(b"\x00\x00\x01\x41y", 1))
    out += dec.decode(pkt(sps_a + b"\x00\x00\x01\x65z", 2))  # same SPS again: nothing happens
    assert len(nvc.decoders) == 1
    out += dec.decode(pkt(sps_b + b"\x00\x00\x01\x65w", 3)) + dec.flush()
    assert [p.pts for p in out] == [0.0, 0.01, 0.02, 0.03]  # the old sequence's pictures first
    assert len(nvc.decoders) == 2 and dec.sequence_changes == 1
    assert nvc.decoders[0].fed[-1][2] == FakeNvc.VideoPacketFlag.ENDOFSTREAM
    assert wait_closed(5) and nvc.decoders[0].released


# x264/x265 SPS NAL units (header included) as find_sps returns them: Baseline and High without B-frames,
# High with B-frames (bitstream restriction present), HEVC without / with B-frames.
def _sps_of(codec: str, params: str) -> bytes:
    import av

    from streamd.ingest.decode.nvdec import find_sps
    from streamd.ingest.sources.base import to_annexb_extradata

    ctx = av.CodecContext.create(codec, "w")
    ctx.width, ctx.height, ctx.pix_fmt, ctx.time_base = 64, 64, "yuv420p", Fraction(1, 25)
    ctx.flags |= 1 << 22  # AV_CODEC_FLAG_GLOBAL_HEADER: parameter sets in extradata
    ctx.options = {"x264-params" if codec == "libx264" else "x265-params": params}
    ctx.open()
    name = "h264" if codec == "libx264" else "hevc"
    extradata = to_annexb_extradata(bytes(ctx.extradata), name)
    sps = find_sps(np.frombuffer(extradata, np.uint8), name)
    assert sps is not None
    return sps


@pytest.mark.parametrize(
    ("codec", "params", "depth"),
    [
        ("libx264", "bframes=0:profile=baseline", 0),
        ("libx264", "bframes=0", 0),
        ("libx264", "bframes=3", 2),
        ("libx264", "bframes=2:b-pyramid=none", 1),
        ("libx265", "bframes=0:log-level=none", 0),
        ("libx265", "bframes=4:log-level=none", 2),
    ],
)
def test_reorder_depth_from_the_sps(codec, params, depth) -> None:
    from streamd.ingest.decode.sps import reorder_depth

    assert reorder_depth(_sps_of(codec, params), "h264" if codec == "libx264" else "hevc") == depth


def test_low_delay_uses_zero_display_delay_only_without_b_frames() -> None:
    no_b = b"\x00\x00\x00\x01" + _sps_of("libx264", "bframes=0")
    with_b = b"\x00\x00\x00\x01" + _sps_of("libx264", "bframes=3")
    for extradata, live, expected in [(no_b, True, "low"), (with_b, True, "native"), (no_b, False, "native")]:
        info = VideoInfo("h264", 64, 48, 10.0, 0.01, extradata=extradata, annexb=True)
        from streamd.ingest.decode.nvdec import NvdecDecoder

        nvc = FakeNvc()
        dec = NvdecDecoder(info, gpu=FakeGpu(), nvc=nvc, low_delay=live)
        assert dec.latency == expected
        assert nvc.decoders[0].kw["latency"] == expected.upper()
        dec.decode(pkt(b"\x00\x00\x01\x65x", 0))
        flag = nvc.decoders[0].fed[0][2]
        assert flag == (FakeNvc.VideoPacketFlag.ENDOFPICTURE if expected == "low" else 0)


def test_nvdec_refuses_what_it_cannot_decode() -> None:
    from streamd.ingest.decode.nvdec import NvdecDecoder

    with pytest.raises(DecodeError, match="no AV1"):
        NvdecDecoder(VideoInfo("av1", 64, 48, None, 0.1, annexb=False), gpu=FakeGpu(), nvc=FakeNvc())
    with pytest.raises(DecodeError, match="Annex-B"):
        NvdecDecoder(VideoInfo("h264", 64, 48, None, 0.1), gpu=FakeGpu(), nvc=FakeNvc())
    with pytest.raises(DecodeError, match="not available"):
        NvdecDecoder(INFO)  # no PyNvVideoCodec / GPU on this machine


def test_low_delay_cpu_decoding_gives_each_picture_from_its_own_packet(tmp_path) -> None:
    """A live camera without B-frames: with low_delay (no frame threading) every packet's picture comes out
    of the decode() call of that packet; frame threading holds pictures back."""
    from tests.sources.conftest import make_camera_clip

    clip = make_camera_clip(tmp_path / "ipp.mp4", 20, 25, bframes=0)
    dmx = demuxer_class("pyav")(str(clip))
    packets = list(dmx.packets())
    dmx.close()
    live = CpuDecoder(dmx.info, low_delay=True)
    assert [len(live.decode(p)) for p in packets] == [1] * 20 and live.flush() == []
    batch = CpuDecoder(dmx.info, threads=4)
    held = [len(batch.decode(p)) for p in packets]
    assert held[0] == 0 and sum(held) + len(batch.flush()) == 20  # throughput mode: delayed, none lost


def test_cpu_decoder_goes_on_after_a_flush() -> None:
    """The decoder of a looping file / reconnecting camera is flushed and kept: the next pass decodes."""
    dmx = demuxer_class("pyav")(str(CLIP_HEVC))
    packets = list(dmx.packets())[:12]
    dmx.close()
    dec = CpuDecoder(dmx.info)
    first = [p for pkt in packets for p in dec.decode(pkt)] + dec.flush()
    assert dec.restart(dmx.info)
    again = [p for pkt in packets for p in dec.decode(pkt)] + dec.flush()
    assert len(first) == len(again) == 12
    assert all(np.array_equal(a.image, b.image) for a, b in zip(first, again, strict=True))


def test_a_close_after_the_cuda_context_is_quiet_others_are_logged(caplog) -> None:
    """At process exit a decoder may be closed after its context went away: nothing to free, no traceback.
    Any other failure to close is an ERROR with its traceback."""

    class Gone(RuntimeError):
        name = "CUDA_ERROR_CONTEXT_IS_DESTROYED"

    class Fails:
        def __init__(self, exc: Exception) -> None:
            self.exc = exc

        def close(self) -> None:
            raise self.exc

    caplog.set_level(logging.DEBUG, logger="streamd.ingest.decode.base")
    close_later(Fails(Gone("context is destroyed")))
    close_later(Fails(ValueError("boom")))
    assert wait_closed(5)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info and "boom" in str(errors[0].exc_info[1])
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert any("after its CUDA context" in m for m in debug)
