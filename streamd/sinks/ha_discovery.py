"""Home Assistant MQTT discovery for an MQTT sink (``sinks[].home_assistant``).

Each stream becomes a Home Assistant device (identifier ``streamd_<node_id>_<stream>``) with sensors, each
announced by one retained message on ``<prefix>/sensor/<node_id>/<object_id>/config`` (unique_id, state
topic, availability, device):

- ``<stream>_status``: the stream's health — the MQTT sink's retained ``status_topic`` word (``online``,
  ``degraded``, ``offline``), its ``/detail`` JSON as attributes;
- ``<stream>_<class>_count``: objects of that class in the stream's latest frame, retained on
  ``<state_topic>/objects/<class>`` when it changes. Announced from the start for the stream's classes
  (``streams[].classes``, else ``model.classes``) and ``home_assistant.classes``; any other class when
  first seen on the stream (counting every class of an 80-class model up front would flood HA);
- ``<stream>_<line>_<in|out>``: crossings of each of the stream's lines (``streams[].lines[].name``) per
  direction since streamd started (``total_increasing``: a restart starts again at 0), retained on
  ``<state_topic>/lines/<line>/<direction>``: the ``cross`` event lines this sink carried, counted in order
  with them (every worker's lines pass through the one sink, so worker restarts lose nothing). A line the
  config does not name (no ``lines:`` key) gets its sensors at its first crossing.

Every sensor's availability is the sink's ``availability_topic`` (``online``/``offline``, the broker's last
will if streamd dies), so HA shows them unavailable while streamd is down. A stream removed by a reload or
the control API has its entities deleted (empty retained config messages). Topic and id parts are the names
with every character outside ``A-Z a-z 0-9 _ -`` made ``_``.

This module builds messages only; the MQTT sink's writer thread publishes them (retained, QoS 1).
``configured`` and ``removed`` are called from the supervisor's threads, the rest from the writer thread.
"""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from collections.abc import Iterable
from typing import Any

from streamd import __version__
from streamd.config import Config
from streamd.config.home_assistant import HomeAssistantConfig
from streamd.config.sinks import MqttSinkConfig

Message = tuple[str, str]  # (topic, payload), published retained; an empty payload deletes
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_EVENT_MARK = '"type":"event"'


def slug(name: str) -> str:
    return _UNSAFE.sub("_", name)


