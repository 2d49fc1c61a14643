"""Home Assistant MQTT discovery against a real broker (mosquitto): the retained discovery messages are
valid JSON with the keys Home Assistant needs, one per entity (status, object counts per class, line
counters per direction), and every state topic they name receives values — from a sink fed known lines, and
from ``streamd run`` on the pedestrian clip's first 25 s with a line across the walkway (counts checked
against the cross events and frame lines the same broker carried)."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

import paho.mqtt.client as mqtt
import pytest

from streamd.config import load_config
from streamd.sinks.mqtt import MqttSink
from tests.conftest import CLIP, GOP_FRAMES, MODEL, run_streamd

HA_KEYS = {"name", "unique_id", "state_topic", "availability_topic", "device", "object_id"}


class Watcher:
    """Subscribes to ``topics`` (QoS 1) and keeps every message: (topic, payload text, retained)."""

    def __init__(self, port: int, *topics: str) -> None:
        self.messages: list[tuple[str, str, bool]] = []
        self._lock = threading.Lock()
        subscribed = threading.Event()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
        self.client.on_connect = lambda c, *_: c.subscribe([(t, 1) for t in topics])
        self.client.on_subscribe = lambda *_: subscribed.set()
        self.client.on_message = lambda _c, _u, m: self._keep(m)
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        assert subscribed.wait(10)

    def _keep(self, m) -> None:
        with self._lock:
            self.messages.append((m.topic, m.payload.decode(), bool(m.retain)))

    def latest(self) -> dict[str, str]:
        """The last payload of each topic."""
        with self._lock:
            return {t: p for t, p, _ in self.messages}

    def seen(self, topic: str) -> list[str]:
        with self._lock:
            return [p for t, p, _ in self.messages if t == topic]

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def wait_for(predicate, timeout: float = 20) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def discovery(messages: dict[str, str]) -> dict[str, dict]:
    """Discovery topic -> its payload parsed (deleted entities, empty payloads, left out)."""
    return {t: json.loads(p) for t, p in messages.items() if t.startswith("homeassistant/") and p}


def check_payloads(configs: dict[str, dict]) -> None:
    """What Home Assistant requires of each: its keys, an object id matching the topic, unique ids."""
    for topic, c in configs.items():
        assert set(c) >= HA_KEYS, f"{topic}: missing {HA_KEYS - set(c)}"
        assert topic == f"homeassistant/sensor/streamd/{c['object_id']}/config"
        assert c["availability_topic"] == "streamd/status" and c["device"]["identifiers"], c
        assert "#" not in c["state_topic"] and "+" not in c["state_topic"]
    assert len({c["unique_id"] for c in configs.values()}) == len(configs)


def frame(stream: str, n: int, labels: list[str]) -> str:
    dets = [{"class_id": 0, "label": x, "score": 0.9, "box": [1.0, 2.0, 3.0, 4.0]} for x in labels]
    return (
        json.dumps({"v": 1, "stream": stream, "frame": n, "detections": dets}, separators=(",", ":")) + "\n"
    )


def test_entities_are_announced_and_their_states_published(tmp_path, broker) -> None:
    cfg_path = tmp_path / "ha.yaml"
    cfg_path.write_text(
        f"streams:\n  - id: door\n    url: {CLIP}\n    classes: [person, car]\n"
        "    lines:\n      - name: gate\n        points: [[10, 10], [10, 500]]\n"
        f"  - id: yard.1\n    url: {CLIP}\n"
        f"model:\n  path: {MODEL}\ntracking:\n  enabled: true\n"
        f"sinks:\n  - type: mqtt\n    host: 127.0.0.1\n    port: {broker.port}\n"
        "    home_assistant:\n      enabled: true\n      classes: [dog]\n"
    )
    config = load_config(cfg_path)
    watch = Watcher(broker.port, "homeassistant/#", "streamd/#")
    sink = MqttSink(config.sinks[0])
    sink.configured(config)
    sink.start()
    try:
        for line in (frame("door", 0, ["person", "person", "car"]), frame("yard.1", 0, ["bicycle"])):
            sink.submit(line, line.split('"stream":"')[1].split('"')[0])
        for direction in ("in", "out", "in", "in"):  # cross events: 3 in, 1 out
            event = {"v": 1, "type": "event", "event": "cross", "stream": "door", "line": "gate",
                     "direction": direction, "label": "person"}  # fmt: skip
            sink.submit(json.dumps(event, separators=(",", ":")) + "\n", "door")
        sink.submit(frame("door", 1, ["person"]), "door")
        sink.stream_health(
            {
                "door": {"health": "ok", "state": "running"},
                "yard.1": {"health": "down", "state": "reconnecting", "health_reason": "refused"},
            }
        )
        base = "homeassistant/sensor/streamd/"
        expected = {
            f"{base}{o}/config"
            for o in ("door_status", "door_person_count", "door_car_count", "door_dog_count", "door_gate_in",
                      "door_gate_out", "yard_1_status", "yard_1_dog_count", "yard_1_bicycle_count")
        }  # fmt: skip
        want_states = {
            "streamd/door/objects/person": "1",  # the latest frame of door: one person
            "streamd/door/objects/car": "0",
            "streamd/door/objects/dog": "0",
            "streamd/door/lines/gate/in": "3",
            "streamd/door/lines/gate/out": "1",
            "streamd/yard.1/objects/bicycle": "1",
            "streamd/yard.1/objects/dog": "0",
            "streamd/door/status": "online",
            "streamd/yard.1/status": "degraded",
        }

        def arrived() -> bool:
            latest = watch.latest()
            return set(discovery(latest)) == expected and all(
                latest.get(t) == v for t, v in want_states.items()
            )

        assert wait_for(arrived), (sorted(discovery(watch.latest())), watch.latest())
        configs = discovery(watch.latest())
        check_payloads(configs)
        states = {c["state_topic"] for c in configs.values()}
        assert states == set(want_states)  # each entity's state topic got a value
        status = configs[f"{base}door_status/config"]
        assert status["json_attributes_topic"] == "streamd/door/status/detail"
        assert status["options"] == ["online", "degraded", "offline"]
        assert configs[f"{base}door_gate_in/config"]["state_class"] == "total_increasing"
        assert configs[f"{base}door_person_count/config"]["device"]["identifiers"] == ["streamd_streamd_door"]
        assert watch.seen("streamd/door/objects/person") == [
            "0",
            "2",
            "1",
        ]  # announced at 0, then each change
        assert watch.seen("streamd/door/lines/gate/in") == ["0", "1", "2", "3"]

        # Retained: a subscriber arriving now gets every discovery message and state.
        late = Watcher(broker.port, "homeassistant/#", "streamd/door/#", "streamd/yard.1/#")
        assert wait_for(lambda: set(discovery(late.latest())) == expected)
        assert all(r for t, _, r in late.messages if t.startswith("homeassistant/"))
        late.close()

        # A reload removes yard.1: its entities are deleted (empty retained configs); door's stay.
        cfg_path.write_text(cfg_path.read_text().replace("  - id: yard.1", "  - id: y2"))
        sink.configured(load_config(cfg_path))
        sink.stream_removed("yard.1")
        gone = {t for t in expected if "/yard_1_" in t}
        assert wait_for(lambda: all(watch.latest().get(t) == "" for t in gone)), watch.latest()
        assert wait_for(lambda: f"{base}y2_status/config" in discovery(watch.latest()))
        assert all(watch.latest()[t] for t in expected - gone)
    finally:
        sink.close(timeout=5)
    assert wait_for(lambda: watch.latest().get("streamd/status") == "offline")
    watch.close()


@pytest.mark.slow
def test_streamd_run_on_the_pedestrian_clip_feeds_the_sensors(
    tmp_path, broker, assets, first_gop_clip
) -> None:
    pytest.importorskip("lap")  # the tracker behind lines
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        f"streams:\n  - id: demo\n    url: {first_gop_clip}\n    classes: [person]\n"
        "    lines:\n      - name: street\n        points: [[480, 120], [540, 560]]\n"
        f"model:\n  path: {MODEL}\n  score_threshold: 0.35\ntracking:\n  enabled: true\n"
        f"sinks:\n  - type: mqtt\n    host: 127.0.0.1\n    port: {broker.port}\n"
        "    home_assistant:\n      enabled: true\n"
    )
    watch = Watcher(broker.port, "homeassistant/#", "streamd/#")
    proc = run_streamd("run", str(cfg), "--no-status", timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [json.loads(p) for p in watch.seen("streamd/demo/detections")]
    assert wait_for(lambda: watch.latest().get("streamd/status") == "offline")
    configs = discovery(watch.latest())
    check_payloads(configs)
    base = "homeassistant/sensor/streamd/"
    assert set(configs) == {
        f"{base}demo_{o}/config" for o in ("status", "person_count", "street_in", "street_out")
    }
    latest = watch.latest()
    assert all(c["state_topic"] in latest for c in configs.values())

    # Computed from what the broker carried on the detections topic, not from the sink's own counters.
    frames = [r for r in lines if "type" not in r]
    assert len(frames) == GOP_FRAMES, len(frames)
    people = [sum(d["label"] == "person" for d in r["detections"]) for r in frames]
    published = ["0"]  # announced at 0, then published on each change
    for n in people:
        if str(n) != published[-1]:
            published.append(str(n))
    assert watch.seen("streamd/demo/objects/person") == published
    assert latest["streamd/demo/objects/person"] == str(people[-1])
    crossed = Counter(r["direction"] for r in lines if r.get("event") == "cross")
    print(
        f"{len(frames)} frames, {sum(crossed.values())} crossings {dict(crossed)}, max {max(people)} persons"
    )
    assert sum(crossed.values()) >= 5
    assert latest["streamd/demo/lines/street/in"] == str(crossed["in"])
    assert latest["streamd/demo/lines/street/out"] == str(crossed["out"])
    assert latest["streamd/demo/status"] == "offline"
    watch.close()
