"""A file cut in the middle of a picture (a copy still being written, a full disk): every picture an
independent decoder gets out of it gets a frame (and a line), the last ones held for B-frame reordering
included, and what cannot be decoded is counted and logged.

The clips are made at test time (PyAV's libx264, B-frames, one thread so the bytes are reproducible) and cut
inside the media data: an MP4 with its index in front (the demuxer raises at the cut) and an MPEG-TS. The
reference is PyAV's own decode loop on the container, cross-checked with ``ffprobe -count_frames`` when
ffprobe is installed.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import threading
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import pytest

from streamd.config import load_config
from streamd.config.streams import StreamConfig
from streamd.ingest.decode import DecodedPicture
from streamd.ingest.reader import StreamReader
from streamd.ingest.sources import Packet, SourceError, VideoInfo, available_backends
from streamd.pipeline.batcher import Batcher
from streamd.supervisor import Supervisor
from tests.conftest import MODEL
from tests.sources.conftest import CLIP

FRAMES, FPS = 100, 25


def encode(path: Path, options: dict[str, str]) -> Path:
    """``FRAMES`` pictures of the bundled footage, 384x288 H.264 with two B-frames between references."""
    src = av.open(str(CLIP))
    out = av.open(str(path), "w", options=options)
    stream = out.add_stream("libx264", rate=FPS)
    stream.width, stream.height, stream.pix_fmt = 384, 288, "yuv420p"
    stream.options = {
        "preset": "veryfast",
        "x264-params": "bframes=2:b-adapt=0:keyint=50:threads=1:log-level=none",
    }
    for i, picture in enumerate(src.decode(video=0)):
        if i == FRAMES:
            break
        small = picture.reformat(width=384, height=288, format="yuv420p")
        small.pts, small.time_base = i, Fraction(1, FPS)
        for packet in stream.encode(small):
            out.mux(packet)
    for packet in stream.encode():
        out.mux(packet)
    out.close()
    src.close()
    return path


@dataclass
class Reference:
    clean_pts: list[float]  # pictures decoded without damage, presentation times in seconds
    damaged: int  # pictures FFmpeg decoded but flagged corrupt
    rejected: int  # packets the decoder refused

    @property
    def pictures(self) -> int:
        return len(self.clean_pts) + self.damaged


def reference(path: Path) -> Reference:
    """What PyAV's plain decode loop gets out of ``path`` (every packet tried, errors counted; the
    demuxer's final empty packet drains the decoder)."""
    clean: list[float] = []
    damaged = rejected = 0
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        tb = stream.time_base
        assert tb is not None
        for packet in container.demux(stream):
            try:
                frames = packet.decode()
            except av.FFmpegError:
                rejected += 1
                continue
            for f in frames:
                if f.is_corrupt:
                    damaged += 1
                else:
                    assert f.pts is not None
                    clean.append(round(float(f.pts * tb), 4))
    return Reference(sorted(clean), damaged, rejected)


def cut_inside_a_reference(path: Path) -> int:
    """A byte offset in the middle of the first P picture after 3/4 of the pictures: the B-frames around it
    are still in the decoder's reordering buffer when the input ends there."""
    top = -1
    with av.open(str(path)) as container:
        for k, packet in enumerate(container.demux(video=0)):
            if packet.pts is None or not packet.size:
                continue
            if k >= FRAMES * 3 // 4 and packet.pts > top and not packet.is_keyframe and packet.pos > 0:
                return packet.pos + packet.size // 2
            top = max(top, packet.pts)
    raise AssertionError("no P picture to cut")


