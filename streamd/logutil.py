"""Rate limiting of repeated log messages: a corrupt file must not write 80 identical warnings in 30 ms.

``RateLimitFilter`` is a ``logging.Filter``. Records are grouped by logger, level, message template and the
first argument (by convention the stream id: ``log.warning("stream %s: ...", stream_id, ...)``), so each
stream is limited on its own. Per group, ``burst`` records pass in each ``interval_s`` window; later ones are
counted and dropped. The first record of the group that passes after the window carries the count
(``... [+23 similar in the last 10 s]``); ``flush()`` logs the counts still pending (call it at exit).

Attach it to a logger (``install("streamd.ingest")``: records made by that logger) or to a handler (every
record the handler writes). Records below ``min_level`` (default WARNING) always pass.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Hashable

_Key = tuple[str, int, str, Hashable]


class RateLimitFilter(logging.Filter):
    def __init__(self, interval_s: float = 10.0, burst: int = 3, min_level: int = logging.WARNING) -> None:
        super().__init__()
        self.interval_s = interval_s
        self.burst = burst
        self.min_level = min_level
        self._lock = threading.Lock()
        # key -> [window start, passed in window, suppressed since the last one that passed, a sample record]
        self._groups: dict[_Key, list] = {}
        self.suppressed = 0  # all records dropped so far

    @staticmethod
    def key(record: logging.LogRecord) -> _Key:
        args = record.args
        first = args[0] if isinstance(args, tuple) and args else None
        return (record.name, record.levelno, str(record.msg), first if isinstance(first, Hashable) else None)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < self.min_level or getattr(record, "_rate_limit_summary", False):
            return True
        key, now = self.key(record), time.monotonic()
        with self._lock:
            group = self._groups.get(key)
            if group is None or now - group[0] >= self.interval_s:
                pending = group[2] if group is not None else 0
                window = (now - group[0]) if group is not None else 0.0
                self._groups[key] = [now, 1, 0, record]
                if pending:
                    record.msg = f"{record.msg} [+{pending} similar in the last {window:.3g} s]"
                return True
            if group[1] < self.burst:
                group[1] += 1
                return True
            group[2] += 1
            group[3] = record
            self.suppressed += 1
            return False

    def flush(self, logger: logging.Logger | None = None) -> None:
        """Log one line per group that has suppressed records not yet reported."""
        with self._lock:
            pending = [(g[3], g[2]) for g in self._groups.values() if g[2]]
            for g in self._groups.values():
                g[2] = 0
        for sample, count in pending:
            target = logger or logging.getLogger(sample.name)
            text = sample.getMessage()
            target.log(
                sample.levelno,
                "%s [+%d similar suppressed]",
                text,
                count,
                extra={"_rate_limit_summary": True},
            )


_installed: list[RateLimitFilter] = []


def install(
    logger: logging.Logger | str, interval_s: float = 10.0, burst: int = 3, min_level: int = logging.WARNING
) -> RateLimitFilter:
    """Attach a RateLimitFilter to ``logger`` (a name or a Logger) and return it; ``flush_all()`` reports
    what every installed filter still holds back."""
    target = logging.getLogger(logger) if isinstance(logger, str) else logger
    f = RateLimitFilter(interval_s, burst, min_level)
    target.addFilter(f)
    _installed.append(f)
    return f


def flush_all() -> None:
    """At exit: one line per group of messages that were suppressed and not yet reported."""
    for f in _installed:
        f.flush()
