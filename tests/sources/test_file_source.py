"""File sources through both demux backends: packets, Annex-B conversion, pacing, looping, end of file."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path

import pytest

from streamd.config.streams import StreamConfig
from streamd.ingest.sources import DemuxOptions, SourceError, available_backends, demuxer_class, open_stream
from streamd.ingest.sources.base import nal_types, to_annexb_extradata
from streamd.ingest.sources.file import Pacer
from tests.sources.conftest import CLIP, CLIP_HEVC, ffprobe_pts

BACKENDS = available_backends()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("clip", "codec", "count"), [(CLIP, "h264", 795), (CLIP_HEVC, "hevc", 100)])
def test_packets_are_annexb_with_parameter_sets_before_the_key_frame(backend, clip, codec, count) -> None:
    dmx = demuxer_class(backend)(str(clip), DemuxOptions(annexb=True))
    info = dmx.info
    assert (info.codec, info.width, info.height, info.fps, info.annexb) == (codec, 768, 576, 10.0, True)
    packets = list(dmx.packets())
    dmx.close()
    dmx.close()  # twice is fine
    assert len(packets) == count
    first = packets[0]
    assert first.is_key and first.view()[:4].tobytes() == b"\x00\x00\x00\x01"
    types = nal_types(first.view(), codec)
    if codec == "h264":
        assert {7, 8, 5} <= set(types)  # SPS, PPS, IDR slice
        assert nal_types(info.extradata, codec) == [7, 8]
    else:
        assert {32, 33, 34} <= set(types)  # VPS, SPS, PPS
        assert nal_types(info.extradata, codec)[:3] == [32, 33, 34]
    pts_s = sorted(p.pts * info.time_base for p in packets)
    assert pts_s[0] == pytest.approx(0.0) and pts_s[-1] == pytest.approx((count - 1) / 10, abs=1e-3)


def test_pyav_without_annexb_keeps_container_packets() -> None:
    dmx = demuxer_class("pyav")(str(CLIP))
    assert not dmx.info.annexb and dmx.info.extradata[:1] == b"\x01"  # avcC
    assert next(iter(dmx.packets())).view()[:4].tobytes() != b"\x00\x00\x00\x01"  # length-prefixed NALs
    dmx.close()


def test_extradata_conversion_leaves_annexb_and_junk_alone() -> None:
    assert to_annexb_extradata(b"\x00\x00\x00\x01gxx", "h264") == b"\x00\x00\x00\x01gxx"
    assert to_annexb_extradata(b"\x01\x64\x00", "h264") == b""  # truncated avcC
    assert to_annexb_extradata(b"", "hevc") == b""


@pytest.mark.parametrize("backend", BACKENDS)
def test_missing_file_is_a_source_error(backend, tmp_path: Path) -> None:
    cfg = StreamConfig(id="x", url=str(tmp_path / "nope.mp4"))
    with pytest.raises(SourceError, match="no such file"):
        open_stream(cfg, DemuxOptions.for_stream(cfg, backend=backend))


@pytest.mark.parametrize("backend", BACKENDS)
def test_whole_file_as_fast_as_possible(pipeline, backend) -> None:
    pipe = pipeline(capacity=2)
    worker = pipe.add(StreamConfig(id="f", url=str(CLIP_HEVC)), policy="block", demux=backend)
    pipe.start()
    assert worker.join(30)
    assert pipe.wait_frames("f", 100, timeout=5)
    seen = pipe.seen["f"]
    assert seen.indices == list(range(100))
    assert [round(p, 3) for _, p, *_ in seen.frames] == [round(i * 0.1, 3) for i in range(100)]
    assert worker.stats.state == "ended" and worker.stats.decode_errors == worker.stats.read_errors == 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("clip", [CLIP, CLIP_HEVC])
def test_pts_equal_ffprobe_for_every_frame(pipeline, backend, clip) -> None:
    """A file's pts are ffprobe's pts_time, frame for frame."""
    expected = ffprobe_pts(clip)
    pipe = pipeline(capacity=8)
    worker = pipe.add(StreamConfig(id="f", url=str(clip)), policy="block", demux=backend)
    pipe.start()
    assert worker.join(60) and pipe.wait_frames("f", len(expected), timeout=5)
    assert [p for _, p, *_ in pipe.seen["f"].frames] == pytest.approx(expected, abs=1e-6)


def test_loop_continues_indices_and_timestamps(pipeline) -> None:
    pipe = pipeline(capacity=2)
    worker = pipe.add(StreamConfig(id="f", url=str(CLIP_HEVC), loop=True), policy="block")
    pipe.start()
    assert pipe.wait_frames("f", 230, timeout=30)
    pipe.close()
    frames = pipe.seen["f"].frames
    assert [f[0] for f in frames] == list(range(len(frames)))
    pts = [f[1] for f in frames]
    assert all(b - a == pytest.approx(0.1, abs=1e-6) for a, b in itertools.pairwise(pts))
    assert worker.stats.state == "ended"
    # a loop pass flushes the decoder (every picture out) and keeps it, no new decoder per pass
    assert worker.stats.opens >= 3 and worker.stats.decoders_created == 1


def test_realtime_paces_at_the_native_rate(pipeline) -> None:
    pipe = pipeline(capacity=2)
    pipe.add(StreamConfig(id="f", url=str(CLIP_HEVC), realtime=True), policy="latest")
    pipe.start()
    assert pipe.wait_frames("f", 21, timeout=10)
    arrivals = [f[4] for f in pipe.seen["f"].frames[:21]]
    took = arrivals[20] - arrivals[0]
    assert 1.7 < took < 2.6, f"20 frames of a 10 fps file took {took:.2f} s"
    assert pipe.close() < 1.5


def test_pacer_restarts_its_schedule_instead_of_bursting() -> None:
    stop = threading.Event()
    pacer = Pacer(stop, max_lag_s=0.2)
    t0 = time.monotonic()
    assert pacer.wait(10.0) and pacer.wait(10.1)
    assert 0.08 < time.monotonic() - t0 < 0.3
    time.sleep(0.5)  # the consumer fell behind by more than max_lag_s
    t1 = time.monotonic()
    assert pacer.wait(10.2) and time.monotonic() - t1 < 0.05  # re-anchored, not waiting
    assert pacer.wait(10.3) and 0.08 < time.monotonic() - t1 < 0.3
    stop.set()
    assert not pacer.wait(99.0)
