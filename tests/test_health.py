"""Health tells the truth: a camera refused, stalled or hung, or a worker that went
silent, shows in ``/healthz`` (``degraded`` naming the stream and why; 503 with ``metrics.stream_down:
unhealthy``, when every stream is down or the pipeline is wedged), in ``/metrics`` (``streamd_stream_up``,
``streamd_stream_health``) and in the MQTT per-stream status; ``/metrics`` keeps no series of workers that no
longer exist or of removed streams; an MQTT broker that cannot be reached is logged once and counted as
broken.

The bookkeeping first (``status.snapshot`` over hand-made worker slots), then a real supervisor with real
worker processes, a refused RTSP camera (a port nobody listens on) and a real mosquitto, polled over sockets.
The hung camera (a real RTSP server, SIGSTOPped) is in ``tests/sources/test_health_live.py``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import time

import paho.mqtt.client as mqtt
import pytest

from streamd.config import load_config
from streamd.config.errors import ConfigError
from streamd.protocol import StreamReport, WorkerStats
from streamd.supervisor import status
from streamd.supervisor.metrics import health, render
from streamd.supervisor.pool import WorkerSlot
from streamd.supervisor.server import MetricsServer
from tests.conftest import CLIP, free_port, metrics_section
from tests.conftest import http_get as get
from tests.test_reference_detections import NANODET_MODEL


class _Proc:
    def __init__(self, alive: bool = True) -> None:
        self.alive, self.pid = alive, 4242

    def is_alive(self) -> bool:
        return self.alive


def _slot(index: int, ids: tuple[str, ...], per_stream: dict[str, dict], **kw) -> WorkerSlot:
    """A worker slot whose process last reported ``per_stream`` (``StreamReport`` fields by name)."""
    w = WorkerSlot(index, ids, 0, process=_Proc(kw.pop("alive", True)), ready=True, **kw)
    w.last_progress = time.monotonic()  # results keep coming: the pipeline is not wedged
    reports = {sid: StreamReport(**s) for sid, s in per_stream.items()}
    w.stats = WorkerStats(results=5, batches=2, frames=4, per_stream=reports)
    return w


def _snap(workers: list[WorkerSlot], **kw) -> dict:
    owner = {sid: w for w in workers if not w.retired for sid in w.stream_ids}
    return status.snapshot(
        workers, [], owner=owner, started=time.monotonic() - 10, batch_size=4, stalled=False, **kw
    )


def test_stream_health_from_state_age_and_a_silent_worker() -> None:
    now = time.monotonic()
    fresh = {"state": "running", "last_packet_age_s": 0.1, "fps": 25.0}
    workers = [
        _slot(0, ("ok", "stale", "slow"), {
            "ok": dict(fresh),
            "stale": {"state": "running", "last_packet_age_s": 6.0},  # older than the 5 s default
            "slow": {"state": "running", "last_packet_age_s": 6.0, "nominal_fps": 1.0},  # 10 periods: 10 s
        }, last_message=now),
        _slot(1, ("door",), {"door": {"state": "reconnecting", "last_error": "connection refused"}},
              last_message=now),
        _slot(2, ("wedged",), {"wedged": dict(fresh)}, last_message=now - 8),  # SIGSTOPped 8 s ago
        _slot(3, ("dead",), {}, alive=False, restarts=1),
        _slot(4, ("gone",), {"gone": dict(fresh)}, alive=False, retired=True),  # a reload took it away
        _slot(5, ("file",), {"file": {"state": "ended"}}, alive=False, done=True),
    ]  # fmt: skip
    snap = _snap(workers)
    per = snap["per_stream"]
    got = {sid: (s["health"], s["health_reason"]) for sid, s in per.items()}
    print(json.dumps(got, indent=1))
    assert got["ok"] == ("ok", "") and got["slow"] == ("ok", "")
    assert got["stale"] == ("down", "stale: no packet for more than 5 s") and per["stale"]["stale"]
    assert got["door"] == ("down", "reconnecting: connection refused")
    assert per["wedged"]["state"] == "unresponsive" and got["wedged"][0] == "down"
    assert per["wedged"]["last_packet_age_s"] >= 8, "a silent worker's last packet age keeps growing"
    assert got["dead"] == ("down", "its worker process died; restarting")
    assert got["file"] == ("ended", "")
    assert set(snap["down"]) == {"stale", "door", "wedged", "dead"}
    # Series exist only for workers that exist or will restart: not the retired one nor the finished one.
    assert sorted(snap["workers"]) == sorted(snap["batches"]) == [0, 1, 2, 3]
    text = render(snap)
    assert 'worker="4"' not in text and 'worker="5"' not in text and "worker-4" not in text
    ok, body = health(snap)
    assert ok and body["status"] == "degraded" and body["down_streams"]["door"].startswith("reconnecting")
    assert not health(snap, "unhealthy")[0]
    assert _snap(workers, stale_after_s=7.0)["per_stream"]["stale"]["health"] == "ok"


def test_stream_down_and_stale_after_are_config_keys_with_key_path_errors(tmp_path) -> None:
    cfg = tmp_path / "h.yaml"
    base = f"streams:\n  - id: a\n    url: {CLIP}\n{NANODET_MODEL}"
    cfg.write_text(base + "metrics:\n  stream_down: unhealthy\n  stale_after_s: 3\n")
    m = load_config(cfg).metrics
    assert (m.stream_down, m.stale_after_s) == ("unhealthy", 3.0)
    cfg.write_text(base + "metrics:\n  stream_down: unhealty\n  stale_after_s: 0\n")
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    problems = "\n".join(info.value.problems)
    print(problems)
    assert "metrics.stream_down" in problems and "did you mean 'unhealthy'" in problems
    assert "metrics.stale_after_s" in problems


# -- a real supervisor ---------------------------------------------------------------------------------------


def samples(fams: dict, name: str, label: str) -> dict[str, float]:
    return {s.labels[label]: s.value for s in fams[name].samples if label in s.labels} if name in fams else {}


class Retained:
    """A subscriber that records every message of ``streamd/#`` (retained ones first)."""

    def __init__(self, port: int) -> None:
        self.messages: list[tuple[float, str, bytes]] = []
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
        self.client.on_connect = lambda c, *_: c.subscribe("streamd/#", qos=1)
        self.client.on_message = lambda _c, _u, m: self.messages.append(
            (time.monotonic(), m.topic, m.payload)
        )
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def last(self, topic: str) -> bytes | None:
        found = [p for _, t, p in self.messages if t == topic]
        return found[-1] if found else None

    def words(self, topic: str) -> list[bytes]:
        return [p for _, t, p in self.messages if t == topic]

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


