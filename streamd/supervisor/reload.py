"""Live reload (SIGHUP, ``systemctl reload``): what changed between the running config and the new one.

The supervisor re-reads the config file; an invalid file is refused with the same messages as
``streamd check`` and the running config stays. A valid one is compared with the running config here; the
supervisor then applies the plan: streams added/removed/changed are started/stopped in their workers (the
untouched streams keep running), ``SinkSet.reconfigure`` swaps changed sinks, and a model/engine change builds
the new engine beside the running one. What cannot change without a restart is listed in ``needs_restart``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from streamd.analytics.tracker import missing_dependency
from streamd.config import Config, ConfigError, StreamConfig, load_config


@dataclass(frozen=True)
class ReloadPlan:
    added: tuple[StreamConfig, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[StreamConfig, ...] = ()  # same id, new settings: stopped and started again
    unchanged: tuple[str, ...] = ()
    sinks_changed: bool = False
    model_changed: bool = False  # model or engine: build the new engine beside the running one
    needs_restart: tuple[str, ...] = field(default=())  # sections that only a restart applies
    keeps_engine: bool = False  # engine.shared: the running model and engine stay (needs_restart says so)

    @property
    def empty(self) -> bool:
        return not (
            self.added
            or self.removed
            or self.changed
            or self.sinks_changed
            or self.model_changed
            or self.needs_restart
        )

    def describe(self) -> str:
        """One log line."""
        if self.empty:
            return "config unchanged"
        parts = []
        for label, ids in (
            ("added", [s.id for s in self.added]),
            ("removed", list(self.removed)),
            ("changed", [s.id for s in self.changed]),
        ):
            if ids:
                parts.append(f"{label} {', '.join(ids)}")
        if self.sinks_changed:
            parts.append("sinks changed")
        if self.model_changed:
            parts.append("model/engine changed")
        if self.needs_restart:
            parts.append(f"needs a restart to apply: {', '.join(self.needs_restart)}")
        return "; ".join(parts)


def plan_reload(old: Config, new: Config) -> ReloadPlan:
    before = {s.id: s for s in old.streams}
    after = {s.id: s for s in new.streams}
    restart = [
        name for name in ("pipeline", "metrics", "log_level") if getattr(old, name) != getattr(new, name)
    ]
    engine_changed = old.model != new.model or old.engine != new.engine
    # A shared engine process serves the running model to every worker: a new model or engine needs a new
    # engine process, which only a restart brings (a successor worker would connect to the old one).
    shared = engine_changed and (old.engine.shared or new.engine.shared)
    if shared:
        restart.append("model/engine (engine.shared)")
    return ReloadPlan(
        added=tuple(s for sid, s in after.items() if sid not in before),
        removed=tuple(sid for sid in before if sid not in after),
        changed=tuple(s for sid, s in after.items() if sid in before and before[sid] != s),
        unchanged=tuple(sid for sid, s in after.items() if before.get(sid) == s),
        sinks_changed=old.sinks != new.sinks,
        model_changed=(engine_changed and not shared) or _tracking(old) != _tracking(new),
        needs_restart=tuple(restart),
        keeps_engine=shared,
    )


def _tracking(config: Config) -> object:
    return getattr(config, "tracking", None)


def reread(
    path: str | os.PathLike[str] | None,
    running: Config,
    overlay: Mapping[str, dict[str, Any] | None] | None = None,
    overlay_label: str = "the control API's changes",
) -> tuple[Config | None, list[str]]:
    """Load the config again and check it as ``streamd check`` does (the model too, when it changed):
    (new config, []) or (None, the problems, one line each, as ``streamd check`` prints them).
    ``overlay``: the control API's stream changes, applied on top of the file's streams and checked
    against the new config (``streamd.supervisor.api_state``: they win for the ids they name)."""
    try:
        new = load_config(path)
        if overlay:
            from streamd.supervisor.api_state import apply_overlay

            new = apply_overlay(new, overlay, overlay_label)
    except ConfigError as exc:
        return None, list(exc.problems)
    missing = missing_dependency(new.streams, new.tracking)  # a reload that turns tracking on
    if missing:
        return None, [missing]
    if new.model != running.model:
        from streamd.checks.model import check_model

        report = check_model(new)
        if report.problems:
            return None, list(report.problems)
    return new, []
