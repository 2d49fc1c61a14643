"""Sinks: finished JSON lines -> files, stdout, MQTT, HTTP, Redis Streams. The contract is in ``base.py``.

``build_sinks(configs)`` makes one sink per ``sinks:`` item; ``SinkSet`` is what the supervisor holds: it
starts them (a failure seen at start raises ``StartupError``), fans each line out, reopens files on SIGHUP,
closes them and says what was lost.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from streamd.config import Config
from streamd.config.sinks import (
    HttpSinkConfig,
    JsonlSinkConfig,
    MqttSinkConfig,
    RedisSinkConfig,
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
    if isinstance(cfg, RedisSinkConfig):
        from streamd.sinks.redis import RedisSink  # the redis client is imported only when the sink is used

        return RedisSink(cfg)
    raise TypeError(f"no sink for {type(cfg).__name__}")


def build_sinks(configs: Iterable[SinkConfig]) -> list[LineSink]:
    sinks = []
    for c in configs:
        sink = build_sink(c)
        sink.config = c
        sinks.append(sink)
    return sinks


class SinkSet:
    """All sinks of a run. ``submit`` fans a line out; ``all_gone`` turns True (and ``on_all_gone`` is called
    once) when every sink's reader went away, e.g. ``streamd run | head``: time to stop."""

    USABLE_WAIT_S = 2.0  # a reload waits this long, at most, for new network sinks to connect

    def __init__(self, sinks: Sequence[LineSink], on_all_gone: Callable[[], None] | None = None) -> None:
        self.sinks = list(sinks)
        self.reload_warnings: list[str] = []  # the last reconfigure: new sinks that cannot deliver yet
        self.retired: list[LineSink] = []  # closed by a reload; their losses still count
        self.taps: list[Callable[[str, str], None]] = []  # also see every line (outlive a reconfigure)
        self._config: Config | None = None  # the last configured(): given to sinks a reconfigure starts
        self._on_all_gone = on_all_gone
        self._unique_names()
        for s in self.sinks:
            s.on_gone = self._one_gone

    def _unique_names(self) -> None:
        seen: dict[str, int] = {}
        for s in self.sinks:  # names label metrics: two files named out.jsonl in two folders stay apart
            base = s.name.split("#", 1)[0]
            seen[base] = seen.get(base, 0) + 1
            s.name = base if seen[base] == 1 else f"{base}#{seen[base]}"

    @classmethod
    def from_config(
        cls, configs: Iterable[SinkConfig], on_all_gone: Callable[[], None] | None = None
    ) -> SinkSet:
        return cls(build_sinks(configs), on_all_gone)

    def start(self, hold: bool = False) -> None:
        """Open every sink; on a StartupError the ones already started are closed again."""
        started: list[LineSink] = []
        try:
            for s in self.sinks:
                s.start(hold)
                started.append(s)
        except BaseException:
            for s in reversed(started):
                s.close(timeout=1)
            raise

    def submit(self, line: str, stream_id: str) -> None:
        for s in self.sinks:  # one read of the list: a reconfigure swaps it whole
            s.submit(line, stream_id)
        for tap in self.taps:  # e.g. the control API's ring of recent events; must not block
            tap(line, stream_id)

    def reconfigure(self, configs: Iterable[SinkConfig], timeout: float = 10.0) -> tuple[int, int]:
        """Reload: sinks whose config is unchanged keep running (no gap). New ones are opened first (a
        StartupError leaves the running set as it was) and queue lines from the swap on; the replaced ones
        drain and close, then the new ones start writing (so a file that changed only its options keeps its
        order). Losses of closed sinks stay in ``retired`` for the exit status. Returns (started, closed).

        A new sink that opens but cannot deliver yet (an MQTT broker that refuses or does not answer within
        ``USABLE_WAIT_S``) does not refuse the reload — streamd starts with such a sink too, and the broker
        may come later — but is logged, listed in ``reload_warnings`` and counted as broken until it
        connects."""
        wanted = list(configs)
        pool = list(self.sinks)
        plan: list[LineSink | SinkConfig] = []  # per wanted item: the running sink to keep, or its config
        for c in wanted:
            match = next((s for s in pool if s.config == c), None)
            if match is not None:
                pool.remove(match)
            plan.append(match if match is not None else c)
        fresh = SinkSet(build_sinks(c for c in plan if not isinstance(c, LineSink)))
        fresh.start(hold=True)  # raises StartupError before anything changed
        if self._config is not None:
            fresh.configured(self._config)
        self.reload_warnings = []
        deadline = time.monotonic() + self.USABLE_WAIT_S
        for s in fresh.sinks:  # e.g. an MQTT broker that cannot be reached: taken, but not silently
            why = s.wait_usable(max(0.0, deadline - time.monotonic()))
            if why is not None:
                warning = f"sink {s.name}: {why}; added anyway, counted as broken until it connects"
                log.warning("reload: %s", warning)
                self.reload_warnings.append(warning)
        started = iter(fresh.sinks)
        new = [p if isinstance(p, LineSink) else next(started) for p in plan]
        for sink in new:
            sink.on_gone = self._one_gone
        old, self.sinks = self.sinks, new
        self._unique_names()
        closed = [s for s in old if s not in new]
        for s in closed:
            s.close(timeout)
        for s in fresh.sinks:
            s.release()
        self.retired.extend(closed)
        return len(fresh.sinks), len(closed)

    def reopen(self) -> None:
        for s in self.sinks:
            s.reopen()

    def stream_removed(self, stream_id: str) -> None:
        for s in self.sinks:
            s.stream_removed(stream_id)

    def configured(self, config: Config) -> None:
        """The config now running (start, reload, control API): to every sink, and to those a later
        reconfigure starts."""
        self._config = config
        for s in self.sinks:
            s.configured(config)

    def stream_health(self, per_stream: Mapping[str, Mapping[str, Any]]) -> None:
        """Once a second from the supervisor: each stream's snapshot entry (state, last_error, ...)."""
        for s in self.sinks:
            s.stream_health(per_stream)

    def close(self, timeout: float = 10.0) -> None:
        """Drain and close every sink at the same time: a stop takes one ``timeout``, not one per sink
        (systemd's TimeoutStopSec bounds the whole drain)."""
        closing = [
            threading.Thread(target=s.close, args=(timeout,), name=f"close-{s.name}", daemon=True)
            for s in self.sinks
        ]
        for t in closing:
            t.start()
        for t in closing:
            t.join(2 * timeout + 1)

    @property
    def all_gone(self) -> bool:
        return bool(self.sinks) and all(s.gone for s in self.sinks)

    def _one_gone(self) -> None:
        if self.all_gone and self._on_all_gone is not None:
            self._on_all_gone()

    @property
    def lost(self) -> int:
        """Lines lost that should make the exit status non-zero (sinks with drops_ok excluded)."""
        return sum(s.lost for s in [*self.sinks, *self.retired])

    @property
    def dropped(self) -> int:
        return sum(s.dropped for s in [*self.sinks, *self.retired])

    def stats(self) -> dict[str, dict]:
        """Per sink name: written, dropped, skipped, queued (queue depth), broken, gone, ..."""
        return {s.name: s.stats() for s in self.sinks}

    def summary(self) -> str | None:
        """One line naming what was lost, or None when nothing counts against the exit status."""
        if not self.lost:
            return None
        every = [*self.sinks, *self.retired]
        parts = [f"{s.name}: {s.lost}" + (f" ({s.broken})" if s.broken else "") for s in every if s.lost]
        return (
            f"output lost: {self.lost} line(s) dropped by sink(s) ({'; '.join(parts)}); "
            "set drops_ok: true on a sink whose drops are acceptable"
        )
