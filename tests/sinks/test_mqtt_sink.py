"""MQTT sink against a real broker (mosquitto): every demo line in order; a broker outage loses exactly the
lines the sink counted as dropped."""

from __future__ import annotations

import json
import threading
import time

import paho.mqtt.client as mqtt
import pytest

from streamd.config.sinks import MqttSinkConfig
from streamd.exitcodes import EX_CONFIG, StartupError
from streamd.sinks.mqtt import MqttSink
from tests.conftest import SHORT_FRAMES, run_streamd
from tests.sinks._helpers import Endpoint, config_with_sinks, fake_lines


class Subscriber:
    """A persistent-session subscriber (QoS 1): messages published while it reconnects are queued for it."""

    def __init__(self, port: int, topic: str = "streamd/#") -> None:
        self.messages: list[tuple[str, bytes, bool]] = []
        self.connected = threading.Event()
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id="test-sub",
            clean_session=False,
            protocol=mqtt.MQTTv311,
        )
        self.client.reconnect_delay_set(1, 1)
        self.client.on_connect = lambda c, *_: (c.subscribe(topic, qos=1), self.connected.set())
        self.client.on_message = lambda _c, _u, m: self.messages.append((m.topic, m.payload, m.retain))
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        assert self.connected.wait(10)
        time.sleep(0.2)  # the SUBACK

    def frames(self, topic: str) -> list[int]:
        return [json.loads(p)["frame"] for t, p, _ in self.messages if t == topic]

    def last(self, topic: str) -> bytes | None:
        found = [p for t, p, _ in self.messages if t == topic]
        return found[-1] if found else None

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_demo_lines_reach_mqtt_and_a_webhook_in_order(tmp_path, broker, assets, short_clip) -> None:
    """One run of the demo clip's first SHORT_FRAMES pictures into both network sinks."""
    n = SHORT_FRAMES
    sub = Subscriber(broker.port)
    endpoint = Endpoint()
    sinks = (
        f"  - type: mqtt\n    host: 127.0.0.1\n    port: {broker.port}\n    qos: 1\n"
        f"  - type: http\n    url: {endpoint.url}\n    batch_size: 64\n    batch_timeout_ms: 200\n"
    )
    cfg = config_with_sinks(tmp_path / "m.yaml", sinks, clip=short_clip, stream_id="demo")
    proc = run_streamd("run", str(cfg), "--no-status", timeout=600)
    endpoint.close()
    assert proc.returncode == 0, proc.stderr[-2000:]
    sizes = [len(b) for b in endpoint.batches]
    print(f"webhook: {len(endpoint.frames())}/{n} lines in {len(sizes)} batches (largest {max(sizes)})")
    assert endpoint.frames() == list(range(n)) and len(sizes) > 1 and max(sizes) <= 64
    topic = "streamd/demo/detections"
    assert wait_for(lambda: len(sub.frames(topic)) >= n, 20)
    sub.close()
    frames = sub.frames(topic)
    print(f"received {len(frames)}/{n} on {topic}")
    assert frames == list(range(n)), "every line once, in order"
    assert sub.last("streamd/demo/status") == b"offline" and sub.last("streamd/status") == b"offline"
    assert b"online" in [p for t, p, _ in sub.messages if t == "streamd/demo/status"]


def test_broker_outage_loses_exactly_the_counted_drops(tmp_path, broker) -> None:
    sub = Subscriber(broker.port)
    cfg = MqttSinkConfig(host="127.0.0.1", port=broker.port, qos=1, queue_size=100, reconnect_max_s=1)
    sink = MqttSink(cfg)
    sink.start()
    lines = fake_lines(795)
    t0 = time.monotonic()
    outage = None
    took: list[float] = []
    for i, line in enumerate(lines):  # 795 lines at 40 per second, like a live camera
        time.sleep(max(0.0, t0 + i / 40 - time.monotonic()))
        if i == 200:
            broker.stop()
            outage = time.monotonic()
        if outage is not None and time.monotonic() - outage >= 10 and broker.proc is None:
            broker.start()
        t = time.monotonic()
        sink.submit(line, "demo")
        took.append(time.monotonic() - t)
    # submit never blocks: a blocked one would wait out the 10-s outage (about half the lines fall in it). On
    # a loaded CI box a thread can still miss the GIL for a few hundred ms now and then (0.39 s seen once).
    took.sort()
    assert took[-1] < 2.0 and took[int(0.99 * len(took))] < 0.1, took[-10:]
    assert broker.proc is not None, "the broker came back before the end"
    sink.close(timeout=30)
    stats = sink.stats()
    topic = "streamd/demo/detections"
    assert wait_for(lambda: len(set(sub.frames(topic))) >= stats["written"], 30), broker.log()
    sub.close()
    received = set(sub.frames(topic))
    dups = len(sub.frames(topic)) - len(received)
    print(
        f"sent 795, received {len(received)} (+{dups} duplicate redeliveries), counted drops "
        f"{stats['dropped']}, reconnects {stats['reconnects']}"
    )
    assert stats["reconnects"] >= 1 and stats["dropped"] > 0
    assert len(received) + stats["dropped"] == 795
    assert stats["written"] == len(received)
    assert sorted(received)[-1] == 794, "delivery resumed after the outage"


