"""The one HTTP port (default 127.0.0.1:9108): ``/metrics``, ``/healthz``, the status page and its JSON,
per-stream JPEG snapshots, and the control API under ``/api/`` when enabled (``streamd.supervisor.api``);
what they say is built in ``streamd.supervisor.metrics`` from the supervisor's snapshot, read at request
time. One daemon thread per request; each connection's socket has a timeout, and a request body is read
only when its Content-Length is within the API's bound."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from streamd.supervisor.metrics import (
    STREAM_DOWN,
    FrameSnapshot,
    Snapshot,
    _registry,
    health,
    stream_health,
    stream_stalled,
)

log = logging.getLogger("streamd.supervisor.metrics")

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

    from streamd.supervisor.api import ControlApi

_API_ROUTES = ("/api/streams", "/api/events")  # /api/status stays the status page's (read-only, no token)


class _RateLimitedSnapshots:
    """At most ``per_s`` JPEG encodes per stream per second (a cached JPEG is served in between), one at a
    time across all streams: a page left open or a refresh loop cannot load the daemon."""

    def __init__(self, source: FrameSnapshot, per_s: float) -> None:
        self._source = source
        self._min_gap = 1.0 / per_s
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, bytes | None]] = {}

    def get(self, stream_id: str) -> bytes | None:
        with self._lock:
            hit = self._cache.get(stream_id)
            if hit is not None and time.monotonic() - hit[0] < self._min_gap:
                return hit[1]
            jpeg = self._source(stream_id)
            self._cache[stream_id] = (time.monotonic(), jpeg)
            return jpeg


class MetricsServer:
    """The HTTP endpoint. ``snapshot()`` returns the dict described in the module docstring;
    ``frame_snapshot(stream_id)`` returns a JPEG of the stream's latest frame with boxes (or None)."""

    def __init__(
        self,
        host: str,
        port: int,
        snapshot: Snapshot,
        *,
        frame_snapshot: FrameSnapshot | None = None,
        status_page: bool = True,
        snapshots_per_s: float = 2.0,
        stream_down: str = "degraded",
        api: ControlApi | None = None,
    ) -> None:
        if stream_down not in STREAM_DOWN:
            raise ValueError(f"stream_down: expected one of {', '.join(STREAM_DOWN)}, got {stream_down!r}")
        self.stream_down = stream_down
        self._snapshot = snapshot
        self._frames = _RateLimitedSnapshots(frame_snapshot, snapshots_per_s) if frame_snapshot else None
        self._registry: CollectorRegistry | None = None  # made on the first scrape
        self._status_page = status_page
        self._api = api
        server = self

        class Handler(BaseHTTPRequestHandler):
            # A client that sends nothing (or half a request) holds its thread this long, at most.
            timeout = api.cfg.timeout_s if api is not None else 30.0

            def do_GET(self) -> None:
                with contextlib.suppress(BrokenPipeError, ConnectionResetError, TimeoutError):  # client left
                    if server._is_api(self):
                        server._api_request(self)
                    else:
                        server._get(self)

            def do_POST(self) -> None:
                self._change()

            do_PUT = do_PATCH = do_DELETE = do_POST

            def _change(self) -> None:
                with contextlib.suppress(BrokenPipeError, ConnectionResetError, TimeoutError):
                    if server._is_api(self):
                        server._api_request(self)
                    else:
                        server._reply(self, 405, b"only GET here\n", "text/plain")

            def log_message(self, *_args: object) -> None:  # keep request noise out of the daemon's log
                pass

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self._httpd.timeout = 5
        self.address = self._httpd.server_address
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="metrics", daemon=True)

    def _get(self, handler: BaseHTTPRequestHandler) -> None:
        path = handler.path.split("?", 1)[0]
        if path == "/metrics":
            try:
                from prometheus_client import generate_latest
            except ImportError:
                self._reply(handler, 503, b"prometheus-client is not installed\n", "text/plain")
                return
            if self._registry is None:
                self._registry = _registry(self._snapshot)
            body = generate_latest(self._registry)
            self._reply(handler, 200, body, "text/plain; version=0.0.4; charset=utf-8")
        elif path == "/healthz":
            ok, info = self.health()
            self._reply(handler, 200 if ok else 503, json.dumps(info).encode(), "application/json")
        elif path == "/api/status" and self._status_page:
            self._reply(handler, 200, json.dumps(self.status()).encode(), "application/json")
        elif path == "/" and self._status_page:
            from streamd.web.page import STATUS_PAGE

            self._reply(handler, 200, STATUS_PAGE.encode(), "text/html; charset=utf-8")
        elif path.startswith("/streams/") and path.endswith("/snapshot.jpg") and self._status_page:
            sid = unquote(path[len("/streams/") : -len("/snapshot.jpg")])
            known = sid in self._snapshot().get("per_stream", {})
            jpeg = self._frames.get(sid) if self._frames is not None and known else None
            if jpeg is None:
                why = "unknown stream" if not known else "no frame yet"
                self._reply(handler, 404, f"{why}: {sid}\n".encode(), "text/plain")
            else:
                self._reply(handler, 200, jpeg, "image/jpeg", cache=False)
        else:
            self._reply(handler, 404, b"not found: try /, /metrics or /healthz\n", "text/plain")

    def _is_api(self, handler: BaseHTTPRequestHandler) -> bool:
        path = handler.path.split("?", 1)[0]
        return self._api is not None and any(path == r or path.startswith(r + "/") for r in _API_ROUTES)

    def _api_request(self, handler: BaseHTTPRequestHandler) -> None:
        """Read the body within the API's bound, hand the request to the API, write its JSON answer."""
        api = self._api
        assert api is not None
        body: bytes | None = None
        if handler.command in ("POST", "PUT", "PATCH"):
            length = handler.headers.get("Content-Length")
            if handler.headers.get("Transfer-Encoding") or length is None or not length.isdigit():
                self._api_reply(handler, 411, {"error": "send the body with a Content-Length"}, close=True)
                return
            if int(length) > api.cfg.max_body_bytes:  # never read it: the connection closes after the answer
                why = f"body of {length} bytes; at most {api.cfg.max_body_bytes} (metrics.api.max_body_bytes)"
                self._api_reply(handler, 413, {"error": why}, close=True)
                return
            body = handler.rfile.read(int(length))
            if len(body) < int(length):
                return  # the client went away mid-body
        peer = f"{handler.client_address[0]}:{handler.client_address[1]}"
        reply = api.handle(handler.command, handler.path, handler.headers, body, peer)
        self._api_reply(handler, reply.code, reply.body, reply.headers)

    @staticmethod
    def _api_reply(
        handler: BaseHTTPRequestHandler,
        code: int,
        body: dict[str, Any],
        headers: Any = None,
        close: bool = False,
    ) -> None:
        data = (json.dumps(body) + "\n").encode()
        handler.send_response(code)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.send_header("Cache-Control", "no-store")
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        if close:
            handler.send_header("Connection", "close")
            handler.close_connection = True
        handler.end_headers()
        handler.wfile.write(data)

    def health(self) -> tuple[bool, dict]:
        return health(self._snapshot(), self.stream_down)

    def status(self) -> dict:
        """What the status page shows: one row per stream."""
        snap = self._snapshot()
        rows = []
        for sid, s in snap.get("per_stream", {}).items():
            total = s.get("latency", {}).get("total")
            h, reason = stream_health(s)
            age = s.get("last_packet_age_s")
            rows.append(
                {
                    "id": sid,
                    "state": s.get("state"),
                    "health": h,
                    "reason": reason or None,
                    "stale": bool(s.get("stale")),
                    "last_packet_age_s": round(float(age), 1) if age is not None else None,
                    "last_error": s.get("last_error") or None,
                    "stalled": stream_stalled(s),
                    "fps": round(float(s.get("fps", 0.0)), 1),
                    "decoded": s.get("decoded", 0),
                    "dropped": s.get("dropped", 0),
                    "reconnects": s.get("reconnects", 0),
                    "latency_ms": round(total["sum"] / total["count"], 1)
                    if total and total["count"]
                    else None,
                    "worker": s.get("worker"),
                    "crossings": s.get("crossings", {}),  # streams[].lines: {line: {class: {direction: n}}}
                }
            )
        _ok, info = health(snap, self.stream_down)
        return {
            "results": snap.get("results", 0),
            "uptime_s": round(float(snap.get("elapsed_s", 0.0)), 1),
            "stalled": bool(snap.get("stalled")),
            "health": info["status"],
            "down_streams": info["down_streams"],
            "streams": rows,
            "cluster": snap.get("cluster"),  # nodes, their streams, lease ages, moves (None: no cluster)
        }

    @staticmethod
    def _reply(
        handler: BaseHTTPRequestHandler, code: int, body: bytes, ctype: str, cache: bool = False
    ) -> None:
        handler.send_response(code)
        handler.send_header("Content-Type", ctype)
        handler.send_header("Content-Length", str(len(body)))
        if not cache:
            handler.send_header("Cache-Control", "no-store")
        handler.end_headers()
        handler.wfile.write(body)

    def start(self) -> None:
        self._thread.start()
        log.info("metrics and status page on http://%s:%d/", *self.address[:2])

    def close(self) -> None:
        if self._thread.is_alive():  # shutdown() would wait forever for a loop that never started
            self._httpd.shutdown()
        self._httpd.server_close()
