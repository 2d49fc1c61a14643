"""Lazy host pictures: the CPU decoder's unconverted pictures convert to exactly the eager images, and only
frames that reach a batch are ever converted (a frame its queue drops costs its decode only)."""

from __future__ import annotations

import threading
import time

import numpy as np

from streamd.ingest.decode.cpu import CpuDecoder
from streamd.ingest.sources import DemuxOptions, demuxer_class
from streamd.pipeline.batcher import Batcher
from streamd.stages import host_frames
from streamd.stages.host_frames import HostFrames
from streamd.types import Frame
from tests.sources.conftest import CLIP, CLIP_HEVC

FRAMES = 40


def decode(clip, n: int, **kw):
    dmx = demuxer_class("pyav")(str(clip), DemuxOptions())
    dec = CpuDecoder(dmx.info, **kw)
    pics = []
    for pkt in dmx.packets():
        pics += dec.decode(pkt)
        if len(pics) >= n:
            break
    dmx.close()
    return pics[:n]


def test_lazy_pictures_convert_to_the_eager_images() -> None:
    for clip in (CLIP, CLIP_HEVC):
        eager, lazy = decode(clip, FRAMES), decode(clip, FRAMES, lazy=True)
        assert all(p.image is None and p.pending is not None for p in lazy)
        # converted long after they were decoded: the held FFmpeg frames still hold their own planes
        for a, b in zip(eager, lazy, strict=True):
            assert np.array_equal(a.image, b.pending.bgr()), clip


class Counting:
    def __init__(self, picture, log: list[int], index: int) -> None:
        self.picture, self.log, self.index = picture, log, index

    def bgr(self) -> np.ndarray:
        self.log.append(self.index)
        return self.picture.bgr()


def test_only_batched_frames_are_converted() -> None:
    """A live queue far behind drops its oldest frames: those are never converted; the batch's frames are,
    each into its own picture."""
    eager, lazy = decode(CLIP, FRAMES), decode(CLIP, FRAMES, lazy=True)
    converted: list[int] = []
    b = Batcher(batch_size=8, timeout_s=0.0)
    q = b.add_stream("cam", 4, "latest")
    stop = threading.Event()
    long_ago = time.perf_counter() - 5.0  # every frame is older than the lag bound: the queue keeps 4
    for i, p in enumerate(lazy):
        f = Frame("cam", i, p.pts, p.width, p.height, t_decoded=long_ago, t_arrival=long_ago)
        f.pending = Counting(p.pending, converted, i)
        q.put(f, stop)
    assert q.dropped == FRAMES - 4
    q.close()
    batch = b.next_batch(stop)
    assert batch is not None and [f.index for f in batch] == list(range(FRAMES - 4, FRAMES))
    HostFrames(threads=1).convert_pending(batch)
    assert converted == [f.index for f in batch]
    assert all(f.pending is None and np.array_equal(f.image, eager[f.index].image) for f in batch)


def test_a_large_batch_converts_in_threads_to_the_same_images(monkeypatch) -> None:
    monkeypatch.setattr(host_frames, "PARALLEL_PIXELS", 1)
    eager, lazy = decode(CLIP, 12), decode(CLIP, 12, lazy=True)
    frames = [Frame("cam", i, p.pts, p.width, p.height, pending=p.pending) for i, p in enumerate(lazy)]
    host = HostFrames(threads=3)
    host.convert_pending(frames)
    assert host._pool is not None  # the threaded path ran
    host.close()
    assert all(np.array_equal(f.image, e.image) for f, e in zip(frames, eager, strict=True))


class Broken:
    def bgr(self) -> np.ndarray:
        raise ValueError("unsupported pixel format")


def test_a_picture_that_cannot_be_converted_costs_its_frame_only(caplog) -> None:
    """Converting lazily moves FFmpeg's refusal into the pipeline thread: it must not stop the batch."""
    lazy = decode(CLIP, 2, lazy=True)
    good = Frame("a", 0, 0.0, lazy[0].width, lazy[0].height, pending=lazy[0].pending)
    bad = Frame("b", 7, 0.0, 64, 48, pending=Broken())
    HostFrames(threads=1).convert_pending([good, bad])
    assert good.image is not None and good.image.any()
    assert bad.image is not None and bad.image.shape == (48, 64, 3) and not bad.image.any()
    assert "stream b: frame 7 could not be converted" in caplog.text
