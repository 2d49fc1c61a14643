"""Broken files made at test time from samples/vtest.mp4: truncated, corrupted mid-stream, not a video.

Frames that cannot be decoded are skipped and counted; the stream goes on to the end or ends cleanly; nothing
raises into the caller and nothing hangs.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from streamd.config.streams import StreamConfig
from streamd.ingest.decode.cpu import CpuDecoder
from streamd.ingest.sources import available_backends, demuxer_class
from tests.sources.conftest import CLIP

BACKENDS = available_backends()


@pytest.fixture(scope="module")
def broken(tmp_path_factory) -> dict[str, Path]:
    data = CLIP.read_bytes()
    d = tmp_path_factory.mktemp("broken")
    rng = random.Random(1)
    damaged = bytearray(data)
    for off in range(len(data) // 3, len(data) // 3 + 200_000, 5_000):  # 40 hits inside mdat, 64 B each
        damaged[off : off + 64] = bytes(rng.randrange(256) for _ in range(64))
    files = {
        "truncated": data[: int(len(data) * 0.6)],
        "corrupted": bytes(damaged),
        "garbage": bytes(rng.randrange(256) for _ in range(5000)),
        "empty": b"",
    }
    for name, content in files.items():
        (d / f"{name}.mp4").write_bytes(content)
    return {name: d / f"{name}.mp4" for name in files}


@pytest.mark.parametrize("backend", BACKENDS)
def test_truncated_file_ends_cleanly_with_a_counted_read_error(pipeline, broken, backend) -> None:
    pipe = pipeline(capacity=2)
    worker = pipe.add(StreamConfig(id="t", url=str(broken["truncated"])), policy="block", demux=backend)
    pipe.start()
    assert worker.join(30)
    n = worker.stats.decoded
    assert worker.stats.state == "ended" and worker.stats.read_errors == 1, worker.stats
    assert 400 < n < 795 and "truncated" in worker.stats.last_error
    assert pipe.wait_frames("t", n, timeout=5) and pipe.seen["t"].indices == list(range(n))


@pytest.mark.parametrize("backend", BACKENDS)
def test_corrupted_packets_are_skipped_and_counted_and_the_stream_goes_on(pipeline, broken, backend) -> None:
    pipe = pipeline(capacity=2)
    worker = pipe.add(StreamConfig(id="c", url=str(broken["corrupted"])), policy="block", demux=backend)
    pipe.start()
    assert worker.join(60)
    s = worker.stats
    assert s.state == "ended" and s.read_errors == 0, s
    assert s.decode_errors > 0, "the damage must be noticed"
    assert s.decoded + s.decode_errors == 795  # every picture either delivered or counted
    assert pipe.wait_frames("c", s.decoded, timeout=5)
    assert pipe.seen["c"].frames[-1][1] == pytest.approx(79.4, abs=1e-3)  # decoding reached the end


def test_corrupt_pictures_can_be_kept_on_request(broken) -> None:
    dmx = demuxer_class("pyav")(str(broken["corrupted"]))
    dec = CpuDecoder(dmx.info, keep_corrupt=True)
    n = sum(len(dec.decode(p)) for p in dmx.packets()) + len(dec.flush())
    assert n == 795 and dec.skipped == 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["garbage", "empty"])
def test_not_a_video_fails_the_stream_only(pipeline, broken, backend, name) -> None:
    pipe = pipeline()
    bad = pipe.add(StreamConfig(id="bad", url=str(broken[name])), policy="block", demux=backend)
    good = pipe.add(StreamConfig(id="good", url=str(CLIP)), policy="block", demux=backend)
    pipe.start()
    assert bad.join(10) and good.join(60)
    assert bad.stats.state == "failed" and bad.stats.read_errors == 1 and bad.stats.decoded == 0
    assert good.stats.state == "ended" and good.stats.decoded == 795
