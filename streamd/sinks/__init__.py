"""Sinks: finished JSON lines -> files, stdout, MQTT, HTTP. The contract is in ``base.py``.

``build_sinks(configs)`` makes one sink per ``sinks:`` item; ``SinkSet`` is what the supervisor holds: it
starts them (a failure seen at start raises ``StartupError``), fans each line out, reopens files on SIGHUP,
closes them and says what was lost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence

from streamd.config.sinks import (
    HttpSinkConfig,
    JsonlSinkConfig,
    MqttSinkConfig,
    SinkConfig,
    StdoutSinkConfig,
)
from streamd.sinks.base import LineSink

log = logging.getLogger(__name__)


def build_sink(cfg: SinkConfig) -> LineSink:
    common = {"skip_empty": cfg.skip_empty, "drops_ok": cfg.drops_ok}
    if isinstance(cfg, JsonlSinkConfig):
        from streamd.sinks.jsonl import JsonlFileSink

        return JsonlFileSink(
            cfg.path,
            cfg.queue_size,
            cfg.flush_every,
            rotate_bytes=cfg.rotate_bytes,
            rotate_interval_s=cfg.rotate_interval_s,
            keep=cfg.keep,
            fsync=cfg.fsync,
            **common,
        )
    if isinstance(cfg, StdoutSinkConfig):
        from streamd.sinks.jsonl import StdoutSink

        return StdoutSink(cfg.queue_size, **common)
    if isinstance(cfg, MqttSinkConfig):
        from streamd.sinks.mqtt import MqttSink  # paho-mqtt is imported only when an mqtt sink is used

        return MqttSink(cfg)
    if isinstance(cfg, HttpSinkConfig):
        from streamd.sinks.http import HttpSink

        return HttpSink(cfg)
    raise TypeError(f"no sink for {type(cfg).__name__}")


def build_sinks(configs: Iterable[SinkConfig]) -> list[LineSink]:
    return [build_sink(c) for c in configs]


class SinkSet:
    """All sinks of a run. ``submit`` fans a line out; ``all_gone`` turns True (and ``on_all_gone`` is called
    once) when every sink's reader went away, e.g. ``streamd run | head``: time to stop."""

    def __init__(self, sinks: Sequence[LineSink], on_all_gone: Callable[[], None] | None = None) -> None:
        self.sinks = list(sinks)
        self._on_all_gone = on_all_gone
        seen: dict[str, int] = {}
        for s in self.sinks:  # names label metrics: two files named out.jsonl in two folders stay apart
            seen[s.name] = seen.get(s.name, 0) + 1
            if seen[s.name] > 1:
                s.name = f"{s.name}#{seen[s.name]}"
        for s in self.sinks:
            s.on_gone = self._one_gone

    @classmethod
    def from_config(
        cls, configs: Iterable[SinkConfig], on_all_gone: Callable[[], None] | None = None
    ) -> SinkSet:
        return cls(build_sinks(configs), on_all_gone)

    def start(self) -> None:
        """Open every sink; on a StartupError the ones already started are closed again."""
        started: list[LineSink] = []
        try:
            for s in self.sinks:
                s.start()
                started.append(s)
        except BaseException:
            for s in reversed(started):
                s.close(timeout=1)
            raise

    def submit(self, line: str, stream_id: str) -> None:
        for s in self.sinks:
            s.submit(line, stream_id)

    def reopen(self) -> None:
        for s in self.sinks:
            s.reopen()

    def close(self, timeout: float = 10.0) -> None:
        for s in self.sinks:
            s.close(timeout)

    @property
    def all_gone(self) -> bool:
        return bool(self.sinks) and all(s.gone for s in self.sinks)

    def _one_gone(self) -> None:
        if self.all_gone and self._on_all_gone is not None:
            self._on_all_gone()

    @property
    def lost(self) -> int:
        """Lines lost that should make the exit status non-zero (sinks with drops_ok excluded)."""
        return sum(s.lost for s in self.sinks)

    @property
    def dropped(self) -> int:
        return sum(s.dropped for s in self.sinks)

    def stats(self) -> dict[str, dict]:
        """Per sink name: written, dropped, skipped, queued (queue depth), broken, gone, ..."""
        return {s.name: s.stats() for s in self.sinks}

    def summary(self) -> str | None:
        """One line naming what was lost, or None when nothing counts against the exit status."""
        if not self.lost:
            return None
        parts = [f"{s.name}: {s.lost}" + (f" ({s.broken})" if s.broken else "") for s in self.sinks if s.lost]
        return (
            f"output lost: {self.lost} line(s) dropped by sink(s) ({'; '.join(parts)}); "
            "set drops_ok: true on a sink whose drops are acceptable"
        )