class Discovery:
    def __init__(self, ha: HomeAssistantConfig, mqtt: MqttSinkConfig) -> None:
        self.ha, self.mqtt = ha, mqtt
        self._lock = threading.Lock()
        self._wanted: dict[str, tuple[set[str], set[str]]] = {}  # configured: stream -> (classes, lines)
        self._wanted_gen = 0  # moves with each configured(): the writer announces again
        self._gone: set[str] = set()  # removed streams whose entities are still to be deleted
        # The writer thread's own state: what was published.
        self._configs: dict[str, dict[str, str]] = {}  # stream -> {discovery topic: payload}
        self._classes: dict[str, set[str]] = {}  # stream -> classes with a count sensor
        self._states: dict[str, str] = {}  # state topic -> payload last published
        self._lines: dict[str, set[str]] = {}  # stream -> lines with counter sensors
        self._crossings: Counter[tuple[str, str, str]] = Counter()  # (stream, line, direction) -> crossings
        self._announced_gen = 0

    # -- the supervisor's thread ---------------------------------------------------------------------
    def configured(self, config: Config) -> None:
        """The running streams: each gets its status, its classes' counts and its lines' counters."""
        names = config.model.class_names
        wanted = {}
        for s in config.streams:
            ids = s.classes if s.classes is not None else config.model.classes
            classes = {names[i] for i in ids or () if 0 <= i < len(names)} | set(self.ha.classes)
            lines = {line.name for line in getattr(s, "lines", None) or ()}
            wanted[s.id] = (classes, lines)
        with self._lock:
            self._wanted = wanted
            self._wanted_gen += 1

    def removed(self, stream_id: str) -> None:
        with self._lock:
            self._gone.add(stream_id)

    # -- the writer thread ---------------------------------------------------------------------------
    def frame(self, stream_id: str, line: str) -> list[Message]:
        """A result line: the count of each class on the stream that changed (new classes announced), or
        a line crossing's new total."""
        try:
            record = json.loads(line)
            detections = record.get("detections") or []
        except (ValueError, AttributeError):
            return []
        if _EVENT_MARK in line:
            return self._crossed(stream_id, record)
        counts = Counter(str(d.get("label", d.get("class_id"))) for d in detections if isinstance(d, dict))
        new = set(counts) - self._classes.get(stream_id, set())
        out = self._announce(stream_id, new) if new or stream_id not in self._configs else []
        for label in self._classes.get(stream_id, ()):
            out += self._state(self._count_topic(stream_id, label), str(counts.get(label, 0)))
        return out

    def _crossed(self, sid: str, event: dict[str, Any]) -> list[Message]:
        name, direction = event.get("line"), event.get("direction")
        if event.get("event") != "cross" or not isinstance(name, str) or direction not in ("in", "out"):
            return []
        out = [] if name in self._lines.get(sid, ()) else self._announce(sid, set(), [name])
        key = (sid, name, direction)
        self._crossings[key] += 1
        return out + self._state(self._line_topic(sid, name, direction), str(self._crossings[key]))

    def drain(self) -> list[Message]:
        """What changed since the last call: configured streams to announce, removed ones to delete."""
        with self._lock:
            wanted, gone = dict(self._wanted), set(self._gone)
            self._gone.clear()
            fresh, self._announced_gen = self._wanted_gen != self._announced_gen, self._wanted_gen
        out: list[Message] = []
        for sid in gone:
            if sid not in wanted:
                out += self._delete(sid)
        if fresh:
            for sid, (classes, lines) in wanted.items():
                out += self._announce(sid, classes, lines)
        return out

    def republish(self) -> list[Message]:
        """After a reconnect (a broker without persistence forgot its retained messages): everything again."""
        out = [(t, p) for configs in self._configs.values() for t, p in configs.items()]
        return out + list(self._states.items())

    # -- messages ------------------------------------------------------------------------------------
    def _announce(self, sid: str, classes: set[str], lines: Iterable[str] = ()) -> list[Message]:
        configs = self._configs.setdefault(sid, {})
        known = self._classes.setdefault(sid, set())
        out: list[Message] = []
        entities = [self._status_entity(sid)]
        entities += [self._count_entity(sid, c) for c in sorted(classes - known)]
        for name in sorted(lines):
            entities += [self._line_entity(sid, name, d) for d in ("in", "out")]
        for topic, payload in entities:
            if configs.get(topic) != payload:
                configs[topic] = payload
                out.append((topic, payload))
        for label in sorted(classes - known):  # a new sensor starts at 0 until the next frame says more
            known.add(label)
            out += self._state(self._count_topic(sid, label), "0")
        for name in sorted(set(lines) - self._lines.setdefault(sid, set())):
            self._lines[sid].add(name)
            for direction in ("in", "out"):
                total = self._crossings[(sid, name, direction)]
                out += self._state(self._line_topic(sid, name, direction), str(total))
        return out

    def _delete(self, sid: str) -> list[Message]:
        out = [(topic, "") for topic in self._configs.pop(sid, {})]
        self._classes.pop(sid, None)
        self._lines.pop(sid, None)
        base = self.ha.state_topic.replace("{stream}", sid) + "/"
        for topic in [t for t in self._states if t.startswith(base)]:
            del self._states[topic]
            out.append((topic, ""))
        return out

    def _state(self, topic: str, payload: str) -> list[Message]:
        if self._states.get(topic) == payload:
            return []
        self._states[topic] = payload
        return [(topic, payload)]

    def _count_topic(self, sid: str, label: str) -> str:
        return f"{self.ha.state_topic.replace('{stream}', sid)}/objects/{slug(label)}"

    def _line_topic(self, sid: str, line: str, direction: str) -> str:
        return f"{self.ha.state_topic.replace('{stream}', sid)}/lines/{slug(line)}/{direction}"

    def _entity(self, sid: str, suffix: str, fields: dict[str, Any]) -> Message:
        object_id = f"{slug(sid)}_{suffix}"
        device = f"streamd_{self.ha.node_id}_{slug(sid)}"
        payload = {
            **fields,
            "unique_id": f"streamd_{self.ha.node_id}_{object_id}",
            "object_id": object_id,
            "availability_topic": self.mqtt.availability_topic,
            "payload_available": "online",
            "payload_not_available": "offline",
            "device": {
                "identifiers": [device],
                "name": sid,
                "manufacturer": "streamd",
                "model": "video stream",
                "sw_version": __version__,
            },
            "origin": {"name": "streamd", "sw_version": __version__},
        }
        topic = f"{self.ha.prefix}/sensor/{self.ha.node_id}/{object_id}/config"
        return topic, json.dumps(payload, separators=(",", ":"), sort_keys=True)

    def _status_entity(self, sid: str) -> Message:
        status = self.mqtt.status_topic.replace("{stream}", sid)
        return self._entity(sid, "status", {
            "name": "status", "state_topic": status, "json_attributes_topic": status + "/detail",
            "device_class": "enum", "options": ["online", "degraded", "offline"], "icon": "mdi:cctv",
        })  # fmt: skip

    def _count_entity(self, sid: str, label: str) -> Message:
        return self._entity(sid, f"{slug(label)}_count", {
            "name": f"{label} count", "state_topic": self._count_topic(sid, label),
            "state_class": "measurement", "icon": "mdi:counter",
        })  # fmt: skip

    def _line_entity(self, sid: str, line: str, direction: str) -> Message:
        return self._entity(sid, f"{slug(line)}_{direction}", {
            "name": f"{line} {direction}", "state_topic": self._line_topic(sid, line, direction),
            "state_class": "total_increasing", "icon": "mdi:transit-transfer",
        })  # fmt: skip
