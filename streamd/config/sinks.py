"""``sinks:`` — where the JSON lines go; each item is picked by its ``type:``."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Union

from streamd.config._fields import (
    RELATIVE_NOTE,
    Invalid,
    Problems,
    describe,
    opt,
    path_text,
    read_section,
    required,
    resolve_path,
    suggest,
)


@dataclass(frozen=True)
class JsonlSinkConfig:
    """Append one JSON line per frame result to a file."""

    path: Path = required(  # noqa: RUF009 (required() is a dataclasses.field)
        "the output file, relative to the config file's folder; its folder must exist",
        ask="the output file, relative to the config file's folder",
    )
    flush_every: int = opt(1, "flush the file after this many lines", ge=1)
    queue_size: int = opt(4096, "results buffered for this sink", ge=1)
    type: Literal["jsonl"] = field(default="jsonl", init=False)


@dataclass(frozen=True)
class StdoutSinkConfig:
    """Write one JSON line per frame result to standard output (logs go to stderr)."""

    queue_size: int = opt(4096, "results buffered for this sink", ge=1)
    type: Literal["stdout"] = field(default="stdout", init=False)


SinkConfig = Union[JsonlSinkConfig, StdoutSinkConfig]  # noqa: UP007 (a runtime alias must work on 3.10 too)
SINK_TYPES: dict[str, type[JsonlSinkConfig] | type[StdoutSinkConfig]] = {
    "jsonl": JsonlSinkConfig,
    "stdout": StdoutSinkConfig,
}
DEFAULT_SINKS: tuple[SinkConfig, ...] = (StdoutSinkConfig(),)


def check_output_file(value: object, path: str, base_dir: Path) -> Path:
    full = resolve_path(path_text(value, path, "the path of the output file"), base_dir)
    if full.is_dir():
        raise Invalid(f"{str(value)!r} is a folder ({full}); give a file path", path)
    if not full.parent.is_dir():
        note = "" if os.path.isabs(os.path.expanduser(str(value))) else f"; {RELATIVE_NOTE}"
        raise Invalid(
            f"folder not found: {str(full.parent)!r} (for {str(value)!r}{note}); create it first", path
        )
    return full


def parse_sinks(raw: object, problems: Problems, base_dir: Path) -> tuple[SinkConfig, ...]:
    """Check the ``sinks:`` list (absent = one stdout sink)."""
    types = ", ".join(repr(t) for t in SINK_TYPES)
    if not isinstance(raw, list):
        problems.add("sinks", f"expected a list of sinks (each with type: {types}), got {describe(raw)}")
        return DEFAULT_SINKS
    if not raw:
        problems.add("sinks", "the list is empty; add a sink, or delete sinks: to write to stdout")
        return DEFAULT_SINKS
    sinks: list[SinkConfig] = []
    first_use: dict[Path, int] = {}
    stdout_index: int | None = None
    for index, item in enumerate(raw):
        here = f"sinks[{index}]"
        if not isinstance(item, dict):
            problems.add(here, f"expected a mapping with type: ({types}), got {describe(item)}")
            continue
        kind = item.get("type")
        if kind is None:
            problems.add(f"{here}.type", f"required key missing; add type: with one of {types}")
            continue
        if not isinstance(kind, str) or kind not in SINK_TYPES:
            hint = suggest(kind, SINK_TYPES) if isinstance(kind, str) else ""
            shown = repr(kind) if isinstance(kind, str) else describe(kind)
            problems.add(f"{here}.type", f"unknown sink type {shown}; valid types: {types}{hint}")
            continue
        cls = SINK_TYPES[kind]
        given = read_section(
            cls,
            item,
            here,
            problems,
            special={"path": lambda v, p: check_output_file(v, p, base_dir)},
            extra_keys=["type"],
        )
        if given is None or (cls is JsonlSinkConfig and "path" not in given):
            continue
        sink = cls(**given)
        if isinstance(sink, JsonlSinkConfig):
            if sink.path in first_use:
                problems.add(
                    f"{here}.path",
                    f"{str(sink.path)!r} is already written by sinks[{first_use[sink.path]}]; "
                    "give each jsonl sink its own file",
                )
            first_use.setdefault(sink.path, index)
        elif stdout_index is not None:
            problems.add(
                f"{here}.type", f"stdout is already written by sinks[{stdout_index}]; keep one stdout sink"
            )
        else:
            stdout_index = index
        sinks.append(sink)
    return tuple(sinks)
