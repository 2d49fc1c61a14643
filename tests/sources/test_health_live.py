"""Issue 24 point 4, a hung camera: the real daemon (``python -m streamd run``) on a real RTSP server
(GStreamer) that is then SIGSTOPped — the connection stays open and nothing more arrives. With the source's
own timeouts set long (``read_timeout_s``/``stall_timeout_s`` 60 s) the stream stays ``running``; only its
last packet's age grows. It must show as down (stale) after ``metrics.stale_after_s`` (5 s by default), long
before those 60 s: ``/healthz`` degraded naming it, ``/api/status`` (the status page) marking it stale,
``/metrics`` up 0, the MQTT retained status ``degraded``; after SIGCONT everything says online again. A
refused camera beside it is down all along, a file stream keeps the daemon ``degraded`` (not every stream
down)."""

from __future__ import annotations

import json
import shutil
import signal
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import start_streamd
from tests.sinks.conftest import Broker
from tests.sources.conftest import CLIP, free_port
from tests.test_health import Retained, get
from tests.test_reference_detections import NANODET_MODEL

SOURCE_TIMEOUT_S = 60  # the camera's read and stall timeouts: the source itself notices nothing before that


@pytest.mark.slow
def test_a_hung_camera_goes_stale_long_before_its_stall_timeout(tmp_path, rtsp_server, assets) -> None:
    if shutil.which("mosquitto") is None:
        pytest.fail("mosquitto is not installed (Debian package mosquitto; .ci/system-packages installs it)")
    (tmp_path / "broker").mkdir()
    broker = Broker(tmp_path / "broker")
    broker.start()
    server = rtsp_server()
    port = free_port()
    cfg = tmp_path / "hung.yaml"
    cfg.write_text(
        f"streams:\n"
        f"  - id: demo\n    url: {CLIP}\n    realtime: true\n    loop: true\n    detect_fps: 2\n"
        f"  - id: cam\n    url: {server.url}\n    detect_fps: 2\n"
        f"    read_timeout_s: {SOURCE_TIMEOUT_S}\n    stall_timeout_s: {SOURCE_TIMEOUT_S}\n"
        f"  - id: door\n    url: rtsp://127.0.0.1:{free_port()}/x\n    reconnect_max_s: 2\n"
        f"{NANODET_MODEL}engine:\n  type: onnxruntime\n  threads: 1\n"
        f"sinks:\n  - type: jsonl\n    path: {tmp_path / 'out.jsonl'}\n"
        f"  - type: mqtt\n    host: 127.0.0.1\n    port: {broker.port}\n"
        f"metrics:\n  enabled: true\n  port: {port}\n"
    )
    sub = Retained(broker.port)
    base = f"http://127.0.0.1:{port}"
    proc = start_streamd(cfg)

    def poll(predicate, what: str, timeout: float):
        deadline, last = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"streamd exited: {proc.communicate()[1][-3000:]}"
            try:
                last = predicate()
            except OSError as exc:
                last = exc
            if last and not isinstance(last, Exception):
                return last
            time.sleep(0.2)
        raise AssertionError(f"timed out ({timeout} s) waiting for {what}; last: {last}")

    def healthz() -> tuple[int, dict]:
        code, body = get(f"{base}/healthz")
        return code, json.loads(body)

    def cam(info: dict) -> dict:
        return info["streams"].get("cam", {})

    try:
        poll(lambda: cam(healthz()[1]).get("health") == "ok", "cam running", 180)
        poll(lambda: sub.last("streamd/cam/status") == b"online", "cam online on MQTT", 30)
        code, info = healthz()
        assert code == 200 and info["status"] == "degraded" and list(info["down_streams"]) == ["door"], info
        server.pause()  # SIGSTOP: the TCP connection stays open, nothing more is sent
        paused = time.monotonic()
        code, info = poll(lambda: "cam" in (r := healthz())[1]["down_streams"] and r, "cam down", 45)
        t_stale = time.monotonic() - paused
        mqtt_down = poll(
            lambda: sub.last("streamd/cam/status") == b"degraded" and time.monotonic(), "cam degraded", 15
        )
        row = next(r for r in json.loads(get(f"{base}/api/status")[1])["streams"] if r["id"] == "cam")
        fams = {f.name: f for f in text_string_to_metric_families(get(f"{base}/metrics")[1].decode())}
        up = {s.labels["stream"]: s.value for s in fams["streamd_stream_up"].samples}
        age = {s.labels["stream"]: s.value for s in fams["streamd_stream_last_packet_age_seconds"].samples}
        print(
            f"paused -> /healthz {code} {info['status']} cam {info['down_streams']['cam']!r} after "
            f"{t_stale:.1f} s, MQTT degraded after {mqtt_down - paused:.1f} s; page row {row}"
        )
        assert code == 200 and info["status"] == "degraded", info
        assert info["down_streams"]["cam"].startswith("stale"), info["down_streams"]
        assert cam(info)["state"] == "running" and cam(info)["stale"] is True, cam(info)
        assert cam(info)["last_packet_age_s"] > 5
        assert t_stale < SOURCE_TIMEOUT_S / 2, "stale long before the source's own timeouts"
        assert row["stale"] is True and row["health"] == "down" and row["last_packet_age_s"] > 5
        assert up["cam"] == 0 and up["demo"] == 1 and age["cam"] > 5
        detail = json.loads(sub.last("streamd/cam/status/detail") or b"{}")
        assert detail["state"] == "running" and detail["reason"].startswith("stale"), detail
        door_row = next(r for r in json.loads(get(f"{base}/api/status")[1])["streams"] if r["id"] == "door")
        assert door_row["last_error"] and door_row["health"] == "down", door_row
        server.resume()  # SIGCONT: the same session delivers again
        resumed = time.monotonic()
        poll(lambda: cam(healthz()[1]).get("health") == "ok", "cam ok again", 60)
        poll(lambda: sub.last("streamd/cam/status") == b"online", "cam online again on MQTT", 15)
        print(f"resumed -> ok after {time.monotonic() - resumed:.1f} s")
        assert sub.words("streamd/cam/status")[-3:] == [b"online", b"degraded", b"online"]
        assert cam(healthz()[1])["reconnects"] == 0, "the source never noticed: no reconnect"
    finally:
        server.resume()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=90)
        sub.close()
        broker.stop()
    assert proc.returncode in (0, 1), err[-3000:]  # 1: door (refused all along) counts as a failed stream
