"""Line counters outside the daemon's lines: they add up over every process that carried a stream (like its
other counters), and a real HTTP server on loopback serves them in ``/metrics``, in ``/api/status`` and in
the status page's table (a real headless browser)."""

from __future__ import annotations

import json
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from streamd.protocol import StreamReport, StreamTotals, fold
from streamd.supervisor import status
from streamd.supervisor.server import MetricsServer
from tests.web.test_status_page import browser, wait_for  # noqa: F401 (the fixture)

CROSSINGS = {"street": {"person": {"in": 14, "out": 18}, "car": {"in": 2}}, "gate": {"person": {"out": 1}}}


def snapshot() -> dict:
    demo = {"state": "running", "last_packet_age_s": 0.1, "fps": 10.0, "crossings": CROSSINGS}
    plain = {"state": "running", "last_packet_age_s": 0.1, "fps": 10.0}
    per_stream = {"demo": demo, "plain": plain}
    for s in per_stream.values():
        s["health"], s["health_reason"], s["stale"] = status.stream_health(s)
    return {"results": 10, "elapsed_s": 3.0, "per_stream": per_stream}


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return reply.read().decode()


def test_crossings_add_up_over_the_processes_that_carried_a_stream() -> None:
    first = StreamReport("ended", crossings={("street", "person", "in"): 3, ("street", "person", "out"): 1})
    second = StreamReport("running", crossings={("street", "person", "in"): 2, ("gate", "car", "out"): 1})
    totals: dict[str, StreamTotals] = {}
    fold(totals, {"demo": first.totals})
    fold(totals, {"demo": second.totals})
    assert totals["demo"].crossings == {
        ("street", "person", "in"): 5,
        ("street", "person", "out"): 1,
        ("gate", "car", "out"): 1,
    }


def test_metrics_and_api_status_serve_the_line_counters() -> None:
    server = MetricsServer("127.0.0.1", 0, snapshot)
    server.start()
    base = f"http://127.0.0.1:{server.address[1]}"
    try:
        families = {f.name: f for f in text_string_to_metric_families(get(f"{base}/metrics"))}
        samples = {
            (s.labels["stream"], s.labels["line"], s.labels["class"], s.labels["direction"]): s.value
            for s in families["streamd_line_crossings"].samples
        }
        assert families["streamd_line_crossings"].type == "counter"
        assert samples == {
            ("demo", "street", "person", "in"): 14,
            ("demo", "street", "person", "out"): 18,
            ("demo", "street", "car", "in"): 2,
            ("demo", "gate", "person", "out"): 1,
        }
        rows = {r["id"]: r for r in json.loads(get(f"{base}/api/status"))["streams"]}
        assert rows["demo"]["crossings"] == CROSSINGS and rows["plain"]["crossings"] == {}
    finally:
        server.close()


def test_the_status_page_shows_the_line_counters(browser) -> None:  # noqa: F811 (the fixture)
    server = MetricsServer("127.0.0.1", 0, snapshot)
    server.start()
    try:
        browser.get(f"http://127.0.0.1:{server.address[1]}/")
        script = (
            "const out = {}; const heads = Array.from(document.querySelectorAll('#streams th'))"
            "  .map(th => th.textContent); const k = heads.indexOf('lines (in / out)');"
            "for (const r of document.querySelectorAll('#streams tbody tr'))"
            "  out[r.id] = r.querySelectorAll('td')[k].textContent;"
            "return k < 0 ? null : out;"
        )
        cells = wait_for(lambda: (found := browser.execute_script(script)) and len(found) == 2 and found, 15)
        assert cells == {
            "stream-demo": "street person 14 / 18; street car 2 / 0; gate person 0 / 1",
            "stream-plain": "–",
        }, cells
    finally:
        server.close()