@pytest.fixture
def mosquitto(tmp_path):
    from tests.sinks.conftest import Broker

    if shutil.which("mosquitto") is None:
        pytest.fail("mosquitto is not installed (Debian package mosquitto; .ci/system-packages installs it)")
    (tmp_path / "broker").mkdir()
    b = Broker(tmp_path / "broker")
    b.start()
    yield b
    b.stop()


def _config(out, broker: int, dead_broker: int, camera: str, with_door: bool = True) -> str:
    door = (
        f"  - id: door\n    url: {camera}\n    reconnect_initial_s: 0.5\n    reconnect_max_s: 2\n"
        if with_door
        else ""
    )
    return (
        f"streams:\n"
        f"  - id: demo\n    url: {CLIP}\n    realtime: true\n    loop: true\n    detect_fps: 2\n"
        f"  - id: short\n    url: {CLIP}\n    detect_fps: 1\n"  # ends: its worker finishes and exits
        f"{door}"
        f"{NANODET_MODEL}engine:\n  type: onnxruntime\n  threads: 1\n"
        f"pipeline:\n  workers: 2\n  batch_size: 2\n  spare_worker: false\n"
        f"sinks:\n  - type: jsonl\n    path: {out}\n"
        f"  - type: mqtt\n    host: 127.0.0.1\n    port: {broker}\n    drops_ok: true\n"
        f"  - type: mqtt\n    host: 127.0.0.1\n    port: {dead_broker}\n    drops_ok: true\n"
        f"    reconnect_max_s: 2\n"
    )


