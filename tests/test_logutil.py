"""Rate limiting of repeated warnings, per stream, with a count."""

from __future__ import annotations

import logging
import time

from streamd.logutil import RateLimitFilter


def test_repeats_are_limited_per_stream_and_counted(caplog) -> None:
    log = logging.getLogger("streamd.test_logutil")
    limiter = RateLimitFilter(interval_s=0.3, burst=3)
    log.addFilter(limiter)
    try:
        with caplog.at_level(logging.INFO, logger="streamd.test_logutil"):
            for i in range(80):  # a corrupt file: 80 identical warnings in a few ms
                log.warning("stream %s: %d corrupt picture(s) skipped", "bad", 1)
                if i % 16 == 0:
                    log.warning("stream %s: %d corrupt picture(s) skipped", "other", 1)
            log.info("stream %s: info is never limited", "bad")
            log.info("stream %s: info is never limited", "bad")
            time.sleep(0.35)
            log.warning("stream %s: %d corrupt picture(s) skipped", "bad", 1)
            log.warning("stream %s: %d corrupt picture(s) skipped", "bad", 1)
            log.warning("stream %s: %d corrupt picture(s) skipped", "bad", 1)
            log.warning("stream %s: %d corrupt picture(s) skipped", "bad", 1)  # suppressed again
            limiter.flush()
    finally:
        log.removeFilter(limiter)
    lines = [r.getMessage() for r in caplog.records]
    bad = [m for m in lines if m.startswith("stream bad: 1 corrupt")]
    other = [m for m in lines if m.startswith("stream other")]
    print("\n".join(lines))
    assert other[:3] == ["stream other: 1 corrupt picture(s) skipped"] * 3
    assert other[3:] == ["stream other: 1 corrupt picture(s) skipped [+2 similar suppressed]"]
    assert lines.count("stream bad: info is never limited") == 2
    assert bad[:3] == ["stream bad: 1 corrupt picture(s) skipped"] * 3
    assert bad[3].startswith("stream bad: 1 corrupt picture(s) skipped [+77 similar in the last")
    assert bad[-1] == "stream bad: 1 corrupt picture(s) skipped [+1 similar suppressed]"
    assert len(bad) == 7 and limiter.suppressed == 77 + 2 + 1


def corrupt_clip(path, frames: int = 200) -> None:
    """The first ``frames`` frames of the demo clip (remuxed with PyAV), with bytes overwritten mid-file."""
    import os

    import av

    from tests.conftest import CLIP

    with av.open(str(CLIP)) as src, av.open(str(path), "w", format="mp4") as dst:
        stream = dst.add_stream_from_template(src.streams.video[0])
        for n, packet in enumerate(src.demux(src.streams.video[0])):
            if packet.dts is None or n >= frames:
                continue
            packet.stream = stream
            dst.mux(packet)
    data = bytearray(path.read_bytes())
    for off in range(len(data) // 4, len(data) // 4 + 120_000, 4_000):
        data[off : off + 64] = os.urandom(64)
    path.write_bytes(bytes(data))


def test_a_corrupt_file_gives_a_few_warnings_and_a_count(tmp_path, assets) -> None:
    from tests.conftest import run_streamd
    from tests.sinks._helpers import config_with_sinks

    clip = tmp_path / "corrupt.mp4"
    corrupt_clip(clip)
    cfg = config_with_sinks(
        tmp_path / "c.yaml", f"  - type: jsonl\n    path: {tmp_path / 'o.jsonl'}\n", clip=clip
    )
    proc = run_streamd("run", str(cfg), "--no-status")
    warnings = [line for line in proc.stderr.splitlines() if "corrupt picture" in line]
    print("\n".join(warnings))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert 2 <= len(warnings) <= 8, warnings
    assert any("similar" in w for w in warnings), "the held-back repeats are counted"
