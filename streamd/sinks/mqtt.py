"""MQTT sink (paho-mqtt): each JSON line published to ``topic`` with ``{stream}`` replaced by the stream id.

paho's network thread connects, keeps alive and reconnects with backoff (1 s doubling up to
``reconnect_max_s``). The writer thread publishes from the sink's bounded queue only while connected and
while fewer than ``_WINDOW`` messages wait for their acknowledgement, so paho never holds more than that: a
broker outage fills the sink's queue, then ``submit`` drops and counts — inference never waits.

Accounting (QoS >= 1): a line counts as ``written`` when the broker acknowledged it; lines paho had in flight
when the connection dropped are sent again after the reconnect (at-least-once: a subscriber may see one twice
and should key on stream + frame); new lines wait until those are acknowledged, so per-stream order holds.
With QoS 0 a line written into a connection that then dies is lost without being counted.

Per stream, ``status_topic`` gets a retained word that follows the stream's health (``stream_health``, once
a second from the supervisor, published on change): ``online`` while it delivers (also with its first line),
``degraded`` while it is down (refused, reconnecting, stale, failed, its worker restarting), ``offline`` when
it ended, a reload removed it, or at close; ``<status_topic>/detail`` gets the same as retained JSON with the
state, the reason and the last error. ``availability_topic`` gets a retained ``online`` on every connect and
``offline`` at close, and the same ``offline`` is the last will the broker publishes if streamd dies. After a
reconnect every stream's status is sent again (a broker without persistence forgot its retained messages).

With ``home_assistant.enabled`` the writer thread also publishes Home Assistant discovery messages and the
sensors' states (``streamd.sinks.ha_discovery``): each stream's status, object counts and line counters.

A broker that cannot be reached (refused, unknown host, no answer: from the start or for longer than
``_DOWN_S`` later) is logged once and the sink counts as broken (``stats()["broken"]``, the metric
``streamd_sink_broken``) until it connects; lines wait in the queue meanwhile. The password is never logged.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import queue
import socket
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from streamd.config import Config
from streamd.config.sinks import MqttSinkConfig
from streamd.exitcodes import EX_CONFIG, StartupError
from streamd.sinks.base import _CLOSE, LineSink
from streamd.sinks.ha_discovery import Discovery

log = logging.getLogger(__name__)

_WINDOW = 100  # messages published but not yet acknowledged, at most
_OFFLINE = "\x00offline"  # queue item (stream_id, _OFFLINE): a reload removed the stream
_DOWN_S = 10.0  # not connected this long (a broker that accepts and never answers): counted as broken
# stream health (status.stream_health) -> the word on the status topic
_WORDS = {"ok": "online", "down": "degraded", "ended": "offline"}


def read_password(cfg: MqttSinkConfig) -> str | None:
    """The password from ``password_file`` (first line) or ``password_env``; None when neither is set."""
    if cfg.password_file is not None:
        try:
            text = cfg.password_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise StartupError(
                f"sink mqtt: cannot read password_file {cfg.password_file}: {exc.strerror or exc}", EX_CONFIG
            ) from None
        return text.splitlines()[0] if text else ""
    if cfg.password_env:
        value = os.environ.get(cfg.password_env)
        if value is None:
            raise StartupError(
                f"sink mqtt: password_env names {cfg.password_env}, which is not set in the environment",
                EX_CONFIG,
            )
        return value
    return None


class MqttSink(LineSink):
    kind = "mqtt"

    def __init__(self, cfg: MqttSinkConfig) -> None:
        super().__init__(
            f"mqtt:{cfg.host}:{cfg.port}", cfg.queue_size, skip_empty=cfg.skip_empty, drops_ok=cfg.drops_ok
        )
        self.cfg = cfg
        self.connects = 0
        self.disconnects = 0
        self._client: Any = None
        self._cond = threading.Condition()  # notified by paho's thread: connected, disconnected, acknowledged
        self._connected = False
        self._resend_first = False  # after a reconnect: let paho resend what was in flight before new lines
        self._down_since: float | None = time.monotonic()
        self._inflight: collections.deque[tuple[Any, bool]] = (
            collections.deque()
        )  # (MQTTMessageInfo, is_line)
        self._status: dict[str, str] = {}  # stream -> the word last published on its status topic
        self._detail: dict[str, str] = {}  # stream -> the JSON last published on its detail topic
        self._health_lock = threading.Lock()
        self._wanted: dict[str, tuple[str, str]] = {}  # stream -> (word, detail JSON) from stream_health
        self._wanted_gen = self._applied_gen = 0
        self._republish = False  # a reconnect: send every stream's status again (a broker may have lost it)
        self._unreachable: str | None = None  # why the broker cannot be reached (None: connected or trying)
        self._started = time.monotonic()
        self._deadline = float("inf")
        self._ha = Discovery(cfg.home_assistant, cfg) if cfg.home_assistant.enabled else None

    # -- start/close ---------------------------------------------------------------------------------

    def _open(self) -> None:
        import paho.mqtt.client as mqtt  # imported only when an mqtt sink is configured

        cfg = self.cfg
        password = read_password(cfg)
        client_id = cfg.client_id or f"streamd-{socket.gethostname()}-{os.getpid()}"
        client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=mqtt.MQTTv311,
            clean_session=True,
        )
        if cfg.username or password is not None:
            client.username_pw_set(cfg.username or None, password)
        if cfg.tls:
            try:
                client.tls_set(ca_certs=str(cfg.ca_file) if cfg.ca_file else None)
            except (OSError, ValueError) as exc:
                raise StartupError(f"sink mqtt: TLS setup failed: {exc}", EX_CONFIG) from None
        client.will_set(cfg.availability_topic, "offline", qos=1, retain=True)
        client.reconnect_delay_set(1, max(1, round(cfg.reconnect_max_s)))
        client.max_inflight_messages_set(_WINDOW)
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_publish = self._on_publish
        client.connect_async(cfg.host, cfg.port, keepalive=cfg.keepalive_s)
        self._started = time.monotonic()
        client.loop_start()  # paho's thread: connect, then reconnect with backoff for as long as we run
        self._client = client

    def wait_usable(self, timeout: float) -> str | None:
        """Wait up to ``timeout`` for the first connection: None once connected, else why not (a reload
        says so; the sink stays, counted as broken, and keeps trying)."""
        end = time.monotonic() + timeout
        with self._cond:
            while not self._connected and self._unreachable is None and time.monotonic() < end:
                self._cond.wait(min(0.05, max(0.0, end - time.monotonic())))
            if self._connected:
                return None
            return self._unreachable or f"no answer from the broker within {timeout:g} s"

    def close(self, timeout: float = 10.0) -> None:
        self._deadline = time.monotonic() + timeout
        with self._cond:
            self._cond.notify_all()
        super().close(timeout)
        client = self._client
        if client is not None:
            client.loop_stop()
            self._client = None

    def configured(self, config: Config) -> None:
        """The running streams: Home Assistant discovery announces them (the writer thread publishes)."""
        if self._ha is not None:
            self._ha.configured(config)

    def stream_removed(self, stream_id: str) -> None:
        """Queued behind the stream's last lines: its retained status becomes offline."""
        try:
            self._q.put_nowait((stream_id, _OFFLINE))
        except queue.Full:
            self.log_once("offline-full", logging.WARNING, "queue full: %s not marked offline", stream_id)

    # -- paho callbacks (paho's network thread; never call into paho while holding self._cond) ---------

    def _on_connect(self, client: Any, _userdata: Any, _flags: Any, reason: Any, _props: Any) -> None:
        if reason.is_failure:
            self._cannot_reach(f"the broker refused the connection: {reason}")
            return
        client.publish(self.cfg.availability_topic, "online", qos=1, retain=True)
        with self._cond:
            self.connects += 1
            down = None if self._down_since is None else time.monotonic() - self._down_since
            unreachable, self._unreachable = self._unreachable, None
            self._connected, self._down_since = True, None
            self._republish = self.connects > 1
            self._cond.notify_all()
        if self.connects == 1 and unreachable is not None:
            log.warning("sink %s: connected after %.1f s; no longer broken", self.name, down or 0)
        elif self.connects == 1:
            log.info("sink %s: connected", self.name)
        else:
            log.warning(
                "sink %s: reconnected after %.1f s; %d line(s) dropped so far",
                self.name,
                down or 0,
                self.dropped,
            )

    def _on_connect_fail(self, _client: Any, _userdata: Any) -> None:
        """paho's thread, inside its ``except OSError`` around the TCP/TLS connect: the error is at hand."""
        exc = sys.exc_info()[1]
        why = (exc.strerror or str(exc)) if isinstance(exc, OSError) else "connection failed"
        self._cannot_reach(f"cannot reach the broker: {why or type(exc).__name__}")

    def _cannot_reach(self, why: str) -> None:
        """Log once per outage (not per retry); counted as broken until a connect succeeds."""
        with self._cond:
            first = self._unreachable is None
            self._unreachable = why
            self._cond.notify_all()
        if first and not self._stop.is_set():
            ever = "" if self.connects == 0 else " again"
            log.error(
                "sink %s: %s; counted as broken until it connects%s (retrying with backoff up to %g s; up to "
                "%d line(s) wait in the queue, later ones are dropped and counted)",
                self.name, why, ever, self.cfg.reconnect_max_s, self.cfg.queue_size,
            )  # fmt: skip

    def _check_down(self) -> None:
        """The writer thread: a broker that accepts and never answers calls no callback; say so after
        ``_DOWN_S``."""
        since = self._down_since
        if self._connected or since is None or self._unreachable is not None or self._stop.is_set():
            return
        if time.monotonic() - max(since, self._started) >= _DOWN_S:
            self._cannot_reach(f"no connection to the broker for {_DOWN_S:g} s")

    def _on_disconnect(self, _client: Any, _userdata: Any, _flags: Any, reason: Any, _props: Any) -> None:
        with self._cond:
            was = self._connected
            self._connected, self._resend_first = False, True
            if self._down_since is None:
                self._down_since = time.monotonic()
            self._cond.notify_all()
        if was and not self._stop.is_set():
            self.disconnects += 1
            log.warning(
                "sink %s: connection lost (%s); reconnecting with backoff, buffering up to %d line(s)",
                self.name,
                reason,
                self.cfg.queue_size,
            )

    def _on_publish(self, *_args: Any) -> None:
        with self._cond:
            self._cond.notify_all()

    # -- the writer thread ---------------------------------------------------------------------------

    def stream_health(self, per_stream: Mapping[str, Mapping[str, Any]]) -> None:
        """Each stream's health (the supervisor's snapshot, once a second): the writer thread publishes the
        changes on the retained status topics. Streams not listed keep what they have (a removed stream is
        marked offline by ``stream_removed`` once its last line is out)."""
        wanted = {}
        for sid, s in per_stream.items():
            health = str(s.get("health") or "")
            word = _WORDS.get(health)
            if word is None:  # starting (or a snapshot without health): nothing known yet
                continue
            detail = {
                "status": word,
                "health": health,
                "state": s.get("state"),
                "reason": s.get("health_reason") or None,
                "last_error": s.get("last_error") or None,
            }
            wanted[sid] = (word, json.dumps(detail, separators=(",", ":")))
        with self._health_lock:
            if wanted != self._wanted:
                self._wanted = wanted
                self._wanted_gen += 1

    def _apply_health(self) -> None:
        """The writer thread: publish each stream's status that changed since it was last published."""
        if not self._connected or len(self._inflight) >= _WINDOW:
            return
        if self._republish:  # retained messages of a broker without persistence are gone after its restart
            self._republish = False
            for sid, word in list(self._status.items()):
                topic = self._topic(self.cfg.status_topic, sid)
                if sid in self._detail:
                    self._publish(topic + "/detail", self._detail[sid], False, retain=True)
                self._publish(topic, word, False, retain=True)
            self._publish_ha(self._ha.republish() if self._ha is not None else [])
        if self._ha is not None:
            self._publish_ha(self._ha.drain())
        if self._wanted_gen == self._applied_gen:
            return
        with self._health_lock:
            wanted, self._applied_gen = dict(self._wanted), self._wanted_gen
        for sid, (word, detail) in wanted.items():
            self._set_status(sid, word, detail)

    def _set_status(self, sid: str, word: str, detail: str | None = None) -> None:
        """Publish the stream's retained status word (and detail JSON) where it changed."""
        if detail is None:
            detail = json.dumps({"status": word}, separators=(",", ":"))
        topic = self._topic(self.cfg.status_topic, sid)
        if self._detail.get(sid) != detail:  # first: a subscriber that sees the word change finds it there
            self._detail[sid] = detail
            self._publish(topic + "/detail", detail, False, retain=True)
        if self._status.get(sid) != word:
            self._status[sid] = word
            self._publish(topic, word, False, retain=True)

    def _serve(self) -> None:
        while True:
            self._reap()
            self._check_down()
            self._apply_health()
            item = self._get(timeout=0.5)
            if item is None:
                continue
            if item is _CLOSE:
                break
            stream_id, line = item
            if line is _OFFLINE:
                with self._health_lock:  # health must not bring it back
                    self._wanted.pop(stream_id, None)
                if stream_id in self._status and self._wait_until_sendable():
                    self._set_status(stream_id, "offline")
                    del self._status[stream_id]
                    self._detail.pop(stream_id, None)
                if self._ha is not None:  # its entities are deleted (unless it is configured again)
                    self._ha.removed(stream_id)
                continue
            if not self._wait_until_sendable():
                self._dropped_out += 1
                continue
            if stream_id not in self._status:  # its first line; later, health decides
                self._set_status(stream_id, "online")
            self._publish(self._topic(self.cfg.topic, stream_id), line.rstrip("\n"), True)
            if self._ha is not None:
                self._publish_ha(self._ha.frame(stream_id, line))
        self._finish()

    def _publish_ha(self, messages: list[tuple[str, str]]) -> None:
        """Home Assistant's discovery and state messages: retained, QoS 1, not counted as lines."""
        for topic, payload in messages:
            self._publish(topic, payload, False, retain=True)

    def _topic(self, template: str, stream_id: str) -> str:
        return template.replace("{stream}", stream_id)

    def _publish(self, topic: str, payload: str, is_line: bool, retain: bool = False) -> None:
        import paho.mqtt.client as mqtt

        info = self._client.publish(topic, payload, qos=self.cfg.qos if is_line else 1, retain=retain)
        queued_for_reconnect = info.rc == mqtt.MQTT_ERR_NO_CONN and self.cfg.qos > 0
        if info.rc == mqtt.MQTT_ERR_SUCCESS or queued_for_reconnect or not is_line:
            self._inflight.append((info, is_line))
        else:
            self._dropped_out += 1
            self.log_once(
                f"publish:{info.rc}", logging.ERROR, "publish failed: %s", mqtt.error_string(info.rc)
            )

    def _reap(self) -> None:
        """Count acknowledged messages, oldest first."""
        while self._inflight and _published(self._inflight[0][0]):
            _, is_line = self._inflight.popleft()
            if is_line:
                self.written += 1

    def _wait_until_sendable(self) -> bool:
        """Block the writer (never the pipeline) until connected, resends done and the window has room.
        False when close()'s deadline passed first."""
        while True:
            self._reap()  # outside self._cond: paho may hold a message's lock while it calls _on_publish
            with self._cond:
                if self._connected and self._resend_first and not self._inflight:
                    self._resend_first = False
                if self._connected and not self._resend_first and len(self._inflight) < _WINDOW:
                    return True
                left = self._deadline - time.monotonic()
            self._check_down()
            with self._cond:
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05 if self._inflight else 0.5))

    def _finish(self) -> None:
        """Mark streams and this streamd offline, wait for acknowledgements until the deadline, disconnect."""
        if self._connected:
            for sid in sorted(self._status):
                self._set_status(sid, "offline")
            self._publish(self.cfg.availability_topic, "offline", False, retain=True)
        end = min(self._deadline, time.monotonic() + 30)
        while True:
            self._reap()
            with self._cond:
                if not self._inflight or time.monotonic() >= end:
                    break
                self._cond.wait(0.05)
        unacked = sum(1 for _, is_line in self._inflight if is_line)
        if unacked:
            self._dropped_out += unacked
            self.log_once(
                "unacked", logging.ERROR, "%d line(s) not acknowledged by the broker at exit", unacked
            )
        self._inflight.clear()
        if self._client is not None:
            self._client.disconnect()

    def stats(self) -> dict:
        """``broken`` also while the broker cannot be reached (until it connects)."""
        return {
            **super().stats(),
            "broken": self.broken or self._unreachable,
            "connected": self._connected,
            "reconnects": max(0, self.connects - 1),
        }


def _published(info: Any) -> bool:
    """paho's MQTTMessageInfo.is_published() raises for a message queued while disconnected; read the flag."""
    with info._condition:
        return bool(info._published)