@pytest.mark.slow
def test_refused_camera_is_degraded_503_when_strict_mqtt_and_metrics_follow(
    tmp_path, metrics_daemon, mosquitto, caplog
) -> None:
    """demo (a live file) and short (a file that ends) run; door is an RTSP camera on a port nobody listens on
    (connection refused, reconnecting). Two MQTT sinks: a real broker and one on a dead port."""
    dead_broker, out = free_port(), tmp_path / "out.jsonl"
    camera = f"rtsp://user:secret@127.0.0.1:{free_port()}/stream1"
    sub = Retained(mosquitto.port)
    dead_sink = f"mqtt:127.0.0.1:{dead_broker}"
    with caplog.at_level(logging.INFO, logger="streamd"):
        t0 = time.monotonic()
        daemon = metrics_daemon(_config(out, mosquitto.port, dead_broker, camera))
        sup = daemon.supervisor
        # The supervisor serves the default policy on metrics.port; the strict policy (metrics.stream_down:
        # unhealthy) on a second server over the same live snapshot.
        strict = MetricsServer("127.0.0.1", 0, sup.snapshot, stream_down="unhealthy")
        strict.start()
        strict_base = f"http://127.0.0.1:{strict.address[1]}"

        def healthz(base: str = daemon.url) -> tuple[int, dict]:
            code, body = get(f"{base}/healthz")
            return code, json.loads(body)

        try:
            # demo delivering, door down: degraded, door named with why, HTTP 200 (the default policy).
            code, info = daemon.wait_for(
                lambda: (
                    (r := healthz())[1]["streams"].get("demo", {}).get("health") == "ok"
                    and "door" in r[1]["down_streams"]
                    and r
                ),
                "demo running and door down",
            )
            t_degraded = time.monotonic() - t0
            print(f"/healthz {code} {info['status']} down={info['down_streams']} after {t_degraded:.1f} s")
            assert code == 200 and info["status"] == "degraded" and info["ok"] is False
            assert info["down_streams"]["door"].startswith("reconnecting"), info["down_streams"]
            assert info["streams"]["door"]["last_error"] and "secret" not in json.dumps(info)
            code, strict_info = healthz(strict_base)
            assert code == 503 and strict_info["status"] == "unhealthy", strict_info
            # MQTT: door's retained status is degraded (never online), with the reason in the detail.
            daemon.wait_for(
                lambda: sub.last("streamd/door/status") == b"degraded", "door degraded on MQTT", 30
            )
            detail = json.loads(sub.last("streamd/door/status/detail") or b"{}")
            assert detail["state"] == "reconnecting" and detail["reason"].startswith("reconnecting")
            assert b"online" not in sub.words("streamd/door/status")
            daemon.wait_for(lambda: sub.last("streamd/demo/status") == b"online", "demo online on MQTT", 30)
            # The unreachable broker: said once, counted as broken; the real one is not.
            fams = daemon.wait_for(daemon.metrics, "/metrics")
            broken = samples(fams, "streamd_sink_broken", "sink")
            assert broken[dead_sink] == 1 and broken[f"mqtt:127.0.0.1:{mosquitto.port}"] == 0, broken
            up = samples(fams, "streamd_stream_up", "stream")
            assert up["door"] == 0 and up["demo"] == 1, up
            health = fams["streamd_stream_health"].samples
            down = {s.labels["stream"] for s in health if s.labels["health"] == "down" and s.value == 1}
            assert "door" in down and "demo" not in down
            # short ends: its worker finishes and exits; its series go with it.
            finished = "the short file's worker finished"
            daemon.wait_for(lambda: any(w.done and not w.alive for w in sup.workers), finished)
            gone = [str(w.index) for w in sup.workers if w.done and not w.alive]
            fams = daemon.metrics()
            for name in ("streamd_batches", "streamd_worker_restarts"):
                labels = set(samples(fams, name, "worker"))
                assert labels and not labels & set(gone), (name, labels, gone)
            processes = set(samples(fams, "streamd_resident_memory_bytes", "process"))
            assert not processes & {f"worker-{g}" for g in gone}, processes
            # A reload removes door: its series end and health is ok again, under both policies.
            body = _config(out, mosquitto.port, dead_broker, camera, with_door=False)
            daemon.config.write_text(body + metrics_section(daemon.port))
            sup.request_reload()  # what SIGHUP does
            daemon.wait_for(lambda: "door" not in healthz()[1]["streams"], "door removed")
            ok_again = daemon.wait_for(
                lambda: (r := healthz())[1]["status"] == "ok" and r, "ok after reload", 60
            )
            assert ok_again[0] == 200 and get(f"{strict_base}/healthz")[0] == 200
            assert 'stream="door"' not in daemon.get("/metrics")[1].decode()
            daemon.wait_for(lambda: sub.last("streamd/door/status") == b"offline", "door offline on MQTT", 30)
        finally:
            code = daemon.stop()
            strict.close()
            sub.close()
    unreachable = [r for r in caplog.records if "cannot reach the broker" in r.getMessage()]
    door_words = sub.words("streamd/door/status")
    print(f"degraded after {t_degraded:.1f} s; unreachable lines: {len(unreachable)}; door {door_words}")
    assert len(unreachable) == 1 and dead_sink in unreachable[0].getMessage()
    assert "secret" not in caplog.text
    assert code == 0, caplog.text[-3000:]  # the dead broker's sink says drops_ok


