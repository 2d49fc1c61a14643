"""MQTT sink (paho-mqtt): each JSON line published to ``topic`` with ``{stream}`` replaced by the stream id.

paho's network thread connects, keeps alive and reconnects with backoff (1 s doubling up to
``reconnect_max_s``). The writer thread publishes from the sink's bounded queue only while connected and
while fewer than ``_WINDOW`` messages wait for their acknowledgement, so paho never holds more than that: a
broker outage fills the sink's queue, then ``submit`` drops and counts — inference never waits.

Accounting (QoS >= 1): a line counts as ``written`` when the broker acknowledged it; lines paho had in flight
when the connection dropped are sent again after the reconnect (at-least-once: a subscriber may see one twice
and should key on stream + frame); new lines wait until those are acknowledged, so per-stream order holds.
With QoS 0 a line written into a connection that then dies is lost without being counted.

Per stream, ``status_topic`` gets a retained ``online`` with the stream's first line and ``offline`` at close;
``availability_topic`` gets a retained ``online`` on every connect and ``offline`` at close, and the same
``offline`` is the last will the broker publishes if streamd dies. The password is never logged.
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import socket
import threading
import time
from typing import Any

from streamd.config.sinks import MqttSinkConfig
from streamd.exitcodes import EX_CONFIG, StartupError
from streamd.sinks.base import _CLOSE, LineSink

log = logging.getLogger(__name__)

_WINDOW = 100  # messages published but not yet acknowledged, at most
_OFFLINE = "\x00offline"  # queue item (stream_id, _OFFLINE): a reload removed the stream


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
        self._online: set[str] = set()
        self._deadline = float("inf")

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
        client.on_disconnect = self._on_disconnect
        client.on_publish = self._on_publish
        client.connect_async(cfg.host, cfg.port, keepalive=cfg.keepalive_s)
        client.loop_start()  # paho's thread: connect, then reconnect with backoff for as long as we run
        self._client = client

    def close(self, timeout: float = 10.0) -> None:
        self._deadline = time.monotonic() + timeout
        with self._cond:
            self._cond.notify_all()
        super().close(timeout)
        client = self._client
        if client is not None:
            client.loop_stop()
            self._client = None

    def stream_removed(self, stream_id: str) -> None:
        """Queued behind the stream's last lines: its retained status becomes offline."""
        try:
            self._q.put_nowait((stream_id, _OFFLINE))
        except queue.Full:
            self.log_once("offline-full", logging.WARNING, "queue full: %s not marked offline", stream_id)

    # -- paho callbacks (paho's network thread; never call into paho while holding self._cond) ---------

    def _on_connect(self, client: Any, _userdata: Any, _flags: Any, reason: Any, _props: Any) -> None:
        if reason.is_failure:
            self.log_once(f"refused:{reason}", logging.ERROR, "the broker refused the connection: %s", reason)
            return
        client.publish(self.cfg.availability_topic, "online", qos=1, retain=True)
        with self._cond:
            self.connects += 1
            down = None if self._down_since is None else time.monotonic() - self._down_since
            self._connected, self._down_since = True, None
            self._cond.notify_all()
        if self.connects == 1:
            log.info("sink %s: connected", self.name)
        else:
            log.warning(
                "sink %s: reconnected after %.1f s; %d line(s) dropped so far",
                self.name,
                down or 0,
                self.dropped,
            )

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

    def _serve(self) -> None:
        while True:
            self._reap()
            item = self._get(timeout=0.5)
            if item is None:
                continue
            if item is _CLOSE:
                break
            stream_id, line = item
            if line is _OFFLINE:
                if stream_id in self._online and self._wait_until_sendable():
                    self._online.discard(stream_id)
                    self._publish(
                        self._topic(self.cfg.status_topic, stream_id), "offline", False, retain=True
                    )
                continue
            if not self._wait_until_sendable():
                self._dropped_out += 1
                continue
            if stream_id not in self._online:
                self._online.add(stream_id)
                self._publish(self._topic(self.cfg.status_topic, stream_id), "online", False, retain=True)
            self._publish(self._topic(self.cfg.topic, stream_id), line.rstrip("\n"), True)
        self._finish()

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
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05 if self._inflight else 0.5))

    def _finish(self) -> None:
        """Mark streams and this streamd offline, wait for acknowledgements until the deadline, disconnect."""
        if self._connected:
            for sid in sorted(self._online):
                self._publish(self._topic(self.cfg.status_topic, sid), "offline", False, retain=True)
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
        return {**super().stats(), "connected": self._connected, "reconnects": max(0, self.connects - 1)}


def _published(info: Any) -> bool:
    """paho's MQTTMessageInfo.is_published() raises for a message queued while disconnected; read the flag."""
    with info._condition:
        return bool(info._published)