def test_password_is_required_to_exist_and_never_logged(tmp_path, broker, caplog, monkeypatch) -> None:
    cfg = MqttSinkConfig(host="127.0.0.1", port=broker.port, username="u", password_env="STREAMD_TEST_PW")
    with pytest.raises(StartupError) as info:
        MqttSink(cfg).start()
    assert info.value.code == EX_CONFIG and "STREAMD_TEST_PW" in str(info.value)
    monkeypatch.setenv("STREAMD_TEST_PW", "s3cret-pw")
    caplog.set_level("DEBUG")
    sink = MqttSink(cfg)
    sink.start()
    for line in fake_lines(5):
        sink.submit(line, "demo")
    sink.close(timeout=5)
    assert sink.written == 5
    assert "s3cret-pw" not in caplog.text


def make_tls_files(folder) -> dict:
    """A throwaway CA and a server certificate for 127.0.0.1 (openssl CLI)."""
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed: cannot make a test certificate")
    files = {
        k: folder / f"{k}" for k in ("ca.key", "ca.crt", "server.key", "server.csr", "server.crt", "san")
    }
    files["san"].write_text("subjectAltName=IP:127.0.0.1\n")
    for cmd in (
        f"req -x509 -newkey rsa:2048 -nodes -keyout {files['ca.key']} -out {files['ca.crt']} -days 1 "
        "-subj /CN=streamd-test-ca",
        f"req -newkey rsa:2048 -nodes -keyout {files['server.key']} -out {files['server.csr']} "
        "-subj /CN=127.0.0.1",
        f"x509 -req -in {files['server.csr']} -CA {files['ca.crt']} -CAkey {files['ca.key']} -CAcreateserial "
        f"-out {files['server.crt']} -days 1 -extfile {files['san']}",
    ):
        subprocess.run(["openssl", *cmd.split()], check=True, capture_output=True)
    return files


def test_tls_and_a_password_file(tmp_path, caplog) -> None:
    import subprocess

    from tests.sinks.conftest import Broker

    tls = make_tls_files(tmp_path)
    passwords = tmp_path / "passwd"
    passwords.write_text("")
    subprocess.run(["mosquitto_passwd", "-b", str(passwords), "cam", "pa55-word"], check=True)
    broker = Broker(
        tmp_path,
        f"allow_anonymous false\npassword_file {passwords}\ncafile {tls['ca.crt']}\n"
        f"certfile {tls['server.crt']}\nkeyfile {tls['server.key']}\n",
    )
    broker.start()
    try:
        secret = tmp_path / "mqtt-password"
        secret.write_text("pa55-word\n")
        cfg = MqttSinkConfig(
            host="127.0.0.1",
            port=broker.port,
            tls=True,
            ca_file=tls["ca.crt"],
            username="cam",
            password_file=secret,
        )
        caplog.set_level("DEBUG")
        sink = MqttSink(cfg)
        sink.start()
        for line in fake_lines(20):
            sink.submit(line, "door")
        sink.close(timeout=10)
        print(f"over TLS with a password: {sink.written}/20 acknowledged")
        assert sink.written == 20 and sink.dropped == 0 and sink.connects == 1
        assert "pa55-word" not in caplog.text
    finally:
        broker.stop()


