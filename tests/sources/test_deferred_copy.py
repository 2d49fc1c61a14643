"""``detect_fps`` on NVDEC: a frame the stream skips is never copied out of the decoder's buffer.

A real stream thread over the bundled clip (real demuxer, Annex-B packets, real batcher) feeding our
``NvdecDecoder`` over the fake PyNvVideoCodec and fake GPU of the decoder tests (this box has no GPU): the
copies into pooled buffers are counted. The GPU twin of the copy itself (the pixels taken equal the CPU
decoder's) is ``tests/decode/gpu/test_nvdec_gpu.py::test_deferred_copies_equal_the_cpu_decoder``.
"""

from __future__ import annotations

from streamd.analytics.stream import StreamAnalytics
from streamd.config.streams import StreamConfig
from streamd.ingest import decoder_slot
from streamd.ingest.stats import StreamStats
from streamd.worker.pipeline import _counters
from tests.decode.test_cpu_decoder import INFO, FakeGpu, FakeNvc, pkt
from tests.sources.conftest import CLIP

FRAMES = 795  # the bundled clip, 10 fps


def _fake_nvdec(monkeypatch) -> list:
    from streamd.ingest.decode.nvdec import NvdecDecoder

    made: list = []

    def create(kind, info, **kw):
        assert kind == "nvdec"
        kw.pop("device", None)  # the fake GPU is device 0
        dec = NvdecDecoder(info, gpu=FakeGpu(), nvc=FakeNvc(), **kw)
        made.append(dec)
        return dec

    monkeypatch.setattr(decoder_slot, "create_decoder", create)
    return made


def _run(pipeline, monkeypatch, detect_fps: float | None) -> tuple[int, int, list]:
    made = _fake_nvdec(monkeypatch)
    pipe = pipeline(capacity=8)
    cfg = StreamConfig(id="cam", url=str(CLIP), detect_fps=detect_fps)
    analytics = StreamAnalytics(cfg, ("person",)) if detect_fps is not None else None
    reader = pipe.add(cfg, policy="block", decoder="nvdec", analytics=analytics)
    pipe.start()
    assert reader.join(60)
    queued = analytics.detected if analytics is not None else reader.stats.decoded
    # the consumer may still be taking the last batch when the stream thread ends
    assert pipe.wait_frames("cam", queued, timeout=5)
    seen = len(pipe.seen["cam"].frames)
    assert reader.stats.decoded == FRAMES and reader.stats.dropped_surfaces == 0
    copies = sum(e[0] == "copy" for d in made for e in d._gpu.log)
    return seen, copies, made


def test_skipped_frames_are_not_copied(pipeline, monkeypatch) -> None:
    seen, copies, made = _run(pipeline, monkeypatch, detect_fps=2.5)
    assert made[0].defer_copy
    # The fake decoder gives pictures in decode order (the clip's B-frames' pts go back and forth), so the
    # rate is not exactly one in four here; what counts is that most frames are skipped...
    assert 0 < seen < FRAMES / 2
    assert copies == seen  # one copy per frame that went on, none for a skipped one


def test_every_frame_is_copied_at_full_rate(pipeline, monkeypatch) -> None:
    seen, copies, made = _run(pipeline, monkeypatch, detect_fps=None)
    assert not made[0].defer_copy  # full rate: the copy stays inside the decoder's call, as before
    assert seen == FRAMES and copies == FRAMES


def test_surface_drops_are_counted_as_they_happen(monkeypatch) -> None:
    """Pictures that find every pooled buffer held downstream count at once, not at the session's end."""
    _fake_nvdec(monkeypatch)
    stats = StreamStats()
    slot = decoder_slot.DecoderSlot(
        StreamConfig(id="cam", url="x.mp4"), stats, "nvdec", {"pool_size": 2, "acquire_timeout_s": 0.01}
    )
    slot.get(INFO)
    pictures = [p for i in range(5) for p in slot.decode(pkt(b"\x00\x00\x01x", i))]
    assert len(pictures) == 2 and stats.dropped_surfaces == 2  # four pictures, two buffers, all held


def test_deferred_frames_without_a_buffer_are_dropped_and_counted(pipeline, monkeypatch) -> None:
    """A small pool and a slow consumer (every batch's frames held 5 ms each): frames that go on to the
    detector but find no free buffer are dropped, and counted with the stream's drops."""
    _fake_nvdec(monkeypatch)
    pipe = pipeline(capacity=8, work_s=0.005)
    cfg = StreamConfig(id="cam", url=str(CLIP), detect_fps=5.0)
    analytics = StreamAnalytics(cfg, ("person",))
    options = {"pool_size": 2, "acquire_timeout_s": 0.01}
    reader = pipe.add(cfg, policy="block", decoder="nvdec", analytics=analytics, decoder_options=options)
    pipe.start()
    assert reader.join(60)
    assert pipe.wait_until(lambda: len(pipe.seen["cam"].frames) + reader.stats.dropped_surfaces
                           == analytics.detected, 5)  # fmt: skip
    s = reader.stats
    assert s.decoded == FRAMES and s.dropped_surfaces > 0
    assert _counters(reader, None).dropped == s.dropped_surfaces
