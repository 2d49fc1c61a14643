"""HTTP webhook sink against a real local HTTP server: batches, retries on 5xx, no retry on 4xx."""

from __future__ import annotations

import logging
import time

from streamd.config.sinks import HttpSinkConfig
from streamd.sinks.http import HttpSink
from tests.sinks._helpers import Endpoint, fake_lines


def feed(sink: HttpSink, lines: list[str], per_s: float) -> None:
    t0 = time.monotonic()
    for i, line in enumerate(lines):
        time.sleep(max(0.0, t0 + i / per_s - time.monotonic()))
        t = time.monotonic()
        sink.submit(line, "demo")
        assert time.monotonic() - t < 0.1, "submit never blocks (a blocked one would wait out the outage)"


def test_503_for_5_s_then_200_delivers_everything(tmp_path) -> None:
    endpoint = Endpoint(lambda t: 503 if t < 5 else 200)
    sink = HttpSink(HttpSinkConfig(url=endpoint.url, batch_size=50, batch_timeout_ms=200, retry_max_s=1))
    sink.start()
    feed(sink, fake_lines(795), per_s=100)
    sink.close(timeout=30)
    endpoint.close()
    refused = endpoint.statuses.count(503)
    print(f"795 sent, {len(endpoint.frames())} delivered in {len(endpoint.batches)} batches, {refused} x 503")
    assert endpoint.frames() == list(range(795)), "all delivered, in order"
    assert refused >= 5 and sink.retries == refused and sink.dropped == 0 and sink.written == 795


def test_400_is_logged_once_and_counted(tmp_path, caplog) -> None:
    endpoint = Endpoint(lambda _t: 400)
    sink = HttpSink(HttpSinkConfig(url=endpoint.url, batch_size=100, batch_timeout_ms=50))
    sink.start()
    with caplog.at_level(logging.WARNING):
        feed(sink, fake_lines(250), per_s=1000)
        sink.close(timeout=10)
    endpoint.close()
    said = [r.getMessage() for r in caplog.records if "400" in r.getMessage()]
    print(f"requests {len(endpoint.statuses)}, dropped {sink.dropped}, log lines {said}")
    assert len(endpoint.statuses) >= 3 and sink.retries == 0, "a 4xx is not retried"
    assert sink.dropped == 250 and sink.written == 0 and sink.lost == 250
    assert len(said) == 1 and "400 Bad Request" in said[0]


def test_unreachable_endpoint_buffers_then_drops_and_counts(tmp_path) -> None:
    endpoint = Endpoint()
    url = endpoint.url
    endpoint.close()  # nothing listens there any more: connection refused
    sink = HttpSink(HttpSinkConfig(url=url, batch_size=10, batch_timeout_ms=10, queue_size=20, timeout_s=1))
    sink.start()
    feed(sink, fake_lines(100), per_s=1000)
    sink.close(timeout=1)
    assert sink.written == 0 and sink.dropped == 100 and sink.retries >= 1


def test_a_hanging_endpoint_times_out_and_is_retried(tmp_path) -> None:
    calls: list[float] = []

    def answer(_t: float) -> int:
        calls.append(time.monotonic())
        if len(calls) == 1:
            time.sleep(2.0)  # hangs past the client's timeout; what it answers then goes nowhere
            return 503
        return 200

    endpoint = Endpoint(answer)
    sink = HttpSink(HttpSinkConfig(url=endpoint.url, batch_size=10, batch_timeout_ms=10, timeout_s=0.5))
    sink.start()
    t0 = time.monotonic()
    feed(sink, fake_lines(10), per_s=1000)
    sink.close(timeout=10)
    endpoint.close()
    print(f"delivered {sink.written}/10 after {sink.retries} retry in {time.monotonic() - t0:.1f} s")
    assert sink.written == 10 and sink.retries == 1 and endpoint.frames() == list(range(10))
    assert calls[1] - calls[0] < 1.8, "the client gave up after timeout_s, not when the server answered"


def test_sinks_close_in_parallel_within_one_timeout(tmp_path) -> None:
    from streamd.sinks import SinkSet

    endpoint = Endpoint()
    url = endpoint.url
    endpoint.close()  # two webhooks that never answer: each gives up at the close timeout
    cfg = HttpSinkConfig(url=url, batch_size=1, batch_timeout_ms=0, timeout_s=0.2, retry_max_s=0.2)
    sinks = SinkSet([HttpSink(cfg), HttpSink(cfg)])
    sinks.start()
    for line in fake_lines(5):
        sinks.submit(line, "demo")
    t0 = time.monotonic()
    sinks.close(timeout=2)
    took = time.monotonic() - t0
    print(f"two failing sinks closed in {took:.1f} s")
    assert took < 3.5 and sinks.dropped == 10
