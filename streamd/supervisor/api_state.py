"""The control API's stream changes as an overlay on the config file, checked with the config's own rules.

The overlay maps a stream id to the stream's settings as the API was given them (a mapping, as one item of
``streams:`` would be written) or to None (removed through the API). It is applied on top of the config
file's ``streams:`` at start, after every reload (SIGHUP) and after each API change, so:

- **the overlay wins** for the ids it names: a stream changed through the API keeps the API's settings even
  if the config file lists it otherwise, and a stream removed through the API stays removed;
- **the config file wins** for every other id: streams added to (or removed from) the file appear (or go)
  at the next reload or restart as usual.

With ``metrics.api.state_file`` the overlay is written there (JSON, atomically) after each change and read
at start, so a restart keeps the API's changes; without it they last until the process ends. An overlay
entry that no longer passes the config's checks (a file it names was deleted, the model lost a class it
names) is a config error at start and refuses a reload, naming the state file, the stream and the fix.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from streamd.analytics.tracker import LAP_FIX, lap_missing
from streamd.config import BUNDLED_DEMO, Config, ConfigError, StreamConfig
from streamd.config._fields import Problems, describe
from streamd.config._yaml import load_yaml
from streamd.config.streams import parse_streams

STATE_VERSION = 1
Overlay = dict[str, dict[str, Any] | None]  # stream id -> its settings (added/changed) or None (removed)


def config_dir(config: Config) -> Path:
    """Relative paths in a stream given through the API are taken from the config file's folder."""
    if config.source == "<bundled demo>":
        return BUNDLED_DEMO.parent
    return Path(config.source).absolute().parent


def check_stream(raw: object, config: Config, prefix: str = "") -> tuple[StreamConfig | None, list[str]]:
    """One stream's settings checked as ``streams:`` items are at load and reload (the model's class names,
    the global tracking section): (the stream, []) or (None, problems as ``key.path: message``, key paths
    relative to the stream and preceded by ``prefix``)."""
    problems = Problems("", config_dir(config), {})
    names, base = config.model.class_names, problems.base_dir
    streams = parse_streams([raw], problems, base, names, config.tracking, config.clips)
    if problems.items or len(streams) != 1:
        lines = []
        for _line, path, message in problems.items:
            key = prefix + path.removeprefix("streams[0]").lstrip(".")
            lines.append(f"{key}: {message}" if key else message)
        return None, lines or ["expected one stream with id: and url:"]
    why = lap_missing() if streams[0].tracking.enabled else None
    if why is not None:  # refused now, not at the tracker's first ambiguous match in a running worker
        return None, [f"{prefix}tracking.enabled: tracking needs the lap package, which cannot be imported "
                      f"({why}); {LAP_FIX}"]  # fmt: skip
    return streams[0], []


def file_streams(config: Config) -> dict[str, dict[str, Any]]:
    """The config file's ``streams:`` items as written (anchors and ``<<`` merges resolved), by id; {} when
    the file cannot be read as it was at load (a PATCH then needs every key)."""
    path = BUNDLED_DEMO if config.source == "<bundled demo>" else Path(config.source)
    try:
        data, _marks, _dups = load_yaml(path.read_text(encoding="utf-8-sig"), str(path))
    except (OSError, UnicodeDecodeError, ConfigError):
        return {}
    items = data.get("streams") if isinstance(data, dict) else None
    if not isinstance(items, list):
        return {}
    return {i["id"]: i for i in items if isinstance(i, dict) and isinstance(i.get("id"), str)}


def apply_overlay(config: Config, overlay: Mapping[str, dict[str, Any] | None], label: str) -> Config:
    """``config`` with the overlay's streams in place of (or after) the file's; raises ConfigError naming
    ``label`` (the state file) and each bad entry. Streams keep the file's order; added ones follow."""
    streams = list(config.streams)
    problems: list[str] = []
    fix = f"fix or delete this entry of {label} while streamd is stopped, or change it through the API"
    for sid, raw in overlay.items():
        at = next((i for i, s in enumerate(streams) if s.id == sid), None)
        if raw is None:
            if at is not None:
                del streams[at]
            continue
        stream, bad = check_stream(raw, config, prefix=f"streams.{sid}.")
        if stream is None or stream.id != sid:
            problems += [f"{label}: {p}; {fix}" for p in bad or [f"streams.{sid}.id: id differs"]]
        elif at is None:
            streams.append(stream)
        else:
            streams[at] = stream
    if not streams and not problems:
        problems.append(f"{label}: removes every stream of the config; streamd needs at least one")
    if problems:
        raise ConfigError(problems)
    return dataclasses.replace(config, streams=tuple(streams))


def load_state(path: Path) -> Overlay:
    """The overlay kept in ``path``; {} when the file does not exist yet. Raises ConfigError when it cannot
    be read or is not what ``save_state`` writes."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read the API state file: {exc.strerror or exc}"]) from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError([f"{path}: not JSON ({exc}); fix it or delete the file"]) from None
    streams = data.get("streams") if isinstance(data, dict) else None
    if not isinstance(streams, dict) or not all(v is None or isinstance(v, dict) for v in streams.values()):
        raise ConfigError(
            [f"{path}: expected {{\"version\": 1, \"streams\": {{id: settings or null}}}}, got "
             f"{describe(data)}; fix it or delete the file"]
        )  # fmt: skip
    return dict(streams)


def save_state(path: Path, overlay: Mapping[str, dict[str, Any] | None]) -> None:
    """Written atomically (a temporary file renamed over it); raises OSError."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"version": STATE_VERSION, "streams": dict(overlay)}, f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def merge_patch(target: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """JSON Merge Patch (RFC 7396): keys in ``patch`` replace those of ``target``, null deletes a key,
    mappings merge recursively, lists are replaced whole."""
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_patch(out[key], value)
        else:
            out[key] = value
    return out
