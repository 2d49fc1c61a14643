"""HTTP webhook sink: the lines POSTed as a JSON array, one request per batch.

A batch is sent when it holds ``batch_size`` lines or its first line waited ``batch_timeout_ms``. A 5xx
answer, a timeout or a connection error is retried with backoff (0.5 s doubling up to ``retry_max_s``) for as
long as the sink runs; meanwhile new lines wait in the bounded queue and, once it is full, are dropped and
counted. A 4xx answer means the endpoint refuses this data: it is not retried, the batch is counted as dropped
and the status is logged once. Every request has a timeout.
"""

from __future__ import annotations

import logging
import time
import urllib.error
import urllib.request

from streamd.config.sinks import HttpSinkConfig
from streamd.sinks.base import _CLOSE, LineSink

log = logging.getLogger(__name__)

_FIRST_RETRY_S = 0.5


class HttpSink(LineSink):
    kind = "http"

    def __init__(self, cfg: HttpSinkConfig) -> None:
        host = cfg.url.split("://", 1)[1].split("/", 1)[0].rsplit("@", 1)[-1]  # no credentials in the name
        super().__init__(f"http:{host}", cfg.queue_size, skip_empty=cfg.skip_empty, drops_ok=cfg.drops_ok)
        self.cfg = cfg
        self.close_grace_s = cfg.timeout_s + 1.0  # a request under way at the deadline may run its timeout
        self.batches = 0
        self.retries = 0
        self._deadline = float("inf")

    def close(self, timeout: float = 10.0) -> None:
        self._deadline = time.monotonic() + timeout
        super().close(timeout)

    def _serve(self) -> None:
        closing = False
        while not closing:
            first = self._get(timeout=0.5)
            if first is None:
                continue
            if first is _CLOSE:
                break
            batch = [first[1]]
            until = time.monotonic() + self.cfg.batch_timeout_ms / 1e3
            while len(batch) < self.cfg.batch_size:
                item = self._get(timeout=max(0.0, until - time.monotonic()))
                if item is None:
                    break
                if item is _CLOSE:
                    closing = True
                    break
                batch.append(item[1])
            self._deliver(batch)

    def _deliver(self, batch: list[str]) -> None:
        body = ("[" + ",".join(line.rstrip("\n") for line in batch) + "]").encode()
        delay, failing_since = _FIRST_RETRY_S, None
        while True:
            problem = self._post(body)
            if problem is None:
                self.written += len(batch)
                self.batches += 1
                if failing_since is not None:
                    log.info(
                        "sink %s: delivering again after %.1f s (%d retries)",
                        self.name,
                        time.monotonic() - failing_since,
                        self.retries,
                    )
                return
            if problem[:3].isdigit() and int(problem[:3]) < 500:  # refused (4xx): retrying cannot help
                self._dropped_out += len(batch)
                self.log_once(
                    f"status:{problem[:3]}",
                    logging.ERROR,
                    "%s answered %s; batches it refuses are dropped and counted (logged once per status)",
                    self.cfg.url.split("?", 1)[0],
                    problem,
                )
                return
            if failing_since is None:
                failing_since = time.monotonic()
                log.warning(
                    "sink %s: POST failed (%s); retrying (backoff up to %.0f s), buffering up to %d line(s)",
                    self.name,
                    problem,
                    self.cfg.retry_max_s,
                    self.cfg.queue_size,
                )
            left = self._deadline - time.monotonic()
            if left <= 0:
                self._dropped_out += len(batch)
                self.log_once(
                    "gave-up", logging.ERROR, "gave up at exit: the endpoint still fails (%s)", problem
                )
                return
            self.retries += 1
            self._stop.wait(min(delay, left))  # close() wakes us to re-check the deadline
            if self._stop.is_set():
                time.sleep(min(delay, max(0.0, self._deadline - time.monotonic())))
            delay = min(delay * 2, self.cfg.retry_max_s)

    def _post(self, body: bytes) -> str | None:
        """POST once. None when delivered (2xx); else what went wrong ('503 Service Unavailable', ...)."""
        request = urllib.request.Request(
            self.cfg.url,
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", "User-Agent": "streamd"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.cfg.timeout_s) as response:
                response.read()
                return None
        except urllib.error.HTTPError as exc:
            exc.close()
            return f"{exc.code} {exc.reason}"
        except (urllib.error.URLError, OSError) as exc:  # refused, reset, timed out, DNS
            reason = getattr(exc, "reason", exc)
            return f"connection error: {reason}"

    def stats(self) -> dict:
        return {**super().stats(), "batches": self.batches, "retries": self.retries}