@pytest.fixture(scope="module")
def truncated(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("truncated")
    cuts = {}
    for suffix, options in ((".mp4", {"movflags": "+faststart"}), (".ts", {})):
        whole = encode(folder / f"whole{suffix}", options)
        cut = folder / f"cut{suffix}"
        cut.write_bytes(whole.read_bytes()[: cut_inside_a_reference(whole)])
        cuts[suffix] = cut
    return cuts


@pytest.mark.parametrize("suffix", [".mp4", ".ts"])
def test_the_reference_agrees_with_ffprobe(truncated, suffix) -> None:
    ref = reference(truncated[suffix])
    assert FRAMES // 2 < ref.pictures < FRAMES  # cut inside the media data
    assert ref.rejected + ref.damaged >= 1  # and inside a picture
    if shutil.which("ffprobe") is None:
        pytest.skip("ffprobe not installed: the PyAV reference alone")
    out = subprocess.run(
        ["ffprobe", "-v", "error", "-count_frames", "-select_streams", "v:0",
         "-show_entries", "stream=nb_read_frames", "-of", "csv=p=0", str(truncated[suffix])],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    assert int(out.split()[0]) == ref.pictures


@pytest.mark.parametrize("backend", available_backends())
@pytest.mark.parametrize("suffix", [".mp4", ".ts"])
def test_every_picture_of_a_truncated_file_comes_out(pipeline, truncated, suffix, backend, caplog) -> None:
    ref = reference(truncated[suffix])
    pipe = pipeline(capacity=2)
    worker = pipe.add(StreamConfig(id="t", url=str(truncated[suffix])), policy="block", demux=backend)
    with caplog.at_level(logging.WARNING, logger="streamd.ingest.stream"):
        pipe.start()
        assert worker.join(30)
    s = worker.stats
    assert s.state == "ended", s
    assert pipe.wait_frames("t", s.decoded, timeout=5)
    got = sorted(round(f[1], 4) for f in pipe.seen["t"].frames if f[1] is not None)
    missing = sorted(set(ref.clean_pts) - set(got))
    assert not missing, f"{len(got)} frames; pictures the reference decoded but streamd lost: {missing}"
    # What is not a frame is counted: a damaged picture refused or withheld by the decoder (which one depends
    # on FFmpeg's threads), or a damaged packet the demuxer never passed on (the read error of the cut).
    assert s.decoded <= ref.pictures
    assert ref.pictures + ref.rejected - s.decoded <= s.decode_errors + s.read_errors, (s, ref)
    if suffix == ".mp4":
        assert s.read_errors == 1 and "truncated" in s.last_error  # the demuxer raised at the cut
    if s.decode_errors:
        assert "skipped" in caplog.text or "undecodable" in caplog.text


def test_the_daemon_writes_a_line_for_every_picture(tmp_path, truncated) -> None:
    """The reported case end to end: the truncated MP4 through the daemon (CPU decoder, ONNX Runtime)."""
    clip = truncated[".mp4"]
    ref = reference(clip)
    out = tmp_path / "out.jsonl"
    cfg = tmp_path / "t.yaml"
    cfg.write_text(
        f"streams:\n  - id: cut\n    url: {clip}\n"
        f"model:\n  path: {MODEL}\n"
        "engine:\n  type: onnxruntime\n"
        f"sinks:\n  - type: jsonl\n    path: {out}\n"
    )
    assert Supervisor(load_config(cfg), status_line=False).run() == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    frames = [r for r in lines if "type" not in r]
    assert [r["frame"] for r in frames] == list(range(len(frames)))
    assert sorted(round(r["pts"], 4) for r in frames) == ref.clean_pts, (len(frames), ref)


class _CutDemuxer:
    """``count`` packets, then the read error of a truncated file."""

    backend = "pyav"

    def __init__(self, count: int) -> None:
        self.info = VideoInfo("h264", 64, 64, 25.0, 1 / 25, b"", annexb=True)
        self._count = count

    def packets(self):
        for i in range(self._count):
            yield Packet(b"\0\0\1\x65", i)
        raise SourceError("read error: truncated")

    def close(self) -> None:
        pass


class _ReorderingDecoder:
    """Holds its last ``depth`` pictures until flushed, as a decoder reordering B-frames does."""

    name = "nvdec"
    skipped = 0

    def __init__(self, depth: int) -> None:
        self._depth = depth
        self._held: list[DecodedPicture] = []
        self.flushes = 0

    def decode(self, packet: Packet) -> list[DecodedPicture]:
        self._held.append(DecodedPicture(packet.pts / 25 if packet.pts is not None else None, 64, 64))
        out, self._held = self._held[: -self._depth], self._held[-self._depth :]
        return out

    def flush(self) -> list[DecodedPicture]:
        self.flushes += 1
        out, self._held = self._held, []
        return out

    def restart(self, info: Any) -> bool:
        return True

    def close(self) -> None:
        pass


def test_a_read_error_flushes_whatever_decoder_the_stream_has(monkeypatch) -> None:
    """The flush at a cut is the stream reader's, not the CPU decoder's: an NVDEC stream (here a stand-in
    with the same interface) gets its held pictures out the same way."""
    decoder = _ReorderingDecoder(depth=3)
    monkeypatch.setattr("streamd.ingest.reader.open_stream", lambda *a, **k: _CutDemuxer(20))
    monkeypatch.setattr("streamd.ingest.decoder_slot.create_decoder", lambda *a, **k: decoder)
    batcher = Batcher(8, 0.01)
    queue = batcher.add_stream("n", 64, "block")
    worker = StreamReader(
        StreamConfig(id="n", url="/nonexistent.mp4"), queue, threading.Event(), decoder="nvdec"
    )
    worker.start()
    assert worker.join(10)
    assert decoder.flushes == 1 and worker.stats.decoded == 20 and worker.stats.read_errors == 1
    frames = []
    while (batch := batcher.next_batch(threading.Event())) is not None:
        frames += batch
    assert [f.index for f in frames] == list(range(20))
