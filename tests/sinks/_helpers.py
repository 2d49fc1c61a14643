"""Shared by the sink tests: configs that run the real CLI, demo-like lines, a free port."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from tests.conftest import CLIP, CLIP_HEVC
from tests.test_reference_detections import NANODET_MODEL

__all__ = ["CLIP", "CLIP_HEVC", "config_with_sinks", "fake_lines", "free_port"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config_with_sinks(
    path: Path,
    sinks_yaml: str,
    *,
    clip: Path = CLIP_HEVC,
    live: bool = False,
    stream_id: str = "cam",
    extra: str = "",
) -> Path:
    """A config with one stream (``live``: realtime + loop, runs until stopped) and the given sinks."""
    stream = f"  - id: {stream_id}\n    url: {clip}\n"
    if live:
        stream += "    realtime: true\n    loop: true\n"
    path.write_text(f"streams:\n{stream}{NANODET_MODEL}\nsinks:\n{sinks_yaml}{extra}")
    return path


def fake_lines(n: int, stream: str = "demo", every_empty: int = 3) -> list[str]:
    """``n`` result lines shaped like the daemon's (every ``every_empty``-th frame has no detections)."""
    out = []
    for i in range(n):
        dets = (
            []
            if i % every_empty == 0
            else [{"class_id": 0, "label": "person", "score": 0.9, "box": [1.0, 2.0, 30.0, 40.0]}]
        )
        rec = {
            "v": 1,
            "stream": stream,
            "frame": i,
            "pts": i / 10,
            "time": 1.0 + i,
            "width": 768,
            "height": 576,
            "latency_ms": {"total": 5.0},
            "detections": dets,
        }
        out.append(json.dumps(rec, separators=(",", ":")) + "\n")
    return out


class Endpoint:
    """A real HTTP server (http.server in a thread) that records the JSON batches POSTed to it.

    ``answer(elapsed_s)`` gives the status for a request arriving ``elapsed_s`` after the first one."""

    def __init__(self, answer=lambda _t: 200) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.batches: list[list[dict]] = []
        self.statuses: list[int] = []
        self.answer = answer
        self._t0: float | None = None
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                import time

                body = self.rfile.read(int(self.headers["Content-Length"]))
                now = time.monotonic()
                if endpoint._t0 is None:
                    endpoint._t0 = now
                status = endpoint.answer(now - endpoint._t0)
                endpoint.statuses.append(status)
                if status == 200:
                    assert self.headers["Content-Type"] == "application/json"
                    endpoint.batches.append(json.loads(body))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def frames(self) -> list[int]:
        return [rec["frame"] for batch in self.batches for rec in batch]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
