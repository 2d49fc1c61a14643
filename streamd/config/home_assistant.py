"""``sinks[].home_assistant`` (MQTT sinks): Home Assistant MQTT discovery of each stream's entities."""

from __future__ import annotations

from dataclasses import dataclass

from streamd.config._fields import Invalid, Problems, coerce, describe, opt, read_section

_TOPIC_DOC = "an MQTT topic without wildcards or spaces"


@dataclass(frozen=True)
class HomeAssistantConfig:
    """Retained discovery messages (``<prefix>/sensor/<node_id>/<object>/config``) so that each stream
    appears in Home Assistant as a device with its health, its object counts per class and its line
    counters; their states are retained topics under ``state_topic``."""

    enabled: bool = opt(False, "publish Home Assistant MQTT discovery messages and the sensors' states")
    prefix: str = opt(
        "homeassistant",
        "Home Assistant's discovery prefix (its MQTT integration's discovery_prefix)",
        pattern=r"[^#+\s{}]+",
        pattern_doc=_TOPIC_DOC,
    )
    node_id: str = opt(
        "streamd",
        "names this streamd in discovery topics and unique ids; give each streamd on one broker its own",
        pattern=r"[A-Za-z0-9_-]{1,64}",
        pattern_doc="1 to 64 characters from A-Z a-z 0-9 _ -",
    )
    state_topic: str = opt(
        "streamd/{stream}",
        "base of each stream's sensor states: <base>/objects/<class> (objects in the latest frame), "
        "<base>/lines/<line>/<in|out> (crossings since start); {stream} = the stream id",
        pattern=r"[^#+\s]+",
        pattern_doc=_TOPIC_DOC + "; {stream} = the stream id",
    )
    classes: tuple[str, ...] = opt(
        (),
        "class names announced as count sensors on every stream from the start (besides the stream's own "
        "classes:); any other class gets its sensor when first seen",
    )


def _class_names(value: object, path: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise Invalid(f"expected a list of class names, e.g. [person, car], got {describe(value)}", path)
    return tuple(v.strip() for v in value)


def _state_topic(value: object, path: str) -> str:
    text: str = coerce(value, str, {"pattern": r"[^#+\s]+", "pattern_doc": _TOPIC_DOC}, path)
    if "{stream}" not in text:
        raise Invalid(f"{text!r} has no {{stream}}; each stream needs its own: streamd/{{stream}}", path)
    return text


def parse_home_assistant(raw: object, path: str, problems: Problems) -> HomeAssistantConfig | None:
    """Check one MQTT sink's ``home_assistant:`` mapping (None when it had problems, all reported)."""
    before = len(problems.items)
    special = {"classes": _class_names, "state_topic": _state_topic}
    given = read_section(HomeAssistantConfig, raw, path, problems, special=special)
    if given is None or len(problems.items) > before:
        return None
    return HomeAssistantConfig(**given)