def test_a_removed_stream_goes_offline_after_its_last_line(tmp_path, broker) -> None:
    sub = Subscriber(broker.port)
    sink = MqttSink(MqttSinkConfig(host="127.0.0.1", port=broker.port))
    sink.start()
    for line in fake_lines(30, stream="gone"):
        sink.submit(line, "gone")
    sink.stream_removed("gone")  # a reload removed it
    for line in fake_lines(5, stream="stays"):
        sink.submit(line, "stays")
    assert wait_for(lambda: sub.last("streamd/gone/status") == b"offline", 10)
    assert sub.last("streamd/stays/status") == b"online"
    order = [(t, p) for t, p, _ in sub.messages if t.startswith("streamd/gone/")]
    assert (
        order[-1] == ("streamd/gone/status", b"offline") and len(sub.frames("streamd/gone/detections")) == 30
    )
    sink.close(timeout=10)
    sub.close()


def test_the_broker_publishes_the_last_will_when_streamd_dies(tmp_path, broker) -> None:
    import subprocess
    import sys

    from tests.conftest import ROOT

    sub = Subscriber(broker.port)
    script = (
        "import os, sys, time\n"
        "from streamd.config.sinks import MqttSinkConfig\n"
        "from streamd.sinks.mqtt import MqttSink\n"
        "sink = MqttSink(MqttSinkConfig(host='127.0.0.1', port=int(sys.argv[1])))\n"
        "sink.start()\n"
        "deadline = time.monotonic() + 10\n"
        "while sink.connects == 0 and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        "time.sleep(0.5)\n"
        "os._exit(9)  # dies: no DISCONNECT, no offline of its own\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(broker.port)], cwd=ROOT, timeout=60)
    assert proc.returncode == 9
    assert wait_for(lambda: sub.last("streamd/status") == b"offline", 10), sub.messages
    states = [p for t, p, _ in sub.messages if t == "streamd/status"]
    sub.close()
    print(f"streamd/status: {states}")
    assert states[-2:] == [b"online", b"offline"]


def _unreachable_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "cannot reach the broker" in r.getMessage()]


def test_a_broker_unreachable_from_the_start_is_logged_once_and_broken_until_it_connects(
    tmp_path, caplog
) -> None:
    """Nothing listens on the broker's port for the first seconds (several reconnect attempts): one log
    line, ``broken`` in the stats (``streamd_sink_broken``) until mosquitto starts there; then the queued
    lines go."""
    from tests.sinks.conftest import Broker

    broker = Broker(tmp_path)  # its port, not started yet
    caplog.set_level("INFO")
    sink = MqttSink(MqttSinkConfig(host="127.0.0.1", port=broker.port, reconnect_max_s=1))
    t0 = time.monotonic()
    sink.start()
    try:
        assert wait_for(lambda: sink.stats()["broken"], 20), "counted as broken"
        t_broken = time.monotonic() - t0
        for line in fake_lines(20):
            sink.submit(line, "demo")
        time.sleep(4)  # a few more failed attempts (1 s apart): still one line
        said = _unreachable_lines(caplog)
        assert len(said) == 1 and f"mqtt:127.0.0.1:{broker.port}" in said[0], said
        assert "Connection refused" in said[0] and "counted as broken" in said[0]
        assert sink.stats()["broken"] and sink.stats()["connected"] is False
        broker.start()
        sub = Subscriber(broker.port)
        assert wait_for(lambda: sink.stats()["connected"], 20), broker.log()
        assert sink.stats()["broken"] is None
        assert wait_for(lambda: sink.written == 20, 20)
        print(f"broken {t_broken:.2f} s after start; log: {said[0]!r}; then {sink.written}/20 delivered")
        assert "connected after" in caplog.text and len(_unreachable_lines(caplog)) == 1
    finally:
        sink.close(timeout=5)
        broker.stop()
    sub.close()


