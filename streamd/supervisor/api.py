"""The control API (``metrics.api``), served on the metrics port by ``streamd.supervisor.server``.

- ``GET /api/streams`` (and ``/api/streams/{id}``): the running streams, their source (``config`` or
  ``api``), state and health.
- ``POST /api/streams``: add a stream (the body: one ``streams:`` item as JSON, or YAML with a YAML
  content type); ``PUT /api/streams/{id}``: replace its settings; ``PATCH /api/streams/{id}``: change some
  (JSON Merge Patch: null deletes a key); ``DELETE /api/streams/{id}``: remove it. Each is checked with the
  config's own rules and messages (a 400 names the key path and the fix; nothing changes) and applied with
  reload's rules (``StreamMoves.edit_streams``): only the touched stream starts or stops.
- ``POST /api/streams/{id}/clip``: ask for an event clip of the stream (501 when clips are not available).
- ``GET /api/events?since=&limit=&stream=``: the recent event lines, from a bounded in-memory ring; ``since``
  is the ``next`` of the previous answer (each event carries its ``seq``).

Threads: requests are parsed and checked in the HTTP server's threads; a change is handed to the supervisor's
main loop through a bounded queue (``apply_pending``, on its 4 Hz tick) and the request waits, at most
``timeout_s``, for the outcome. The main loop never waits on a request. What wins between the config file
and the state file: ``streamd.supervisor.api_state``.
"""

from __future__ import annotations

import collections
import hmac
import json
import logging
import queue
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import parse_qs, unquote

from streamd.config import Config, ConfigError, StreamConfig, redact_url
from streamd.config._yaml import load_yaml
from streamd.config.metrics import ApiConfig
from streamd.exitcodes import EX_CONFIG, StartupError
from streamd.supervisor.api_state import (
    Overlay,
    apply_overlay,
    check_stream,
    file_streams,
    load_state,
    merge_patch,
    save_state,
)

log = logging.getLogger("streamd.supervisor.api")

_EVENT_MARK = '"type":"event"'  # how an event line reads (compact JSON, made in worker.output)
_PENDING = 16  # changes waiting for the main loop, at most
_CONCURRENT = 8  # API requests served at once, at most
_YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")


class Host(Protocol):
    """What the API needs of the supervisor."""

    @property
    def config(self) -> Config: ...

    @property
    def api_ready(self) -> bool:
        """Every worker is ready: changes apply now (like a reload, they wait for start-up)."""
        ...

    def snapshot(self) -> dict: ...

    def change_streams(self, streams: tuple[StreamConfig, ...]) -> str:
        """Main loop: run ``streams`` from now on (reload's rules); returns what was applied, one line."""
        ...

    def request_clip(self, stream_id: str) -> tuple[bool, str | None]:
        """A clip of the stream, now (any thread): (its worker answered, the clip's path or None)."""
        ...


class Headers(Protocol):
    """A request's headers (``email.message.Message``: names case-insensitive)."""

    def get(self, name: str, /) -> str | None: ...


@dataclass(frozen=True)
class Reply:
    code: int
    body: dict[str, Any]
    headers: Mapping[str, str] = field(default_factory=dict)


def _error(code: int, message: str, **more: Any) -> Reply:
    return Reply(code, {"error": message, **more})


class EventRing:
    """The newest ``size`` event lines, numbered from 1 in arrival order (``tap`` is called for every line
    by the sinks' fan-out, from the worker reader threads)."""

    def __init__(self, size: int) -> None:
        self._ring: collections.deque[tuple[int, dict]] = collections.deque(maxlen=size)
        self._seq = 0
        self._lock = threading.Lock()

    def tap(self, line: str, _stream_id: str) -> None:
        if _EVENT_MARK not in line:  # frame lines: one substring test, no parse
            return
        try:
            event = json.loads(line)
        except ValueError:
            return
        with self._lock:
            self._seq += 1
            self._ring.append((self._seq, event))

    def read(self, since: int, limit: int, stream: str | None = None) -> tuple[list[dict], int]:
        """Events after ``since`` (oldest first, at most ``limit``) and the ``since`` of the next call."""
        with self._lock:
            found = [
                {"seq": seq, **e}
                for seq, e in self._ring
                if seq > since and (stream is None or e.get("stream") == stream)
            ]
            newest = self._seq
        found = found[:limit]
        return found, (found[-1]["seq"] if len(found) == limit else max(newest, since))


@dataclass
class _Change:
    """One add/replace/remove on its way to the main loop."""

    kind: str  # "add", "replace" or "remove"
    stream_id: str
    raw: dict[str, Any] | None  # the settings as given (None: remove)
    stream: StreamConfig | None
    in_file: bool  # the config file lists this id (a removal is then kept as a null entry)
    done: threading.Event = field(default_factory=threading.Event)
    reply: Reply | None = None


