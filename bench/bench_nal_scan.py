"""The stream thread's per-packet Annex-B scans (``find_sps`` on every packet NVDEC decodes, ``_first_slice``
on small and key packets), each against the array-compare version it replaced (tests/decode/
test_nal_scan.py keeps those as its reference), on the same packets in the same run: µs per packet, best of 7
passes over every packet of each file. They run holding the GIL in every stream thread of a worker (the
fourteenth session's start-up profile put each at ≈ 8 % of a 24-camera worker's GIL samples).

Usage: python bench/bench_nal_scan.py [FILE:CODEC ...]   (default: the bundled H.264 and HEVC samples, and
.assets-work/live1080.mp4 where tools/gpu_carry.sh clip made it)
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from streamd.ingest.decode.nvdec import find_sps  # noqa: E402
from streamd.ingest.sources.base import _first_slice  # noqa: E402
from tests.decode.test_nal_scan import _packets as packets  # noqa: E402
from tests.decode.test_nal_scan import reference_first_slice, reference_sps  # noqa: E402

DEFAULT = ["samples/vtest.mp4:h264", "samples/vtest-hevc.mp4:hevc", ".assets-work/live1080.mp4:h264"]


def per_packet_us(fn: Callable[[np.ndarray, str], object], views: list[np.ndarray], codec: str) -> float:
    best = float("inf")
    for _ in range(7):
        t = time.perf_counter()
        for v in views:
            fn(v, codec)
        best = min(best, time.perf_counter() - t)
    return best / len(views) * 1e6


def main(specs: list[str]) -> None:
    print("| file | packets (median bytes) | scan | before µs | now µs | speed-up |")
    print("|---|---|---|---:|---:|---:|")
    for spec in specs:
        name, codec = spec.rsplit(":", 1)
        path = ROOT / name
        if not path.exists():
            continue
        views = packets(path)
        median = int(np.median([v.size for v in views]))
        for scan, new, old in (
            ("find_sps", find_sps, reference_sps),
            ("_first_slice", _first_slice, reference_first_slice),
        ):
            assert [new(v, codec) for v in views] == [old(v, codec) for v in views]
            before, now = per_packet_us(old, views, codec), per_packet_us(new, views, codec)
            row = f"| {name} ({codec}) | {len(views)} ({median}) | {scan} | {before:.2f} | {now:.2f} |"
            print(f"{row} {before / now:.1f}× |")


if __name__ == "__main__":
    main(sys.argv[1:] or DEFAULT)