def test_a_broker_that_accepts_and_never_answers_counts_as_broken(tmp_path, caplog, monkeypatch) -> None:
    """TCP accepted, no CONNACK ever: paho calls no callback; the writer says so after ``_DOWN_S``."""
    import socket

    import streamd.sinks.mqtt as mqtt_sink

    monkeypatch.setattr(mqtt_sink, "_DOWN_S", 1.0)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    caplog.set_level("INFO")
    sink = MqttSink(MqttSinkConfig(host="127.0.0.1", port=silent.getsockname()[1]))
    sink.start()
    try:
        assert wait_for(lambda: sink.stats()["broken"], 15), sink.stats()

        def said() -> list[str]:
            return [r.getMessage() for r in caplog.records if "no connection to the broker" in r.getMessage()]

        # the writer counts the sink broken, then logs (outside its lock): the line may come a moment later
        assert wait_for(lambda: said(), 5), caplog.text
        time.sleep(1.5)  # more than _DOWN_S: a second line would be here by now
        print(said())
        assert len(said()) == 1 and "counted as broken" in said()[0]
    finally:
        sink.close(timeout=2)
        silent.close()


def _health(health: str, state: str, reason: str = "", error: str = "") -> dict:
    return {"health": health, "state": state, "health_reason": reason, "last_error": error}


def test_the_retained_status_follows_the_stream_health_published_on_change(tmp_path, broker) -> None:
    sub = Subscriber(broker.port)
    sink = MqttSink(MqttSinkConfig(host="127.0.0.1", port=broker.port))
    sink.start()
    ok = _health("ok", "running")
    refused = _health("down", "reconnecting", "reconnecting: connection refused", "connection refused")
    try:
        for line in fake_lines(3, stream="cam"):  # the first line: online
            sink.submit(line, "cam")
        assert wait_for(lambda: sub.last("streamd/cam/status") == b"online", 10)
        starting = _health("starting", "starting")  # nothing known yet: nothing published
        rounds = [{"cam": ok, "new": starting}] * 3 + [{"cam": refused, "new": refused}] * 3
        for per_stream in [*rounds, {"cam": ok, "new": refused}, {"cam": ok, "new": refused}]:
            sink.stream_health(per_stream)
            time.sleep(0.3)
        for line in fake_lines(3, stream="cam"):  # lines of a stream that is online change nothing
            sink.submit(line, "cam")
        assert wait_for(lambda: sub.last("streamd/new/status") == b"degraded", 10)
        assert wait_for(lambda: len(sub.frames("streamd/cam/detections")) == 6, 10)
        time.sleep(1.0)
        words = [p for t, p, _ in sub.messages if t == "streamd/cam/status"]
        print(f"cam: {words}; new: {[p for t, p, _ in sub.messages if t == 'streamd/new/status']}")
        assert words == [b"online", b"degraded", b"online"], "published on change only"
        assert [p for t, p, _ in sub.messages if t == "streamd/new/status"] == [b"degraded"]
        detail = json.loads(sub.last("streamd/new/status/detail"))
        assert detail == {
            "status": "degraded",
            "health": "down",
            "state": "reconnecting",
            "reason": "reconnecting: connection refused",
            "last_error": "connection refused",
        }
    finally:
        sink.close(timeout=10)
    assert wait_for(lambda: sub.last("streamd/new/status") == b"offline", 10), "offline at close"
    assert sub.last("streamd/cam/status") == b"offline"
    sub.close()


def test_the_status_is_sent_again_after_the_broker_lost_it(tmp_path, broker) -> None:
    """A broker restarted without its persistence file has forgotten the retained statuses: after the
    reconnect the sink publishes each stream's status again."""
    sink = MqttSink(MqttSinkConfig(host="127.0.0.1", port=broker.port, reconnect_max_s=1))
    sink.start()
    refused = _health("down", "reconnecting", "reconnecting: connection refused", "connection refused")
    try:
        sink.stream_health({"cam": _health("ok", "running"), "door": refused})
        first = Subscriber(broker.port)
        assert wait_for(lambda: first.last("streamd/door/status") == b"degraded", 10)
        first.close()
        broker.stop()
        (broker.folder / "mosquitto.db").unlink(missing_ok=True)
        broker.start()
        assert wait_for(lambda: sink.connects == 2, 20), broker.log()
        fresh = Subscriber(broker.port)  # sees only what is retained now
        assert wait_for(lambda: fresh.last("streamd/door/status") == b"degraded", 10), fresh.messages
        assert wait_for(lambda: fresh.last("streamd/cam/status") == b"online", 10)
        assert json.loads(fresh.last("streamd/door/status/detail"))["state"] == "reconnecting"
        fresh.close()
    finally:
        sink.close(timeout=5)