def control_api(config: Config, host: Host) -> tuple[ControlApi | None, Config, StartupError | None]:
    """The supervisor's API (None when ``metrics.api`` is off) and the config to plan the workers with (the
    state file's streams applied); a problem comes back as the StartupError to raise once the run starts."""
    if not (config.metrics.enabled and config.metrics.api.enabled):
        return None, config, None
    try:
        api = ControlApi(config.metrics.api, host)
        return api, api.start_config(config), None
    except StartupError as exc:
        return None, config, exc


class ControlApi:
    def __init__(self, cfg: ApiConfig, host: Host) -> None:
        self.cfg = cfg
        self.host = host
        self.token = _read_token(cfg)
        try:
            self.overlay: Overlay = load_state(cfg.state_file) if cfg.state_file is not None else {}
        except ConfigError as exc:
            raise StartupError("\n".join(exc.problems), EX_CONFIG) from None
        self.events = EventRing(cfg.events)
        self._pending: queue.Queue[_Change] = queue.Queue(maxsize=_PENDING)
        self._slots = threading.BoundedSemaphore(_CONCURRENT)

    # -- start-up and reload ---------------------------------------------------------------------------
    def start_config(self, config: Config) -> Config:
        """The config to start with: the state file's streams applied (they win for their ids)."""
        if not self.overlay:
            return config
        label = str(self.cfg.state_file)
        try:
            merged = apply_overlay(config, self.overlay, label)
        except ConfigError as exc:
            raise StartupError("\n".join(exc.problems), EX_CONFIG) from None
        listed = set(config.stream_ids)
        kept = sorted(sid for sid in self.overlay if sid in listed)
        if kept:  # said once: an edit of these streams in the config file has no effect until then
            log.warning(
                "api: %s overrides the config file for stream(s) %s (changed or removed through the API); "
                "delete their entries there to go back to the config file's",
                label,
                ", ".join(kept),
            )
        return merged

    # -- requests (HTTP server threads) ----------------------------------------------------------------
    def handle(self, method: str, target: str, headers: Headers, body: bytes | None, peer: str) -> Reply:
        path, _, query = target.partition("?")
        if not self._authorized(headers, method, path, peer):
            return Reply(401, {"error": "missing or wrong bearer token"}, {"WWW-Authenticate": "Bearer"})
        if not self._slots.acquire(blocking=False):
            return Reply(503, {"error": "too many API requests at once; try again"}, {"Retry-After": "1"})
        try:
            return self._route(method, path, parse_qs(query), headers, body)
        finally:
            self._slots.release()

    def _authorized(self, headers: Headers, method: str, path: str, peer: str) -> bool:
        if not self.token:
            return True
        scheme, _, given = (headers.get("Authorization") or "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.token.encode()):
            return True
        why = "wrong bearer token" if given else "no bearer token"
        log.warning("api: %s: refused %s %s (%s)", peer, method, path, why)
        return False

    def _route(
        self,
        method: str,
        path: str,
        query: dict[str, list[str]],
        headers: Headers,
        body: bytes | None,
    ) -> Reply:
        parts = [unquote(p) for p in path.strip("/").split("/")][1:]  # after "api"
        if parts == ["events"] and method == "GET":
            return self._events(query)
        if not parts or parts[0] != "streams" or len(parts) > 3:
            return _error(404, f"not found: {path}; try /api/streams or /api/events")
        if len(parts) == 1:
            if method == "GET":
                return Reply(200, {"streams": self._rows()})
            if method == "POST":
                return self._add(headers, body)
            return Reply(405, {"error": f"{method} {path}: use GET or POST"}, {"Allow": "GET, POST"})
        sid = parts[1]
        if len(parts) == 3:
            if parts[2] == "clip" and method == "POST":
                return self._clip(sid)
            return _error(404, f"not found: {path}; POST /api/streams/{{id}}/clip asks for a clip")
        if method == "GET":
            row = next((r for r in self._rows() if r["id"] == sid), None)
            if row is None:
                return _error(404, f"no stream {sid!r}")
            settings = self.overlay.get(sid) or file_streams(self.host.config).get(sid) or {}
            return Reply(200, {**row, "settings": _redacted(settings)})
        if method in ("PUT", "PATCH"):
            return self._replace(sid, headers, body, patch=method == "PATCH")
        if method == "DELETE":
            return self._remove(sid)
        allow = "GET, PUT, PATCH, DELETE"
        return Reply(405, {"error": f"{method} {path}: use {allow}"}, {"Allow": allow})

    def _rows(self) -> list[dict[str, Any]]:
        config, per_stream = self.host.config, self.host.snapshot().get("per_stream", {})
        rows = []
        for s in config.streams:
            st = per_stream.get(s.id, {})
            rows.append(
                {
                    "id": s.id,
                    "url": s.redacted_url,
                    "source": "api" if s.id in self.overlay else "config",
                    "state": st.get("state"),
                    "health": st.get("health"),
                    "fps": round(float(st.get("fps", 0.0)), 1),
                    "decoded": st.get("decoded", 0),
                    "worker": st.get("worker"),
                }
            )
        return rows

    def _events(self, query: dict[str, list[str]]) -> Reply:
        try:
            since = _int_arg(query, "since", 0, 0, 2**62)
            limit = _int_arg(query, "limit", 100, 1, 1000)
        except ValueError as exc:
            return _error(400, str(exc))
        stream = query.get("stream", [None])[-1]
        events, nxt = self.events.read(since, limit, stream)
        return Reply(200, {"events": events, "next": nxt})

    def _clip(self, sid: str) -> Reply:
        stream = next((s for s in self.host.config.streams if s.id == sid), None)
        if stream is None:
            return _error(404, f"no stream {sid!r}")
        clips = stream.clips
        if not clips.enabled or "api" not in clips.on:
            why = "has no clips" if not clips.enabled else "has clips, but not on api requests"
            return _error(501, f"stream {sid!r} {why}; add a clips: section (dir:, and api in its on: list)")
        answered, path = self.host.request_clip(sid)
        if not answered:
            return _error(504, f"the worker carrying {sid!r} did not answer; try again")
        if path is None:
            return Reply(
                503, {"error": f"nothing of {sid!r} is buffered yet; try again"}, {"Retry-After": "2"}
            )
        note = f"written once {clips.post_roll_s:g} s of post-roll have passed (an event then may extend it)"
        return Reply(202, {"stream": sid, "clip": path, "note": note})

    def _add(self, headers: Headers, body: bytes | None) -> Reply:
        raw, bad = _parse_body(headers, body)
        if bad is not None:
            return bad
        stream, problems = check_stream(raw, self.host.config)
        if stream is None:
            return _error(400, "invalid stream; nothing changed", problems=problems)
        if stream.id in self.host.config.stream_ids:
            return _conflict(stream.id)
        in_file = stream.id in file_streams(self.host.config)
        return self._submit(_Change("add", stream.id, raw, stream, in_file), 201)

    def _replace(self, sid: str, headers: Headers, body: bytes | None, *, patch: bool) -> Reply:
        config = self.host.config
        if sid not in config.stream_ids:
            return _error(404, f"no stream {sid!r}; POST /api/streams adds one")
        raw, bad = _parse_body(headers, body)
        if bad is not None:
            return bad
        assert isinstance(raw, dict)  # _parse_body answers 400 for anything else
        listed = file_streams(config)
        if patch:
            base = self.overlay.get(sid) or listed.get(sid)
            if base is None:
                return _error(409, f"the settings of {sid!r} cannot be read back from the config file; "
                              "PUT the whole stream instead")  # fmt: skip
            raw = merge_patch(base, raw)
        if raw.setdefault("id", sid) != sid:
            return _error(400, "invalid stream; nothing changed", problems=[
                f"id: the URL names stream {sid!r} but the body says {raw['id']!r}; leave id out or make "
                "them equal (to rename: POST the new one, then DELETE the old one)"])  # fmt: skip
        stream, problems = check_stream(raw, config)
        if stream is None:
            return _error(400, "invalid stream; nothing changed", problems=problems)
        return self._submit(_Change("replace", sid, raw, stream, sid in listed), 200)

    def _remove(self, sid: str) -> Reply:
        config = self.host.config
        if sid not in config.stream_ids:
            return _error(404, f"no stream {sid!r}")
        return self._submit(_Change("remove", sid, None, None, sid in file_streams(config)), 200)

    def _submit(self, change: _Change, code: int) -> Reply:
        if not self.host.api_ready:
            return Reply(
                503, {"error": "streamd is starting; try again once it is ready"}, {"Retry-After": "2"}
            )
        try:
            self._pending.put_nowait(change)
        except queue.Full:
            return Reply(503, {"error": "too many changes waiting; try again"}, {"Retry-After": "1"})
        if not change.done.wait(self.cfg.timeout_s):
            return _error(504, f"not applied within {self.cfg.timeout_s:g} s; it is queued and applies later")
        assert change.reply is not None
        return change.reply if change.reply.code >= 300 else Reply(code, change.reply.body)

    # -- the supervisor's main loop --------------------------------------------------------------------
    def apply_pending(self) -> None:
        """Apply the changes waiting, in order (called on each tick once every worker is ready)."""
        while True:
            try:
                change = self._pending.get_nowait()
            except queue.Empty:
                return
            try:
                change.reply = self._apply(change)
            except Exception:  # a change must never take the running streams down
                log.exception("api: applying %s of stream %s failed", change.kind, change.stream_id)
                change.reply = _error(500, "applying the change failed; see the daemon's log")
            finally:
                change.done.set()

    def _apply(self, change: _Change) -> Reply:
        config, sid = self.host.config, change.stream_id
        ids = config.stream_ids
        if change.kind == "add" and sid in ids:  # another request added it meanwhile
            return _conflict(sid)
        if change.kind != "add" and sid not in ids:
            return _error(404, f"no stream {sid!r}")
        if change.kind == "remove" and len(ids) == 1:
            return _error(409, f"{sid!r} is the last stream; streamd needs at least one (add another first)")
        overlay = dict(self.overlay)
        if change.kind == "remove" and not change.in_file:
            overlay.pop(sid, None)  # added through the API: nothing of it stays
        else:
            overlay[sid] = change.raw
        if change.stream is None:
            streams = tuple(s for s in config.streams if s.id != sid)
        elif change.kind == "add":
            streams = (*config.streams, change.stream)
        else:
            streams = tuple(change.stream if s.id == sid else s for s in config.streams)
        if self.cfg.state_file is not None:
            try:
                save_state(self.cfg.state_file, overlay)
            except OSError as exc:
                log.error("api: cannot write %s: %s; the change was not applied", self.cfg.state_file, exc)
                return _error(500, f"cannot write the state file ({exc.strerror or exc}); nothing changed")
        self.overlay = overlay
        applied = self.host.change_streams(streams)
        log.info("api: %s %s: %s", change.kind, sid, applied)
        row = next((r for r in self._rows() if r["id"] == sid), {"id": sid, "removed": True})
        return Reply(200, {"applied": applied, "stream": row})


def _redacted(settings: Mapping[str, Any]) -> dict[str, Any]:
    """A stream's settings as given, its URL's credentials hidden."""
    url = settings.get("url")
    return {**settings, "url": redact_url(url)} if isinstance(url, str) else dict(settings)


def _conflict(sid: str) -> Reply:
    return _error(
        409, f"stream {sid!r} exists; PUT or PATCH /api/streams/{sid} changes it, or pick another id"
    )


def _parse_body(headers: Headers, body: bytes | None) -> tuple[Any, Reply | None]:
    """The body as data: JSON, or YAML when the content type says so (the config's YAML reader, strict:
    duplicate keys are refused). A mapping, or a 400 saying what is wrong."""
    if not body:
        return None, _error(400, "empty body; send the stream's settings as a JSON object")
    ctype = (headers.get("Content-Type") or "application/json").split(";", 1)[0].strip().lower()
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, _error(400, f"the body is not UTF-8 (bad byte at offset {exc.start})")
    if ctype in _YAML_TYPES:
        try:
            data, _marks, dups = load_yaml(text, "body")
        except ConfigError as exc:
            return None, _error(400, "malformed YAML; nothing changed", problems=list(exc.problems))
        if dups:
            return None, _error(
                400, "invalid stream; nothing changed", problems=[f"{p}: {m}" for p, m in dups]
            )
    elif ctype in ("application/json", "text/json", "application/x-www-form-urlencoded"):  # curl -d's
        try:
            data = json.loads(text)
        except ValueError as exc:
            return None, _error(400, f"malformed JSON: {exc}; nothing changed")
    else:
        return None, _error(415, f"content type {ctype!r}: send application/json or application/yaml")
    if not isinstance(data, dict):
        return None, _error(
            400, 'expected a JSON object (one stream: {"id": ..., "url": ...}); nothing changed'
        )
    return data, None


def _int_arg(query: dict[str, list[str]], name: str, default: int, low: int, high: int) -> int:
    raw = query.get(name)
    if not raw:
        return default
    try:
        value = int(raw[-1])
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise ValueError(f"{name}: expected an integer from {low} to {high}, got {raw[-1]!r}")
    return value


def _read_token(cfg: ApiConfig) -> str:
    if cfg.token_file is None:
        return cfg.token
    try:
        text = cfg.token_file.read_text(encoding="utf-8")
    except OSError as exc:
        raise StartupError(
            f"metrics.api.token_file: cannot read {cfg.token_file}: {exc.strerror or exc}", EX_CONFIG
        ) from None
    token = text.splitlines()[0].strip() if text.strip() else ""
    if not token:
        raise StartupError(
            f"metrics.api.token_file: {cfg.token_file} is empty; put the token on its first line", EX_CONFIG
        )
    return token