@pytest.mark.slow
def test_a_wedged_worker_shows_its_streams_down_within_seconds(tmp_path, metrics_daemon) -> None:
    """SIGSTOP of the worker process: its last stats say ``running`` forever, but it sends nothing more.
    Within a few seconds its stream is down (``unresponsive``, then ``restarting`` once the pool kills it)
    and /healthz is 503 (its only stream is down); it delivers again afterwards."""
    import os
    import signal

    daemon = metrics_daemon(
        f"streams:\n  - id: demo\n    url: {CLIP}\n    realtime: true\n    loop: true\n    detect_fps: 2\n"
        f"{NANODET_MODEL}engine:\n  type: onnxruntime\n  threads: 1\n"
        f"pipeline:\n  workers: 1\n  spare_worker: false\n"
        f"sinks:\n  - type: jsonl\n    path: {tmp_path / 'out.jsonl'}\n"
    )
    sup = daemon.supervisor

    def demo() -> dict:
        return sup.snapshot()["per_stream"]["demo"]

    daemon.wait_for(lambda: demo()["health"] == "ok", "demo running", 180)
    pid = sup.workers[0].process.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        stopped = time.monotonic()
        seen: list[tuple[float, str, str]] = []

        def down() -> dict | None:
            s = demo()
            if not seen or seen[-1][1] != s["state"]:
                seen.append((round(time.monotonic() - stopped, 1), s["state"], s["health_reason"]))
            return s if s["health"] == "down" else None

        s = daemon.wait_for(down, "demo down", 30)
        t_down = time.monotonic() - stopped
        code, info = daemon.healthz()
        daemon.wait_for(lambda: (down() or True) and demo()["health"] == "ok", "back", 180)
        print(
            f"SIGSTOP -> down after {t_down:.1f} s ({s['state']}: {s['health_reason']}); /healthz {code} "
            f"{info['status']}; states seen {seen}"
        )
        assert t_down < 10, "down within 10 s"
        assert s["state"] in ("unresponsive", "stale", "restarting", "running"), s
        assert code == 503 and info["status"] == "unhealthy" and "demo" in info["down_streams"]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
