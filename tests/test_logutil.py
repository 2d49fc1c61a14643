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
