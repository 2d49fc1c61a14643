"""Metrics and health over HTTP on a loopback port: ``GET /metrics`` (Prometheus text), ``GET /healthz``.

Standard library only, one daemon thread; the numbers come from a snapshot function the daemon provides, so
this module knows nothing about the pipeline. ``/healthz`` answers 200 while results keep coming (or no
stream is running), 503 when the snapshot says the pipeline is stalled (no result for a while although
streams are running).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger(__name__)

Snapshot = Callable[[], dict]


def _family(name: str, kind: str, help_text: str, samples: Mapping[str, float], label: str = "") -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    for key, value in samples.items():
        lines.append(f'{name}{{{label}="{key}"}} {value}' if label else f"{name} {value}")
    return lines


def render(snapshot: dict) -> str:
    """Prometheus exposition text for a daemon snapshot."""
    per_stream = snapshot.get("per_stream", {})
    lines = _family(
        "streamd_frames_total", "counter", "Frames whose results were produced.", {"": snapshot["results"]}
    )
    lines += _family(
        "streamd_uptime_seconds",
        "gauge",
        "Seconds since the daemon started.",
        {"": round(snapshot["elapsed_s"], 3)},
    )
    for key, help_text in (
        ("decoded", "Frames decoded."),
        ("dropped", "Decoded frames dropped because the pipeline was behind."),
        ("decode_errors", "Packets the decoder rejected."),
        ("read_errors", "Demux/read failures."),
    ):
        samples = {sid: s[key] for sid, s in per_stream.items()}
        lines += _family(f"streamd_stream_{key}_total", "counter", help_text, samples, "stream")
    up = {sid: int(s["state"] == "running") for sid, s in per_stream.items()}
    lines += _family("streamd_stream_up", "gauge", "1 while the stream is delivering frames.", up, "stream")
    lines += _family(
        "streamd_sink_dropped_total", "counter", "Lines a sink dropped.", snapshot.get("sinks", {}), "sink"
    )
    return "\n".join(lines) + "\n"


class MetricsServer:
    def __init__(self, host: str, port: int, snapshot: Snapshot) -> None:
        self._snapshot = snapshot
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/metrics":
                    server._reply(self, 200, render(server._snapshot()), "text/plain; version=0.0.4")
                elif self.path == "/healthz":
                    ok, body = server.health()
                    server._reply(self, 200 if ok else 503, json.dumps(body), "application/json")
                else:
                    server._reply(self, 404, "not found: try /metrics or /healthz\n", "text/plain")

            def log_message(self, *_args) -> None:  # keep request noise out of the daemon's log
                pass

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self._httpd.timeout = 5
        self.address = self._httpd.server_address
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="metrics", daemon=True)

    def health(self) -> tuple[bool, dict]:
        snap = self._snapshot()
        ok = not snap.get("stalled", False)
        running = [sid for sid, s in snap.get("per_stream", {}).items() if s["state"] == "running"]
        return ok, {"ok": ok, "results": snap["results"], "running_streams": running}

    @staticmethod
    def _reply(handler: BaseHTTPRequestHandler, code: int, body: str, ctype: str) -> None:
        data = body.encode()
        handler.send_response(code)
        handler.send_header("Content-Type", ctype)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def start(self) -> None:
        self._thread.start()
        log.info("metrics on http://%s:%d/metrics", *self.address[:2])

    def close(self) -> None:
        if self._thread.is_alive():  # shutdown() would wait forever for a loop that never started
            self._httpd.shutdown()
        self._httpd.server_close()
