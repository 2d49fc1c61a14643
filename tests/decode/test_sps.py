"""The SPS watch that lets the NVDEC decoder follow a mid-stream size change (runs without a GPU)."""

from __future__ import annotations

from pathlib import Path

from streamd.ingest.decode.nvdec import find_sps
from streamd.ingest.sources import DemuxOptions, demuxer_class

ROOT = Path(__file__).resolve().parents[2]


def sps_of(path: Path, codec: str) -> list[bytes]:
    dmx = demuxer_class("auto")(str(path), DemuxOptions(annexb=True))
    try:
        return [s for p in dmx.packets() if (s := find_sps(p.view(), codec)) is not None]
    finally:
        dmx.close()


def test_size_change_shows_as_a_new_sps() -> None:
    a = sps_of(ROOT / "tests/decode/data/size-320x240.ts", "h264")
    b = sps_of(ROOT / "tests/decode/data/size-640x360.ts", "h264")
    assert a and b and set(a).isdisjoint(b)


def test_repeated_sps_of_one_stream_is_identical() -> None:
    """vtest repeats its SPS at every key frame: no spurious decoder restarts."""
    h264 = sps_of(ROOT / "samples/vtest.mp4", "h264")
    hevc = sps_of(ROOT / "samples/vtest-hevc.mp4", "hevc")
    assert len(h264) > 1 and len(set(h264)) == 1
    assert len(hevc) >= 1 and len(set(hevc)) == 1
