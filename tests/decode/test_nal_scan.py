"""The per-packet Annex-B scans on the NVDEC path (``find_sps``, ``_first_slice``) against the array-compare
versions they replaced (kept here as the reference): the same answer on every packet of real H.264 and HEVC
files and on random buffers with start codes in awkward places (3- and 4-byte, at the very end, back to back,
a header byte cut off)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from streamd.ingest.decode.nvdec import SPS_SCAN_BYTES, find_sps
from streamd.ingest.sources import DemuxOptions, demuxer_class
from streamd.ingest.sources.base import SMALL_PACKET, _first_slice

ROOT = Path(__file__).resolve().parents[2]


def _starts(head: np.ndarray) -> np.ndarray:
    return np.flatnonzero((head[:-3] == 0) & (head[1:-2] == 0) & (head[2:-1] == 1)) + 3


def reference_sps(view: np.ndarray, codec: str) -> bytes | None:
    head = view[:SPS_SCAN_BYTES]
    if head.size < 4:
        return None
    starts = _starts(head)
    for k, i in enumerate(starts):
        nal_type = (int(head[i]) & 0x1F) if codec == "h264" else (int(head[i]) >> 1) & 0x3F
        if nal_type == (7 if codec == "h264" else 33):
            end = int(starts[k + 1]) - 3 if k + 1 < len(starts) else head.size
            return head[i:end].tobytes().rstrip(b"\0")
    return None


def reference_first_slice(view: np.ndarray, codec: str) -> tuple[bool, bool] | None:
    head = view[:SMALL_PACKET]
    if head.size < 4:
        return None
    for i in _starts(head):
        if i + 2 >= head.size:
            break
        if codec == "h264":
            kind = int(head[i]) & 0x1F
            if 1 <= kind <= 5:
                return kind == 5, bool(head[i + 1] & 0x80)
        else:
            kind = (int(head[i]) >> 1) & 0x3F
            if kind < 32:
                return 16 <= kind <= 23, bool(head[i + 2] & 0x80)
    return None


def _packets(path: Path) -> list[np.ndarray]:
    dmx = demuxer_class("auto")(str(path), DemuxOptions(annexb=True))
    try:
        return [p.view().copy() for p in dmx.packets()]
    finally:
        dmx.close()


@pytest.mark.parametrize(
    ("name", "codec"),
    [
        ("samples/vtest.mp4", "h264"),
        ("samples/vtest-hevc.mp4", "hevc"),
        ("tests/decode/data/size-640x360.ts", "h264"),
        ("tests/decode/data/ipp-1920x1080.ts", "h264"),
    ],
)
def test_every_packet_of_a_real_stream_scans_as_before(name: str, codec: str) -> None:
    views = _packets(ROOT / name)
    assert len(views) > 10
    sps = [find_sps(v, codec) for v in views]
    assert sps == [reference_sps(v, codec) for v in views]
    assert any(s is not None for s in sps)  # the files carry their SPS in band: the scan finds it
    slices = [_first_slice(v, codec) for v in views]
    assert slices == [reference_first_slice(v, codec) for v in views]
    assert any(s is not None and s[0] for s in slices)  # key pictures seen


def _random_buffer(rng: np.random.Generator) -> np.ndarray:
    parts: list[bytes] = []
    for _ in range(int(rng.integers(0, 8))):
        parts.append(b"\x00\x00\x01" if rng.random() < 0.6 else b"\x00\x00\x00\x01")
        parts.append(rng.integers(0, 256, int(rng.integers(0, 6)), dtype=np.uint8).tobytes())
        if rng.random() < 0.2:  # a long NAL unit: start codes past the scanned head
            parts.append(rng.integers(1, 256, int(rng.integers(900, 4200)), dtype=np.uint8).tobytes())
    return np.frombuffer(b"".join(parts), np.uint8)


@pytest.mark.parametrize("codec", ["h264", "hevc"])
def test_random_buffers_scan_as_before(codec: str) -> None:
    rng = np.random.default_rng(26)
    for _ in range(4000):
        view = _random_buffer(rng)
        assert find_sps(view, codec) == reference_sps(view, codec), view.tobytes()[:64]
        assert _first_slice(view, codec) == reference_first_slice(view, codec), view.tobytes()[:64]
